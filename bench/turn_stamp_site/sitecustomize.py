"""Loaded by every process of a `bench.turn_overhead` run whose PYTHONPATH this folder leads
(the bench, the daemon, the worker, tutti-agent's app-server): `time.perf_counter()` stamps
(CLOCK_MONOTONIC, one clock for all of them and for the bench's fake model) at the points of a
Turn's path, for `bench.turn_split` to lay out hop by hop.

Inert unless `AGENTHOST_TURN_STAMPS` names a directory; each process writes
`<dir>/<pid>.tsv` (`point<TAB>ms<TAB>thread` lines, its command line first) every 0.1 s and at
exit. A point is stamped on entry to the function listed in `POINTS` (and on exit, for those
with an end); a `suffix` names which capture, event, message or notification it was.

Each point's class is wrapped as its module is imported (an import hook), before any instance
exists: a method bound at start-up (a request table, a lane's handler, a reader's callback)
is the stamped one. (Wrapping from a polling thread, as this site did, lost every such race:
`w.n`, `w.server` and the daemon's `d.ev` stamped nothing.) `tests/bench/test_turn_stamps.py`
resolves every point against today's modules.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

_DIR = os.environ.get("AGENTHOST_TURN_STAMPS")

_NOTIFICATIONS = (
    "turn/completed",
    "item/completed",
    "turn/started",
    "item/agentMessage/delta",
)


def _event_type(args: tuple[Any, ...]) -> str | None:
    for arg in args:
        if isinstance(arg, dict) and "type" in arg:
            kind = str(arg.get("type"))
            if kind == "item":
                kind += "." + str(arg.get("kind") or "")
            return kind
    return "?"


def _link_message(args: tuple[Any, ...]) -> str | None:
    """A worker link message the supervisor's loop read, deltas left out."""
    msg = args[1]
    event = msg.get("event") or {}
    if msg.get("t") == "evt" and event.get("type") == "message.delta":
        return None
    return f"{msg.get('t')}.{event.get('type', '')}".rstrip(".")


def _actor_message(args: tuple[Any, ...]) -> str | None:
    message = args[0]
    name = type(message).__name__
    event = getattr(message, "event", None)
    return name + ("." + type(event).__name__ if event is not None else "")


