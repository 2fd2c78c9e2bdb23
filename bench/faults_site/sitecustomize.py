"""Loaded by every Python process of a daemon's tree when this folder leads PYTHONPATH: the
minor page faults each listed function's thread took inside it (`RUSAGE_THREAD`), with the
process's total and its anonymous RSS at its return — where a cold fork touches memory afresh.

Inert unless `AGENTHOST_FAULTS=<prefix>`; then the worker (`drivers.worker --connect`), the
app-server (`tutti-agent app-server`) and the daemon (`serve`) append
`<point>\t<thread faults>\t<process faults>\t<RssAnon kB>\t<thread>` lines to
`<prefix>.<kind>.<pid>` every 0.2 s (the worker leaves by `os._exit`: nothing at exit). The
points are wrapped as their modules are imported (an import hook), so an app-server started
for the fork is counted from its first request:

    AGENTHOST_FAULTS=/tmp/f AGENTHOST_BENCH_CACHE=/work/main/build/bench-cache \\
      PYTHONPATH=$T/bench/faults_site:$T build/venv/bin/python -m bench.months_fork \\
      --sessions 300 --turns 12000 --big-turns 10000 --operations 100 --warm 1
"""

from __future__ import annotations

import os
import sys

_OUT = os.environ.get("AGENTHOST_FAULTS")
_KIND = (
    "worker"
    if "--connect" in sys.argv
    else "app"
    if "app-server" in sys.argv
    else "daemon"
    if "serve" in sys.argv
    else None
)

# kind → (module, class or "" for a function, attribute); a function is wrapped in its
# module's namespace, so a caller that imported it by name elsewhere lists that module.
POINTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "worker": (
        ("drivers.binder", "", "parse_rollout"),
        ("drivers.binder", "", "read_regular"),
        ("drivers.binder", "", "begin_atomic_write_all"),
        ("drivers.binder", "RolloutBinder", "validate_ahead"),
        ("drivers.binder", "RolloutBinder", "begin"),
        ("drivers.app_server.fork", "ForkThroughTurn", "fork"),
        ("drivers.app_server.fork", "ForkThroughTurn", "_fork_on"),
        ("drivers.app_server.fork", "ForkThroughTurn", "_source_turns"),
        ("drivers.app_server.fork", "ForkThroughTurn", "_prove_readable"),
        ("drivers.app_server.fork", "_DeriveForProof", "_derive"),
        ("drivers.app_server.process", "AppServerProcess", "answer"),
    ),
    "app": (
        ("tutti_agent.server", "AppServer", "_dispatch"),
        ("tutti_agent.server", "AppServer", "thread_resume"),
        ("tutti_agent.server", "AppServer", "_load_resumed"),
        ("tutti_agent.server", "AppServer", "_load_live"),
        ("tutti_agent.server", "AppServer", "thread_read"),
        ("tutti_agent.server", "AppServer", "thread_fork"),
        ("tutti_agent.store", "ThreadStore", "_read"),
        ("tutti_agent.store", "ThreadStore", "open_writer"),
        ("tutti_agent.store", "ThreadStore", "turns"),
        ("tutti_agent.store", "ThreadStore", "copied_span"),
        ("tutti_agent.store", "", "_write_new_file"),
        ("tutti_agent.fork", "ForkService", "_materialize"),
    ),
    "daemon": (
        ("storage.fork_prepare", "ForkPrepare", "prepare_fork"),
        ("storage.fork_commit", "ForkCommit", "commit_fork"),
    ),
}

if _OUT and _KIND:
    import importlib.abc
    import importlib.machinery
    import resource
    import threading
    import time
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

    _rec: list[tuple[str, int, str]] = []

    def _process() -> str:
        with open("/proc/self/status") as f:
            rss = next((ln.split()[1] for ln in f if ln.startswith("RssAnon")), "?")
        return f"{resource.getrusage(resource.RUSAGE_SELF).ru_minflt}\t{rss}"

    def _wrap(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        def counted(*args: Any, **kwargs: Any) -> Any:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            try:
                return fn(*args, **kwargs)
            finally:
                faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
                _rec.append((label, faults, f"{_process()}\t{threading.current_thread().name}"))

        setattr(owner, attr, counted)

    _want: dict[str, list[tuple[str, str, str]]] = {}
    for _point in POINTS[_KIND]:
        _want.setdefault(_point[0], []).append(_point)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(
            self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
        ) -> importlib.machinery.ModuleSpec | None:
            if name not in _want:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader: Any = spec.loader
            run: Callable[[ModuleType], None] = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run(module)
                for _, cls, attr in _want[name]:
                    owner = getattr(module, cls, None) if cls else module
                    if owner is not None and hasattr(owner, attr):
                        _wrap(owner, attr, f"{cls}.{attr}" if cls else attr)
                _rec.append((f"imported {name}", 0, f"{_process()}\tmain"))

            loader.exec_module = exec_module
            return spec

    def _dump() -> None:
        done = 0
        while True:
            time.sleep(0.2)
            fresh = _rec[done:]
            done += len(fresh)
            if fresh:
                with open(f"{_OUT}.{_KIND}.{os.getpid()}", "a") as f:
                    f.writelines(f"{p}\t{n}\t{rest}\n" for p, n, rest in fresh)

    _rec.append(("start", 0, f"{_process()}\tmain"))
    sys.meta_path.insert(0, _Finder())
    threading.Thread(target=_dump, name="faults-out", daemon=True).start()
