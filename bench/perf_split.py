"""The daemon tree's on-CPU samples from `perf` split by process kind and by what ran: the
interpreter, SQLite's C, libzmq, msgpack, libc, or the kernel by system call (futex, fsync, file
calls, reads/writes, polls). Reads `perf script -F pid,tid,comm,ip,sym,dso` of a `perf record
-g` over the tree's pids; Python frames are not visible to `perf` here (3.11), py-spy's are.

    perf record -F 497 -g -p <pids> -o tree.data -- sleep 10
    perf script -i tree.data -F pid,tid,comm,ip,sym,dso > tree.txt
    python -m bench.perf_split tree.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass

_HEADER = re.compile(r"\s*(.*?)\s+(\d+)/(\d+)")
_FRAME = re.compile(r"\s*[0-9a-f]+ (.*) \((.*)\)$")

_SYSCALLS: tuple[tuple[str, frozenset[str]], ...] = (
    ("kernel: fsync/fdatasync", frozenset({"fsync", "fdatasync"})),
    ("kernel: futex (the GIL, locks, queues)", frozenset({"futex"})),
    ("kernel: poll/epoll", frozenset({"poll", "ppoll", "epoll_wait", "select", "pselect6"})),
    (
        "kernel: reads, writes, sends",
        frozenset(
            {"sendto", "recvfrom", "sendmsg", "recvmsg", "write", "read", "writev", "readv"}
            | {"pwrite64", "pread64"}
        ),
    ),
    (
        "kernel: file calls",
        frozenset(
            {"mkdir", "mkdirat", "openat", "rename", "renameat2", "unlink", "unlinkat", "close"}
            | {"newfstatat", "statx", "getdents64", "fstat", "newstat", "newlstat", "linkat"}
        ),
    ),
)
_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("apsw", "SQLite (C)"),
    ("sqlite", "SQLite (C)"),
    ("libzmq", "libzmq (C)"),
    ("zmq/backend", "libzmq (C)"),
    ("msgpack", "msgpack (C)"),
    ("libpython", "the interpreter"),
    ("libc", "libc"),
)


@dataclass(frozen=True, slots=True)
class Sample:
    pid: int
    comm: str
    frames: tuple[tuple[str, str], ...]
    """(symbol, DSO) from the leaf outwards."""


def parse(text: str) -> list[Sample]:
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        head = _HEADER.match(lines[0]) if lines else None
        if head is None:
            continue
        frames = tuple((m.group(1), m.group(2)) for line in lines[1:] if (m := _FRAME.match(line)))
        out.append(Sample(int(head.group(2)), head.group(1), frames))
    return out


def kinds(samples: list[Sample]) -> dict[int, str]:
    """A process's kind by its threads' names: the daemon names its own (`agenthost-*`,
    `session_*`), a driver worker runs ZeroMQ's I/O thread, the rest are app-servers."""
    names: dict[int, set[str]] = {}
    for s in samples:
        names.setdefault(s.pid, set()).add(s.comm)
    out = {}
    for pid, comms in names.items():
        if any(c.startswith(("agenthost", "session_")) for c in comms):
            out[pid] = "daemon"
        elif any("ZMQ" in c for c in comms):
            out[pid] = "worker"
        else:
            out[pid] = "app-server"
    return out


def what_ran(frames: tuple[tuple[str, str], ...]) -> str:
    if not frames:
        return "unknown"
    _, dso = frames[0]
    if "kallsyms" in dso:
        calls = [
            sym.split("_sys_", 1)[1]
            for sym, _ in frames
            if sym.startswith(("__x64_sys_", "__do_sys_"))  # newfstatat has only the latter
        ]
        if not calls:
            return "kernel: scheduling, interrupts"
        return next((name for name, set_ in _SYSCALLS if calls[0] in set_), "kernel: other calls")
    return next((name for part, name in _LIBRARIES if part in dso), "other")


def split(samples: list[Sample]) -> dict[str, Counter[str]]:
    kind_of = kinds(samples)
    out: dict[str, Counter[str]] = {}
    for s in samples:
        out.setdefault(kind_of[s.pid], Counter())[what_ran(s.frames)] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0]) as fh:
        parts = split(parse(fh.read()))
    total = sum(sum(c.values()) for c in parts.values()) or 1
    for kind, counts in sorted(parts.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counts.values())
        print(f"{kind}: {n} samples, {100 * n / total:.1f} % of the tree")
        for name, count in counts.most_common():
            print(f"    {100 * count / total:5.1f} % of the tree  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