Suffix = Callable[[tuple[Any, ...]], "str | None"] | None
# module, class, method, stamp on entry, stamp on exit ("": none), suffix of the args after
# self (None: none; a suffix of None skips the stamp)
POINTS: tuple[tuple[str, str, str, str, str, Suffix], ...] = (
    # the start: the client's submit → the Session actor → the claim's COMMIT → `turn.start`
    ("transport.server", "ApiServer", "_handle", "d.api", "", None),
    ("actors.session_actor", "SessionActor", "on_receive", "d.recv", "d.recv.end", _actor_message),
    ("actors.session_turns", "TurnRunner", "on_submit", "d.submit", "d.submit.end", None),
    ("storage.turns", "TurnStore", "claim_submit", "d.claim", "d.claim.end", None),
    ("actors.checkpoints", "TurnCheckpoints", "_run", "d.cap", "d.cap.end", lambda a: str(a[3])),
    (
        "actors.checkpoints",
        "TurnCheckpoints",
        "capture_after_here",
        "d.here.after",
        "d.here.end.after",
        None,
    ),
    (
        "actors.checkpoints",
        "TurnCheckpoints",
        "capture_before_here",
        "d.here.before",
        "d.here.end.before",
        None,
    ),
    ("actors.session_turns", "TurnRunner", "_read_for_start", "d.read", "d.read.end", None),
    ("actors.session_turns", "TurnRunner", "_early_before", "d.early", "d.early.end", None),
    ("storage.base", "Database", "_end_group", "d.commit", "d.commit.end", None),
    ("agenthost.api_base", "_Counted", "result", "d.reply", "d.reply.end", None),
    ("transport.server", "OneShotResponder", "result", "d.reply1", "d.reply1.end", None),
    ("agenthost.activity", "LoggedResponder", "_line", "d.logline", "d.logline.end", None),
    ("agenthost.projection", "", "turn", "d.project", "d.project.end", None),
    ("actors.session_turns", "TurnRunner", "_capture_before", "d.capb", "d.capb.end", None),
    (
        "actors.session_runtime",
        "SessionRuntime",
        "warm_turn_runtime",
        "d.warm",
        "d.warm.end",
        None,
    ),
    (
        "agenthost.workers",
        "SupervisorPort",
        "start_turn",
        "d.start_turn",
        "d.start_turn.end",
        None,
    ),
    # the supervisor's loop: its link send of `turn.start`, each non-delta message it reads
    (
        "drivers.supervisor",
        "WorkerSupervisor",
        "_send",
        "d.send",
        "d.send.end",
        lambda a: a[1].method if a[1].method == "turn.start" else None,
    ),
    ("drivers.supervisor", "WorkerSupervisor", "_handle", "d.lhand", "", _link_message),
    ("actors.session_turns", "TurnRunner", "_turn_started", "d.started", "", None),
    ("agenthost.daemon", "Daemon", "_on_worker_event", "d.ev", "", _event_type),
    # the end: the settlement (its write is stamped `d.write.settle`: TurnWrites.enqueue
    # below), its COMMIT (`d.commit`), the publisher and the XPUB
    ("actors.session_turns", "TurnRunner", "settle", "d.settle", "", None),
    ("agenthost.publisher", "EventPublisher", "_publish", "d.pub", "d.pub.end", None),
    ("transport.server", "ApiServer", "publish_many", "d.pubmany", "", None),
    # a settlement published on its writer's thread (`EventPublisher._publish_direct`), and
    # every hand-over sent on its caller's thread (a delta's too: the settled Turn's is last)
    ("agenthost.publisher", "EventPublisher", "_publish_direct", "d.pub", "d.pub.end", None),
    ("transport.server", "ApiServer", "publish_now", "d.pubmany", "", None),
    # the worker: `turn.start` in its request table (its first failpoint: the worker runs
    # `drivers/worker.py` as `__main__`, whose `WorkerServer._start_turn` no import hook
    # reaches), its driver, the notifications it reads, its link sends of the non-delta events
    (
        "drivers.failpoints",
        "Failpoints",
        "hit",
        "w",
        "",
        lambda a: "server" if a[0] == "worker.turn.before_start" else None,
    ),
    (
        "drivers.app_server.driver",
        "AppServerDriver",
        "start_turn",
        "w.start_turn",
        "w.start_turn.end",
        None,
    ),
    # a warm Turn's start on the worker's link thread (`WorkerServer._start_turn_here`)
    (
        "drivers.app_server.driver",
        "AppServerDriver",
        "begin_turn",
        "w.start_turn",
        "w.start_turn.end",
        None,
    ),
    (
        "drivers.app_server.events",
        "TurnEvents",
        "on_notification",
        "w.n",
        "",
        lambda a: str(a[1]) if a[1] in _NOTIFICATIONS else None,
    ),
    (
        "transport.worker_link",
        "WorkerEnd",
        "send_event",
        "w.send",
        "w.sent",
        lambda a: None if a[1].get("type") == "message.delta" else str(a[1].get("type")),
    ),
    # Claude Code: each streamed text delta as the worker's driver has it from the SDK
    (
        "drivers.claude.events",
        "ClaudeEvents",
        "_on_stream_event",
        "w.n",
        "",
        lambda a: (
            "item/agentMessage/delta"
            if isinstance(a[2], dict) and a[2].get("type") == "content_block_delta"
            else None
        ),
    ),
    # the app-server (tutti-agent): its `turn/start`, the turn's thread, each rollout append,
    # its model request
    (
        "tutti_agent.server",
        "AppServer",
        "_dispatch",
        "a.dispatch",
        "a.dispatch.end",
        lambda a: str(a[1]) if a[1] == "turn/start" else None,
    ),
    ("tutti_agent.turns", "LiveThread", "_run_turn", "a.run", "", None),
    ("tutti_agent.turns", "LiveThread", "append", "a.append", "a.append.end", None),
    ("tutti_agent.model", "ModelClient", "_post_once", "a.post", "", None),
)
# Each Turn write the Session actor queues: its `apply` (statements and, unless batched, its
# COMMIT) stamped `d.write.<kind>` / `d.write.end.<kind>`; the settlement's kind is `settle`.
WRITES = ("actors.turn_writes", "TurnWrites", "enqueue")
# (Gone: `d.batch`, `TurnWrites._drain_batch`: `bench.turn_split` says why.)
MODULES = sorted({p[0] for p in POINTS} | {WRITES[0]})


