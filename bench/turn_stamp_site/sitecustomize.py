"""Loaded by every process of a `bench.turn_overhead` run whose PYTHONPATH this folder leads
(the bench, the daemon, the worker): `time.perf_counter()` stamps (CLOCK_MONOTONIC, one clock
for all of them and for the bench's fake model) at the points of a Turn's path, for
`bench.turn_split` to lay out hop by hop.

Inert unless `AGENTHOST_TURN_STAMPS` names a directory; each process writes
`<dir>/<pid>.tsv` (`point<TAB>ms` lines, its command line first) every second and at exit. A
point is stamped on entry to the function listed in `_POINTS` (and on exit, for those with an
end); a `suffix` names which capture, event or notification it was.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("AGENTHOST_TURN_STAMPS")

if _DIR:
    import atexit
    import threading
    import time
    from collections.abc import Callable
    from typing import Any

    _rec: list[tuple[str, float]] = []
    _clock = time.perf_counter
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

    Suffix = Callable[[tuple[Any, ...]], "str | None"] | None
    # module, class, method, stamp on entry, stamp on exit ("": none), suffix of the args
    # after self (None: none; a suffix of None skips the stamp)
    _POINTS: tuple[tuple[str, str, str, str, str, Suffix], ...] = (
        ("transport.server", "ApiServer", "_handle", "d.api", "", None),
        ("actors.session_turns", "TurnRunner", "on_submit", "d.submit", "d.submit.end", None),
        ("storage.turns", "TurnStore", "claim_submit", "d.claim", "d.claim.end", None),
        (
            "actors.checkpoints",
            "TurnCheckpoints",
            "_run",
            "d.cap",
            "d.cap.end",
            lambda a: str(a[3]),
        ),
        (
            "actors.checkpoints",
            "TurnCheckpoints",
            "capture_after_here",
            "d.here.after",
            "d.here.end.after",
            None,
        ),
        ("actors.session_turns", "TurnRunner", "_read_for_start", "d.read", "d.read.end", None),
        ("actors.session_turns", "TurnRunner", "_early_before", "d.early", "d.early.end", None),
        ("storage.base", "Database", "_end_group", "d.commit", "d.commit.end", None),
        ("agenthost.api_base", "_Counted", "result", "d.reply", "d.reply.end", None),
        ("transport.replies", "OneShotResponder", "result", "d.reply1", "d.reply1.end", None),
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
        ("actors.session_turns", "TurnRunner", "_turn_started", "d.started", "", None),
        ("agenthost.daemon", "Daemon", "_on_worker_event", "d.ev", "", _event_type),
        ("actors.session_turns", "TurnRunner", "settle", "d.settle", "", None),
        ("actors.turn_writes", "TurnWrites", "_drain_batch", "d.batch", "d.batch.end", None),
        ("agenthost.publisher", "EventPublisher", "_publish", "d.pub", "d.pub.end", None),
        ("transport.server", "ApiServer", "publish_many", "d.pubmany", "", None),
        ("drivers.worker", "WorkerServer", "_start_turn", "w.server", "", None),
        (
            "drivers.app_server.driver",
            "AppServerDriver",
            "start_turn",
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
        # the app-server (tutti-agent): its `turn/start`, the turn's thread, each rollout append
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

    def _wrap(owner: Any, attr: str, before: str, after: str, suffix: Suffix) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return  # a tree without this point

        def stamped(*args: Any, **kwargs: Any) -> Any:
            name, end = before, after
            if suffix is not None:
                which = suffix(args[1:])
                if which is None:
                    return fn(*args, **kwargs)
                name, end = f"{before}.{which}", f"{after}.{which}" if after else ""
            _rec.append((name, _clock() * 1000.0))
            try:
                return fn(*args, **kwargs)
            finally:
                if end:
                    _rec.append((end, _clock() * 1000.0))

        setattr(owner, attr, stamped)

    def _wrap_sample(cls: Any) -> None:
        """Each timed Turn's deltas (either side): when the model emitted each (`M.emit`)
        and when the bench's client had it (`c.delta`), the same clock as every stamp."""
        init = cls.__init__

        def stamped(self: Any, turn_ms: float, arrivals: Any, emitted: Any, **kw: Any) -> None:
            for e, a in zip(emitted, arrivals, strict=False):
                _rec.append(("M.emit", float(e)))
                _rec.append(("c.delta", float(a)))
            init(self, turn_ms, arrivals, emitted, **kw)

        cls.__init__ = stamped

    def _dump() -> None:
        with open(os.path.join(str(_DIR), f"{os.getpid()}.tsv"), "w") as f:
            f.write("#" + " ".join(sys.argv[:3]) + "\n")
            for point, ms in list(_rec):
                f.write(f"{point}\t{ms:.3f}\n")

    def _install() -> None:
        """Wrap each point once its module is imported (the client's `host_turn` in the
        bench's `__main__`); write the stamps every second (a worker may end by a signal)."""
        pending = list(_POINTS)
        client = False
        ticks = 0
        while True:
            for point in list(pending):
                module = sys.modules.get(point[0])
                if module is None or (point[1] and not hasattr(module, point[1])):
                    continue
                _wrap(getattr(module, point[1]) if point[1] else module, *point[2:])
                pending.remove(point)
            main = sys.modules.get("__main__")
            if not client and main is not None and hasattr(main, "host_turn"):
                _wrap(main, "host_turn", "c.submit", "c.done", None)
                if hasattr(main, "Sample"):
                    _wrap_sample(main.Sample)
                client = True
            ticks += 1
            if ticks % 10 == 0:
                _dump()
            time.sleep(0.1)

    threading.Thread(target=_install, name="turn-stamps", daemon=True).start()
    atexit.register(_dump)
