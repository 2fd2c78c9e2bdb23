"""Loaded by the daemon of `bench.read_profile` (this folder leads its PYTHONPATH): the read
pool's work (`RequestPlumbing.on_pool`, the `agenthost-read` threads) profiled by Python
function and counted, nothing else of the daemon.

Inert unless `AGENTHOST_READ_PROFILE` names a folder, and then only in the daemon (`serve`).
`AGENTHOST_READ_PROFILE_MODE=profile`: each pool job runs under a `cProfile.Profile` of its own
thread (one per thread, enabled around the job only), dumped per thread as `prof-<pid>-<n>.pstats`;
`count` (the default): no profiler, each job's thread CPU (`time.thread_time`) and, per read
method, the jobs, their statements (apsw's exec trace, on the pool threads only), rows read,
JSON values decoded (`storage.sqlite.loads` and `json.loads`) and the reply's msgpack bytes.
Written to `read-<pid>.json` every second and at exit.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("AGENTHOST_READ_PROFILE")

if _DIR and "serve" in sys.argv:
    import atexit
    import contextlib
    import cProfile
    import json
    import threading
    import time
    from typing import Any

    import apsw

    _MODE = os.environ.get("AGENTHOST_READ_PROFILE_MODE", "count")
    _local = threading.local()
    _lock = threading.Lock()
    _profiles: list[cProfile.Profile] = []
    _by_method: dict[str, dict[str, float]] = {}

    def _tally(key: str, n: float = 1.0) -> None:
        got = getattr(_local, "counts", None)
        if got is not None:
            got[key] = got.get(key, 0.0) + n

    def _trace(_cursor: Any, _sql: str, _bindings: Any) -> bool:
        _tally("statements")
        return True

    def _row_trace(_cursor: Any, row: Any) -> Any:
        _tally("rows")
        return row

    def _hook(conn: apsw.Connection) -> None:
        conn.exec_trace = _trace
        conn.row_trace = _row_trace

    apsw.connection_hooks.append(_hook)

    def _dump() -> None:
        with _lock, contextlib.suppress(OSError):
            path = os.path.join(_DIR, f"read-{os.getpid()}.json")  # type: ignore[arg-type]
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump({"mode": _MODE, "methods": _by_method}, f)
            os.replace(tmp, path)
            for n, prof in enumerate(_profiles):
                prof.dump_stats(
                    os.path.join(_DIR, f"prof-{os.getpid()}-{n}.pstats")  # type: ignore[arg-type]
                )

    def _wrap_api(module: Any) -> None:
        plumbing = module.RequestPlumbing
        on_pool = plumbing.on_pool

        def on_pool_profiled(self: Any, responder: Any, fn: Any) -> None:
            method = getattr(_local, "method", "?")

            def job() -> None:
                counts: dict[str, float] = {}
                _local.counts = counts
                prof = getattr(_local, "prof", None)
                if _MODE == "profile" and prof is None:
                    prof = _local.prof = cProfile.Profile(time.thread_time)
                    with _lock:
                        _profiles.append(prof)
                c0 = time.thread_time()
                if prof is not None:
                    prof.enable()
                try:
                    fn()
                finally:
                    if prof is not None:
                        prof.disable()
                    counts["cpu_ms"] = (time.thread_time() - c0) * 1000.0
                    counts["jobs"] = 1.0
                    _local.counts = None
                    with _lock:
                        into = _by_method.setdefault(method, {})
                        for k, v in counts.items():
                            into[k] = into.get(k, 0.0) + v

            on_pool(self, responder, job)

        plumbing.on_pool = on_pool_profiled
        call = plumbing.__call__

        def dispatch(self: Any, request: Any, responder: Any) -> None:
            _local.method = request.method
            try:
                call(self, request, responder)
            finally:
                _local.method = "?"

        plumbing.__call__ = dispatch

    def _wrap_loads(module: Any) -> None:
        inner = module.loads

        def loads(text: Any) -> Any:
            _tally("json_loads")
            return inner(text)

        module.loads = loads
        for name in ("storage.rows", "agenthost.projection", "storage.history"):
            other = sys.modules.get(name)
            if other is not None and getattr(other, "loads", None) is inner:
                other.loads = loads

    def _wrap_envelope(module: Any) -> None:
        for name in ("encode_result", "encode_result_packed"):
            inner = getattr(module, name)

            def encoded(*args: Any, _inner: Any = inner) -> bytes:
                frame: bytes = _inner(*args)
                _tally("reply_bytes", len(frame))
                return frame

            setattr(module, name, encoded)
        server = sys.modules.get("transport.server")
        if server is not None:
            for name in ("encode_result", "encode_result_packed"):
                if hasattr(server, name):
                    setattr(server, name, getattr(module, name))

    _WRAPS = {
        "agenthost.api_base": ("RequestPlumbing", _wrap_api),
        "agenthost.api": ("Api", lambda m: _wrap_loads(sys.modules["storage.sqlite"])),
        "transport.server": (
            "OneShotResponder",
            lambda m: _wrap_envelope(sys.modules["protocol.envelope"]),
        ),
    }

    def _install() -> None:
        pending = dict(_WRAPS)
        last = time.monotonic()
        while True:
            for name, (attr, wrap) in list(pending.items()):
                module = sys.modules.get(name)
                if module is not None and hasattr(module, attr):
                    wrap(module)
                    del pending[name]
            time.sleep(0.002 if pending else 0.25)
            if time.monotonic() - last >= 1.0:
                _dump()
                last = time.monotonic()

    threading.Thread(target=_install, name="read-profile", daemon=True).start()
    atexit.register(_dump)
