"""The accept shim: a tiny C library preloaded into the daemon so that libzmq never aborts the
process when a listener accepts at the descriptor limit (docs/design/connections.md).

libzmq 4.3.5 asserts on EMFILE from accept() on an ipc listener (SIGABRT) and tolerates
ENFILE; `native/accept_shim.c` reports the one as the other. It must be in the process before
libzmq resolves accept4(), so `serve` re-executes itself once with the library in
LD_PRELOAD (`reexec_with_shim`) and then takes LD_PRELOAD back out of its environment, so the
workers and providers it starts do not inherit it.

The library is compiled on first use with the machine's C compiler (`cc`, or `$CC`) into a
cache folder (`$AGENTHOST_NATIVE_DIR`, else the platform's user cache folder), named by a hash
of its source. Linux only (glibc or musl `LD_PRELOAD`); where it cannot be built or loaded the
daemon runs without it and says so once: the connection guard (`transport.connections`) is
then the only protection, with the window that page describes.
"""

from __future__ import annotations

# Only what deciding and re-executing need is imported at the top: the process that calls
# `reexec_with_shim` is replaced by a new interpreter, so every module it loaded beyond these
# is paid twice; building the library (hashlib for its name, subprocess, tempfile...) and
# logging the outcome import theirs where they are used.
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("native") / "accept_shim.c"
MARKER = "AGENTHOST_ACCEPT_SHIM"
"""Set by the re-execution to the library's path; the new process reads it once and drops it."""
PRELOAD_WAS = "AGENTHOST_PRELOAD_WAS"
"""The LD_PRELOAD the daemon was started with (restored after the re-execution)."""
OPT_OUT = "AGENTHOST_NO_ACCEPT_SHIM"
"""Set to 1 to run without the shim (the guard alone)."""

_state: dict[str, str | None] = {"library": None, "unavailable": None, "decided": None}


def native_dir() -> Path:
    explicit = os.environ.get("AGENTHOST_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("agenthost")) / "native"


def build(folder: Path | None = None, *, compiler: str | None = None) -> Path:
    """The compiled shim, built now if this source has not been built yet; raises OSError or
    RuntimeError (no compiler, a compile error or time-out) when it cannot be."""
    import hashlib

    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + os.uname().machine.encode()).hexdigest()[:16]
    folder = folder or native_dir()
    target = folder / f"accept_shim-{digest}.so"
    if target.exists():
        return target
    import shutil
    import subprocess
    import tempfile

    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) to build it")
    folder.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: two daemons (or test workers) building at
    # once each produce a whole library, and the rename is atomic.
    fd, partial = tempfile.mkstemp(prefix=".accept_shim-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        try:
            out = subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-o", partial, str(SOURCE), "-ldl"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except subprocess.SubprocessError as exc:  # a hung compiler: one error type for callers
            raise RuntimeError(f"{cc} failed: {exc}") from exc
        if out.returncode != 0:
            raise RuntimeError(f"{cc} failed: {out.stderr.strip()[-500:]}")
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def preload_env(environ: Mapping[str, str], library: Path) -> dict[str, str]:
    """The environment of the re-executed daemon: the library first in LD_PRELOAD."""
    env = dict(environ)
    was = environ.get("LD_PRELOAD", "")
    env[PRELOAD_WAS] = was
    env["LD_PRELOAD"] = " ".join(p for p in (str(library), was) if p)
    env[MARKER] = str(library)
    return env


def _loaded(library: str) -> bool:
    """The library is mapped into this process (the loader maps it by its resolved path)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return os.path.realpath(library) in maps


def reexec_with_shim(argv: Sequence[str] | None = None) -> None:
    """Call first thing in `serve`, before any thread or socket exists. Either returns in a
    process that has the shim loaded (and LD_PRELOAD restored), returns without it (said once,
    in words), or replaces this process by one started with it. Decided once per process."""
    if _state["decided"]:
        return
    _state["decided"] = "yes"
    library = os.environ.pop(MARKER, None)
    if library is not None:
        was = os.environ.pop(PRELOAD_WAS, "")
        if was:
            os.environ["LD_PRELOAD"] = was
        else:
            os.environ.pop("LD_PRELOAD", None)
        if _loaded(library):
            _state["library"] = library
        else:
            _state["unavailable"] = "the dynamic loader did not preload it"
        return
    if os.environ.get(OPT_OUT) == "1":
        _state["unavailable"] = f"turned off ({OPT_OUT}=1)"
        return
    if not sys.platform.startswith("linux"):
        _state["unavailable"] = f"not available on {sys.platform}"
        return
    try:
        built = build()
    except (OSError, RuntimeError) as exc:
        _state["unavailable"] = f"could not be built: {exc}"
        return
    args = [sys.executable, *(argv if argv is not None else sys.orig_argv[1:])]
    os.execve(sys.executable, args, preload_env(os.environ, built))


def status() -> dict[str, str | bool | None]:
    """For `host.status` `connections.acceptShim`: loaded, or why not."""
    return {"loaded": _state["library"] is not None, "unavailable": _state["unavailable"]}


def log_status() -> None:
    import logging

    log = logging.getLogger(__name__)
    if _state["library"] is not None:
        log.info("accept shim loaded: an ipc accept at the descriptor limit is tolerated")
    elif _state["unavailable"] is not None:
        log.warning(
            "accept shim %s: at the descriptor limit an ipc connection can abort the daemon "
            "(libzmq); the connection guard's caps are the only protection "
            "(docs/design/connections.md)",
            _state["unavailable"],
        )


def _symbol(kind: Any, name: str) -> Any:
    """The shim's exported variable `name` in this process, or None when it is not loaded."""
    library = _state["library"]
    if library is None:
        return None
    import ctypes

    try:
        lib = ctypes.CDLL(library, mode=os.RTLD_NOLOAD)
        return kind.in_dll(lib, name)
    except (OSError, ValueError):
        return None


def set_reserve(reserve: int) -> bool:
    """Connections accepted as a descriptor numbered at or above `soft limit - reserve` are
    closed at once (the accept reports ECONNABORTED; libzmq's monitor: `accept failed`), so no
    flood can take the top `reserve` descriptors, however far behind the connection guard is
    (docs/design/connections.md). False when the shim is not loaded."""
    import ctypes

    var = _symbol(ctypes.c_int, "agenthost_accept_reserve")
    if var is None:
        return False
    var.value = max(0, reserve)
    return True


def keep_accepts_on(prefix: str) -> bool:
    """Connections accepted on an ipc path starting with `prefix` are never closed for the
    reserve (the worker links: the reserve is theirs). One prefix per process."""
    import ctypes

    encoded = prefix.encode()
    var = _symbol(ctypes.c_char * 512, "agenthost_accept_keep")
    if var is None or len(encoded) >= 512:
        return False
    var.value = encoded
    return True


def refused_at_accept() -> int:
    """Connections the shim closed at accept for the reserve (0 without the shim)."""
    import ctypes

    var = _symbol(ctypes.c_ulong, "agenthost_accept_refused")
    return 0 if var is None else int(var.value)
