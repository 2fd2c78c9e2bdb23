"""Loaded by the daemon of `bench.fork_daemon --stamps` (this folder leads its PYTHONPATH):
wall-clock stamps at the points of one fork's path through the daemon, and each daemon thread
named for the kernel (`/proc/<pid>/task/*/comm`) so CPU and wake-ups can be read per thread.

Inert unless `AGENTHOST_STAMPS` (the file the stamps go to, at exit), `AGENTHOST_NAME_THREADS`
or `AGENTHOST_WRITE_STATS` is set, and only in the `agenthost serve` process (a worker's stamps
and `AGENTHOST_GC_TIMES`, below, also in the tree's other processes).

`AGENTHOST_WRITE_STATS`: a named pipe; each time a line is written to it, the store's
`Database.write_stats` (summed over the daemon's stores) is written as JSON to the pipe's path
plus `.json` (a thread blocked on the pipe's open: nothing runs between two asks; the first ask
catches the store at its first write after start-up). A stamp is `(point, time.time() * 1000)`
appended on entry (and on exit, for the points with an end) to the functions listed in
`POINTS`, wrapped once the daemon's modules are imported.
"""

from __future__ import annotations

import os
import sys

_STAMPS = os.environ.get("AGENTHOST_STAMPS")
_SERVE = "serve" in sys.argv
# A driver worker (`python -m drivers.worker --provider P --connect …`) stamps its side of a
# fork into `<AGENTHOST_STAMPS>.w<pid>` on the same wall clock, only when asked
# (`AGENTHOST_STAMPS_WORKER=1`, `bench.fork_hops`).
_WORKER = (
    "--connect" in sys.argv
    and "--provider" in sys.argv
    and os.environ.get("AGENTHOST_STAMPS_WORKER") == "1"
)


# module, class (or "" for a function), attribute, stamp on entry, stamp on exit ("": none)
POINTS = (
    ("transport.server", "ApiServer", "_handle", "loop.handle", ""),
    ("actors.fork_saga", "", "start", "fork.start", ""),
    ("storage.fork_prepare", "ForkPrepare", "prepare_fork", "prepare.begin", "prepare.end"),
    ("storage.base", "Database", "_end_group", "group.begin", "group.end"),
    (
        "storage.fork_transitions",
        "ForkTransitions",
        "mark_fork_dispatching",
        "disp.begin",
        "disp.end",
    ),
    ("agenthost.workers", "SupervisorPort", "fork", "workers.fork", "workers.fork.end"),
    ("actors.fork_saga", "ForkSaga", "_dispatched", "dispatched", ""),
    (
        "storage.fork_transitions",
        "ForkTransitions",
        "mark_fork_provider_accepted",
        "accepted.begin",
        "accepted.end",
    ),
    ("storage.fork_commit", "ForkCommit", "commit_fork", "commit.begin", "commit.end"),
    ("transport.server", "OneShotResponder", "result", "responder.result", ""),
    ("transport.server", "ApiServer", "_send_reply", "loop.send_reply", ""),
    # The reply's leg by thread (`bench.fork_hops`' reply line): its hand-over to the loop
    # (the Session's thread), the loop's drain of its outbox (one per wake-up that found
    # something there), and the actor's slices.
    ("transport.server", "ApiServer", "_post_reply", "post", "post.end"),
    ("transport.server", "ApiServer", "_drain_pipe", "loop.drain", ""),
    ("actors.pool", "PooledActor", "_run_slice", "slice", "slice.end"),
    # Counted per fork, not placed on its path (`bench.fork_daemon --serial`'s counts).
    ("agenthost.publisher", "EventPublisher", "_publish", "events.batch", ""),
    ("agenthost.publisher", "EventPublisher", "project", "events.project", ""),
    ("transport.server", "ApiServer", "publish_many", "events.handover", ""),
    ("actors.pool", "ActorPool", "submit", "pool.submit", ""),
    ("actors.session_base", "SessionCore", "session", "actor.session_read", ""),
    ("storage.fork_prepare", "", "require_session", "prepare.session_read", ""),
    ("storage.fork_snapshot", "", "history_link", "history_link", ""),
    ("storage.history_links", "", "history_link", "history_link", ""),
    # The daemon's end of the worker link (the supervisor's loop thread).
    ("drivers.supervisor", "WorkerSupervisor", "_send", "sup.send", ""),
    ("drivers.supervisor", "WorkerSupervisor", "_complete", "sup.complete", ""),
)

