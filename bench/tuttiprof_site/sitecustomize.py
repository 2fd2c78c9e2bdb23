"""Loaded first (this folder leads `PYTHONPATH`) by the processes of a `bench.months_fork` run
(`bench.tutti_fork_profile --live`): in tutti-agent's driver worker (`--provider tutti-agent`)
and in tutti-agent's app-server (`tutti-agent app-server`), every thread runs under a
`cProfile.Profile` of its own on the thread's CPU clock (`time.thread_time`), and each
thread's stats are written, when the process ends (`atexit`, and the worker's `os._exit`), to
`$AGENTHOST_TUTTIPROF/<process>-<pid>-<n>-<thread name>.prof` (`marshal`, as
`cProfile.Profile.dump_stats`). Inert unless `AGENTHOST_TUTTIPROF` is set, and in any other
process."""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("AGENTHOST_TUTTIPROF")
_KIND = (
    "worker"
    if "--provider" in sys.argv and "tutti-agent" in sys.argv
    else "app"
    if os.path.basename(sys.argv[0] if sys.argv else "") == "tutti-agent"
    and "app-server" in sys.argv
    else None
)

if _DIR and _KIND:
    import atexit
    import cProfile
    import marshal
    import threading
    import time

    _profs: list[tuple[str, cProfile.Profile]] = []
    _lock = threading.Lock()
    _run = threading.Thread.run

    def _profiled_run(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        with _lock:
            _profs.append((self.name, prof))
        prof.enable()
        try:
            _run(self)
        finally:
            prof.disable()

    threading.Thread.run = _profiled_run  # type: ignore[method-assign]
    _main = cProfile.Profile(time.thread_time)
    _profs.append(("main", _main))
    _main.enable()
    _dumped = [False]

    def _dump() -> None:
        if _dumped[0]:
            return
        _dumped[0] = True
        _main.disable()
        with _lock:
            profs = list(_profs)
        for n, (name, prof) in enumerate(profs):
            try:
                prof.snapshot_stats()
                path = os.path.join(_DIR, f"{_KIND}-{os.getpid()}-{n}-{name[:40]}.prof")
                with open(path, "wb") as f:
                    marshal.dump(prof.stats, f)
            except Exception:  # noqa: BLE001 - a profile is a convenience
                pass

    atexit.register(_dump)
    _exit = os._exit

    def _dumping_exit(code: int) -> None:
        _dump()
        _exit(code)

    os._exit = _dumping_exit  # type: ignore[assignment]