def unresolved() -> list[str]:
    """Every point (and the write hook) whose module, class or method today's code lacks."""
    import importlib

    missing: list[str] = []
    for module_name, cls, attr, *_ in (*POINTS, (*WRITES, "", "", None)):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name}: {exc}")
            continue
        owner = getattr(module, cls, None) if cls else module
        if owner is None or not callable(getattr(owner, attr, None)):
            missing.append(f"{module_name}.{cls + '.' if cls else ''}{attr}")
    return missing


if _DIR:
    import atexit
    import threading
    import time

    from bench.import_wrap import wrap_on_import

    _rec: list[tuple[str, float, str]] = []
    _clock = time.perf_counter

    def _tname() -> str:
        return threading.current_thread().name

    def _wrap(owner: Any, attr: str, before: str, after: str, suffix: Suffix) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return  # a tree without this point (the test names it)

        def stamped(*args: Any, **kwargs: Any) -> Any:
            name, end = before, after
            if suffix is not None:
                which = suffix(args[1:])
                if which is None:
                    return fn(*args, **kwargs)
                name, end = f"{before}.{which}", f"{after}.{which}" if after else ""
            _rec.append((name, _clock() * 1000.0, _tname()))
            try:
                return fn(*args, **kwargs)
            finally:
                if end:
                    _rec.append((end, _clock() * 1000.0, _tname()))

        setattr(owner, attr, stamped)

    def _wrap_writes(owner: Any) -> None:
        enqueue = getattr(owner, WRITES[2], None)
        if enqueue is None:
            return

        def stamped(self: Any, item: Any) -> None:
            inner = item.apply
            what = str(item.what)  # "settle <outcome>", "<kind> message", ...
            kind = "settle" if what.startswith("settle") else what.split(" ")[-1]

            def apply() -> object:
                _rec.append((f"d.write.{kind}", _clock() * 1000.0, _tname()))
                try:
                    return inner()
                finally:
                    _rec.append((f"d.write.end.{kind}", _clock() * 1000.0, _tname()))

            item.apply = apply
            enqueue(self, item)

        setattr(owner, WRITES[2], stamped)

    def _wrap_module(name: str, module: Any) -> None:
        for point in POINTS:
            if point[0] == name:
                owner = getattr(module, point[1], None) if point[1] else module
                if owner is not None:
                    _wrap(owner, *point[2:])
        if name == WRITES[0] and hasattr(module, WRITES[1]):
            _wrap_writes(getattr(module, WRITES[1]))

    def _wrap_sample(cls: Any) -> None:
        """Each timed Turn's deltas (either side): when the model emitted each (`M.emit`)
        and when the bench's client had it (`c.delta`), the same clock as every stamp."""
        init = cls.__init__

        def stamped(self: Any, turn_ms: float, arrivals: Any, emitted: Any, **kw: Any) -> None:
            for e, a in zip(emitted, arrivals, strict=False):
                _rec.append(("M.emit", float(e), "m"))
                _rec.append(("c.delta", float(a), "c"))
            init(self, turn_ms, arrivals, emitted, **kw)

        cls.__init__ = stamped

    _written = [0]
    _dumping = threading.Lock()

    def _dump() -> None:
        """Append the stamps made since the last call (the file begins with the command
        line)."""
        with _dumping:
            _append()

    def _append() -> None:
        done, upto = _written[0], len(_rec)
        with open(os.path.join(str(_DIR), f"{os.getpid()}.tsv"), "a") as f:
            if done == 0 and f.tell() == 0:
                f.write("#" + " ".join(sys.argv[:3]) + "\n")
            for point, ms, thread in _rec[done:upto]:
                f.write(f"{point}\t{ms:.3f}\t{thread}\n")
        _written[0] = upto

    def _watch() -> None:
        """Wrap the client's `host_turn` once the bench's `__main__` has it; write the new
        stamps every 0.1 s (a worker ends by a signal, without its `atexit`)."""
        client = False
        while True:
            main = sys.modules.get("__main__")
            if not client and main is not None and hasattr(main, "host_turn"):
                _wrap(main, "host_turn", "c.submit", "c.done", None)
                if hasattr(main, "Sample"):
                    _wrap_sample(main.Sample)
                client = True
            _dump()
            time.sleep(0.1)

    wrap_on_import(MODULES, _wrap_module)
    threading.Thread(target=_watch, name="turn-stamps", daemon=True).start()
    atexit.register(_dump)