# module, class, attribute, stamp on entry, stamp on exit; only what is looked up at call
# time can be wrapped (the worker's method table holds bound methods made at start).
WORKER_POINTS = (
    ("transport.worker_link", "WorkerEnd", "_dispatch", "w.recv", ""),
    ("domain.worker_messages", "ForkRequest", "from_wire", "w.fork", ""),
    ("transport.worker_link", "WorkerEnd", "send_result", "w.send", "w.sent"),
    ("drivers.app_server.fork", "ForkThroughTurn", "_fork_on", "w.fork_on", "w.fork_on.end"),
    ("drivers.app_server.fork", "ForkThroughTurn", "_source_turns", "w.source", "w.source.end"),
    (
        "drivers.app_server.fork",
        "ForkThroughTurn",
        "_fork_runtime",
        "w.runtime",
        "w.runtime.end",
    ),
    ("drivers.app_server.process", "AppServerProcess", "answer", "w.answer", "w.answered"),
    ("drivers.binder", "DirsAhead", "run", "w.dirs", "w.dirs.end"),
    ("drivers.binder", "DirsAhead", "ready", "w.dirs.ready", "w.dirs.ready.end"),
    ("drivers.binder", "RolloutBinder", "begin", "w.bind", "w.bind.end"),
    ("drivers.app_server.fork", "ForkThroughTurn", "_prove_readable", "w.proof", "w.proof.end"),
    ("drivers.binder", "PendingNames", "wait", "w.names", "w.names.end"),
    ("drivers.claude.fork", "ClaudeFork", "plan_fork", "c.plan", "c.plan.end"),
    ("drivers.claude.fork", "ClaudeFork", "call_fork_session", "c.sdk_fork", "c.sdk_fork.end"),
    ("drivers.claude.fork", "ClaudeFork", "relocate_child", "c.relocate", "c.relocate.end"),
    ("drivers.binder", "NamesSyncing", "wait", "w.nsync", "w.nsync.end"),
    ("drivers.claude.fork", "ClaudeFork", "verify_child", "c.verify", "c.verify.end"),
)


def unresolved() -> list[str]:
    """Every point whose module, class or method today's code lacks (a wrapped point that is
    gone stamps nothing, and a daemon point that is gone stops `_install`)."""
    import importlib

    missing: list[str] = []
    for module_name, cls, attr, *_ in (*POINTS, *WORKER_POINTS):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name}: {exc}")
            continue
        owner = getattr(module, cls, None) if cls else module
        if owner is None or not callable(getattr(owner, attr, None)):
            missing.append(f"{module_name}.{cls + '.' if cls else ''}{attr}")
    return missing


def _wrap_stamped(
    rec: list[tuple[str, float]], owner: object, attr: str, before: str, after: str
) -> None:
    """Replace `owner.attr` by a wrapper appending `(before, ms)` to `rec` on entry and, when
    `after` is set, `(after, ms)` on exit (wall clock; a classmethod stays one)."""
    import time

    raw = vars(owner).get(attr)
    fn = getattr(owner, attr)

    def stamped(*args: object, **kwargs: object) -> object:
        rec.append((before, time.time() * 1000.0))
        try:
            return fn(*args, **kwargs)
        finally:
            if after:
                rec.append((after, time.time() * 1000.0))

    if isinstance(raw, classmethod):
        setattr(owner, attr, classmethod(lambda cls, *a, **k: stamped(*a, **k)))
    else:
        setattr(owner, attr, stamped)


