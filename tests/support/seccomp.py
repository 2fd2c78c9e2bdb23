"""A seccomp filter for a child process (Linux, x86_64 and aarch64): given system calls fail with
EPERM, as on a file system or in a sandbox that refuses them; everything else is allowed. Set
up in the child before it execs (`preexec_fn`), inherited by its own children."""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
from collections.abc import Callable

# seccomp: the architecture as `struct seccomp_data` reports it, and the numbers of the calls
# a test may refuse on it (aarch64 has no `link` or `rename`, only their `*at` forms).
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,  # AUDIT_ARCH_X86_64
        {"link": 86, "linkat": 265, "rename": 82, "renameat": 264, "renameat2": 316},
    ),
    "aarch64": (0xC00000B7, {"linkat": 37, "renameat": 38, "renameat2": 276}),
}
LINKS = ("link", "linkat")
RENAMES = ("rename", "renameat", "renameat2")

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06


def _program(calls: tuple[str, ...]) -> bytes:
    """A classic-BPF seccomp program: on this architecture, each of `calls` (those it has) →
    EPERM; all else allowed."""
    arch, table = ARCHES[platform.machine()]
    numbers = [table[c] for c in calls if c in table]
    n = len(numbers)

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    prog = [
        op(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        op(_JEQ_K, 0, n + 1, arch),  # another ABI: allow
        op(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    prog += [op(_JEQ_K, n - i, 0, nr) for i, nr in enumerate(numbers)]
    prog += [op(_RET_K, 0, 0, _RET_ALLOW), op(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    return b"".join(prog)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def refusing(*calls: str) -> Callable[[], None]:
    """A `preexec_fn` after which every one of `calls` fails with EPERM in the child. The
    program is built here, in the parent: nothing but two `prctl`s runs after the fork."""
    assert platform.machine() in ARCHES, platform.machine()
    program = _program(calls)

    def install() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        prog = _Prog(len(program) // 8, program)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")

    return install
