"""Loaded by a driver worker started with this directory first on PYTHONPATH
(`bench/fork_structure.py`): every thread the worker starts runs under its own
`cProfile.Profile(time.thread_time)` from its first instruction, and SIGUSR1 writes every
profiler's `getstats()` so far, summed by thread name, to `$FORKSTRUCT_OUT.<pid>.<n>` (a pickle).
Any other process that inherits the path (the app-server) is left alone."""

from __future__ import annotations

import os
import sys

if "drivers.worker" in getattr(sys, "orig_argv", ()) and os.environ.get("FORKSTRUCT_OUT"):
    import cProfile
    import pickle
    import re
    import signal
    import threading
    import time
    from typing import Any

    _profs: list[tuple[str, cProfile.Profile]] = []
    _boot = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def _profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        _profs.append((self.name, prof))
        prof.enable()
        try:
            _boot(self)
        finally:
            prof.disable()

    threading.Thread._bootstrap_inner = _profiled  # type: ignore[attr-defined]
    _dumps = [0]

    def _key(code: Any) -> tuple[str, int, str]:
        if isinstance(code, str):
            return ("~", 0, code)
        return (code.co_filename, code.co_firstlineno, code.co_name)

    def _dump(_signum: int, _frame: Any) -> None:
        out: dict[str, dict[Any, tuple[int, float, float]]] = {}
        for name, prof in list(_profs):
            d = out.setdefault(re.sub(r"[_-]?\d+$", "", name), {})
            for e in prof.getstats():
                k = _key(e.code)
                c, it, tt = d.get(k, (0, 0.0, 0.0))
                d[k] = (c + e.callcount, it + e.inlinetime, tt + e.totaltime)
                for sub in e.calls or ():
                    ek = ("EDGE", k, _key(sub.code))
                    c, it, tt = d.get(ek, (0, 0.0, 0.0))
                    d[ek] = (c + sub.callcount, it + sub.inlinetime, tt + sub.totaltime)
        _dumps[0] += 1
        path = f"{os.environ['FORKSTRUCT_OUT']}.{os.getpid()}.{_dumps[0]}"
        with open(path + ".tmp", "wb") as f:
            pickle.dump(out, f)
        os.rename(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, _dump)