# A driver worker's threads are named too (`bench.fork_daemon`'s worker CPU by thread).
_A_WORKER = "--connect" in sys.argv and "--provider" in sys.argv
if (_SERVE or _A_WORKER) and os.environ.get("AGENTHOST_NAME_THREADS"):
    import contextlib
    import ctypes
    import threading

    _libc = ctypes.CDLL(None)
    _bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def _named(self: threading.Thread) -> None:
        with contextlib.suppress(Exception):  # a name is a convenience
            _libc.prctl(15, self.name[:15].encode(), 0, 0, 0)  # PR_SET_NAME
        _bootstrap_inner(self)

    threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]

if _SERVE and os.environ.get("AGENTHOST_WRITE_STATS"):
    import json
    import threading
    import time as _time
    from typing import Any

    _FIFO = os.environ["AGENTHOST_WRITE_STATS"]
    _stores: list[object] = []
    _queued = [0]

    def _catch_store() -> None:
        # The daemon's collector is frozen after start-up (gc.get_objects skips it), so the
        # store is caught at its next write: `_take_baton` wrapped until one call, then put back.
        while getattr(sys.modules.get("storage.base"), "Database", None) is None:
            _time.sleep(0.01)  # not imported yet, or its body still running
        cls = sys.modules["storage.base"].Database
        original = cls._take_baton

        def caught(self: object) -> None:
            if self not in _stores:
                _stores.append(self)
            cls._take_baton = original
            original(self)

        cls._take_baton = caught
        # Takes that find the baton held (read without its lock, as a diagnostic): each one
        # queues, and is a hand-off, a thread woken, when its turn comes.
        baton = sys.modules["storage.sqlite"].Baton
        take = baton.take

        def counted(self: Any, timeout_s: float) -> None:
            if self.owner is not None:
                _queued[0] += 1
            take(self, timeout_s)

        baton.take = counted

    def _stats_loop() -> None:
        _catch_store()
        while True:
            with open(_FIFO) as f:
                f.read()
            total: dict[str, int] = {}
            for db in _stores:
                for k, v in db.write_stats.snapshot().items():  # type: ignore[attr-defined]
                    total[k] = total.get(k, 0) + v
            total["queued_takes"] = _queued[0]
            with open(_FIFO + ".tmp", "w") as out:
                json.dump(total, out)
            os.replace(_FIFO + ".tmp", _FIFO + ".json")

    threading.Thread(target=_stats_loop, name="wstats", daemon=True).start()

if _SERVE and _STAMPS:
    import atexit
    import importlib
    import threading
    import time
    from typing import Any

    _rec: list[tuple[str, float]] = []

    def _install() -> None:
        for module, cls, attr, before, after in POINTS:
            mod = importlib.import_module(module)
            _wrap_stamped(_rec, getattr(mod, cls) if cls else mod, attr, before, after)

    def _when_imported() -> None:
        names = {module for module, *_ in POINTS} | {"agenthost.daemon"}
        while not all(n in sys.modules for n in names):
            time.sleep(0.05)
        time.sleep(0.3)  # every module's body has run by now (the daemon is starting)
        _install()

    def _dump() -> None:
        with open(str(_STAMPS), "w") as f:
            for point, ms in _rec:
                f.write(f"{point}\t{ms:.3f}\n")

    threading.Thread(target=_when_imported, name="stamps", daemon=True).start()
    atexit.register(_dump)

if _WORKER and _STAMPS:
    import importlib
    import threading
    import time
    from typing import Any

    _wrec: list[tuple[str, float]] = []

    def _winstall() -> None:
        """Wraps every worker point before the worker's main runs (its modules imported here,
        at the interpreter's start): a point wrapped by a thread polling for its module could
        come after the worker bound the method (`WorkerEnd._dispatch` in its method table), and
        the loaded run of the suite stamped none of the worker's side."""
        for module, cls, attr, before, after in WORKER_POINTS:
            try:
                owner = getattr(importlib.import_module(module), cls)
            except (ImportError, AttributeError):
                continue  # a point of another tree's code, or a provider's SDK not installed
            if hasattr(owner, attr):
                _wrap_stamped(_wrec, owner, attr, before, after)

    def _wdump() -> None:
        """Appends what was stamped since the last call: the worker leaves by `os._exit`, so
        its stamps are written as they come (every 0.2 s), not at exit."""
        done = 0
        while True:
            time.sleep(0.2)
            fresh, done = _wrec[done:], done + len(_wrec[done:])
            if fresh:
                with open(f"{_STAMPS}.w{os.getpid()}", "a") as f:
                    f.writelines(f"{point}\t{ms:.3f}\n" for point, ms in fresh)

    _winstall()
    threading.Thread(target=_wdump, name="stamps-out", daemon=True).start()

# `AGENTHOST_GC_TIMES=<prefix>`: every Python process of the tree (daemon, workers, app-servers:
# each inherits this folder on its PYTHONPATH) adds up the thread CPU its collections take
# (`gc.callbacks`, `time.thread_time` around each) and writes `<collections> <gc CPU s>
# <process CPU s>` to `<prefix>.<kind>.<pid>` once a second.
_GC_TIMES = os.environ.get("AGENTHOST_GC_TIMES")
_GC_KIND = (
    "daemon"
    if _SERVE
    else "worker"
    if "--connect" in sys.argv
    else "app-server"
    if "app-server" in sys.argv
    else None
)
if _GC_TIMES and _GC_KIND:
    import gc
    import threading
    import time

    _gc_state = [0, 0.0, 0.0]  # collections, CPU seconds in them, start of the current one

    def _gc_timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_state[2] = time.thread_time()
        else:
            _gc_state[0] += 1
            _gc_state[1] += time.thread_time() - _gc_state[2]

    gc.callbacks.append(_gc_timed)

    def _gc_dump() -> None:
        path = f"{_GC_TIMES}.{_GC_KIND}.{os.getpid()}"
        while True:
            time.sleep(1.0)
            with open(path, "w") as f:
                f.write(f"{_gc_state[0]} {_gc_state[1]:.6f} {time.process_time():.6f}\n")

    threading.Thread(target=_gc_dump, name="gc-times", daemon=True).start()

# `AGENTHOST_PROFILE_WORKER=<prefix>`: a driver worker profiles each fork (`AppServerDriver.fork`,
# cProfile on the thread that runs it) and writes each thread's stats to `<prefix>.<pid>.<tid>`
# every 50 forks (the worker leaves by `os._exit`: nothing is written at exit).
_PROFILE = os.environ.get("AGENTHOST_PROFILE_WORKER")
if _PROFILE and _A_WORKER:
    import cProfile
    import importlib
    import threading
    import time

    _local = threading.local()

    def _pinstall() -> None:
        deadline = time.monotonic() + 60.0
        while "drivers.app_server.driver" not in sys.modules and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)
        owner = importlib.import_module("drivers.app_server.driver").AppServerDriver
        inner = owner.fork

        def fork(self: object, request: object) -> object:
            prof = getattr(_local, "prof", None)
            if prof is None:
                prof = _local.prof = cProfile.Profile(time.thread_time_ns, 1e-9)
                _local.n = 0
            prof.enable()
            try:
                return inner(self, request)
            finally:
                prof.disable()
                _local.n += 1
                if _local.n % 50 == 0:
                    prof.dump_stats(f"{_PROFILE}.{os.getpid()}.{threading.get_native_id()}")
                    _local.nfile = _local.n

        owner.fork = fork

    threading.Thread(target=_pinstall, name="profile", daemon=True).start()
