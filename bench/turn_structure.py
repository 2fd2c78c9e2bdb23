"""A warm Turn's structure, counted (issue 36 targets 4 and 2): every actor message (by type),
future, thread hand-off, transaction (its statements and fsyncs), event published (by type),
store read and checkpoint capture of one warm tutti-agent Turn, `turn.submit` → its settled
`turn.updated`, with the CPU of the daemon's threads that run them.

`bench.fork_structure`'s method on a Turn: an in-process daemon (`tests.support.in_process`)
whose every thread runs under its own `cProfile.Profile(time.thread_time)` from its first
instruction, on `bench.turn_overhead`'s timed fake model (`side_by_side("tutti-agent")`: the
same reply in `--deltas` deltas 2 ms apart) with checkpoints on (the Session's folder holds a
few files); `--warm` Turns first, then `--turns` Turns through `turn_overhead.host_turn` (each
awaited on its settled `turn.updated`) between two snapshots of every profiler. The actor
messages and published events are also tallied by type (thin wrappers, outside the profile).
Printed per Turn: each item's count by thread (call counts: the profiler does not change them)
and each thread's profiled CPU (cProfile inflates Python ~3x: shares, not timings). The driver
worker is not profiled. Not a benchmark of record.

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.turn_structure [--turns 40]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import fork_structure as fs

# (label, pattern on "function file:line"): the Turn's own items beside the fork's.
TURN_ITEMS: tuple[tuple[str, str], ...] = (
    ("checkpoint captures begun on the pool", r"^capture .*actors/checkpoints\.py"),
    ("checkpoint captures tried on the caller", r"^capture_after_here .*actors/checkpoints\.py"),
    ("captures run (the pool's `_run`)", r"^_run .*actors/checkpoints\.py"),
    ("captures discarded", r"^discard .*actors/checkpoints\.py"),
    ("store: get_session", r"^get_session .*storage/"),
    ("store: get_turn", r"^get_turn .*storage/"),
    ("store: read_snapshot (events' read transactions)", r"^read_snapshot .*storage/"),
    ("actor row cache: cached_session", r"^cached_session .*actors/"),
    ("actor row cache: session() reads", r"^session .*actors/session_base\.py"),
    ("Turn writes queued (DurableWrite)", r"^enqueue .*actors/turn_writes\.py"),
    ("Turn write batches run", r"^_run_batch|^_flush .*actors/turn_writes\.py"),
    ("later (a future's answer brought to the actor)", r"^later .*actors/session_base\.py"),
    ("after (a timer armed by the actor)", r"^after .*actors/session_base\.py"),
    ("timer cancels", r"^cancel .*actors/pool\.py"),
    ("events projected", r"^project .*agenthost/publisher\.py"),
    ("event batches published (publish_many)", r"^publish_many .*transport/server\.py"),
    ("deltas offered", r"^offer_delta .*agenthost/publisher\.py"),
)


def _edges() -> dict[str, dict[tuple[Any, Any], int]]:
    """Each thread's (caller, callee) call counts (for `TURNSTRUCT_TOP`)."""
    out: dict[str, dict[tuple[Any, Any], int]] = {}
    for name, prof in list(fs._PROFS):
        d = out.setdefault(re.sub(r"[_-]?\d+$", "", name), {})
        for e in prof.getstats():
            for sub in e.calls or ():
                k = (fs._key(e.code), fs._key(sub.code))
                d[k] = d.get(k, 0) + sub.callcount
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--deltas", type=int, default=20)
    ap.add_argument(
        "--after",
        type=float,
        default=0.2,
        help="seconds the window stays open after the last Turn (35: past the first-byte check)",
    )
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="turnstruct-"))
    (tmp / "user-home").mkdir()
    os.environ["HOME"] = str(tmp / "user-home")
    fs._profile_threads()
    import actors.pool as pool
    import bench.turn_overhead as turns
    import transport.server as server_mod
    from bench.common import cpu_probe_ms
    from bench.harness import WS, create_session, run_turn
    from tests.support.in_process import in_process_daemon
    from transport.client import EventSubscriber

    turns.REPLY = "".join(f"d{i:02d} " for i in range(args.deltas))
    counting = [False]
    messages: Counter[str] = Counter()
    events: Counter[str] = Counter()
    real_put = pool._PooledInbox.put

    def put(self: Any, envelope: Any, /) -> None:
        if counting[0]:
            msg = envelope.message
            name = type(msg).__name__
            inner = getattr(msg, "event", None)
            if inner is not None:
                name += f" {type(inner).__name__}:{getattr(inner, 'kind', '')}"
            messages[f"{name} [{threading.current_thread().name}]"] += 1
        real_put(self, envelope)

    setattr(pool._PooledInbox, "put", put)  # noqa: B010
    real_many = server_mod.ApiServer.publish_many

    def publish_many(self: Any, evs: Any) -> bool:
        if counting[0]:
            for _topic, ev in evs:
                kind = str(ev.get("type"))
                if kind == "turn.updated":
                    turn = ev["turn"]
                    kind += f" ({turn.get('phase')}, {len(turn.get('messages') or ())} msgs)"
                events[kind] += 1
        return bool(real_many(self, evs))

    setattr(server_mod.ApiServer, "publish_many", publish_many)  # noqa: B010

    timers: Counter[str] = Counter()
    timer_cls = pool.Timers
    real_later = timer_cls.call_later

    def call_later(self: Any, seconds: float, fn: Any) -> Any:
        if counting[0]:
            f = sys._getframe(1)
            names: list[str] = []
            while f is not None and len(names) < 3:
                if (
                    "session_base" not in f.f_code.co_filename
                    and "pool.py" not in f.f_code.co_filename
                ):
                    names.append(f.f_code.co_name)
                f = f.f_back  # type: ignore[assignment]
            timers[f"{seconds:g}s " + " < ".join(names)] += 1
        return real_later(self, seconds, fn)

    setattr(timer_cls, "call_later", call_later)  # noqa: B010
    statements: Counter[str] = Counter()

    def exec_trace(cursor: Any, sql: str, bindings: Any) -> bool:
        if counting[0]:
            statements[f"[{threading.current_thread().name}] " + " ".join(sql.split())[:110]] += 1
        return True

    if os.environ.get("TURNSTRUCT_SQL"):
        import apsw

        def hook(con: Any) -> None:
            con.exec_trace = exec_trace

        apsw.connection_hooks.append(hook)
    print(f"load {os.getloadavg()[0]:.2f} probe {cpu_probe_ms():.0f} ms", flush=True)
    with turns.side_by_side("tutti-agent", tmp) as (_server, config, _bare):
        home = tmp / "home"
        home.mkdir(mode=0o700)
        lines = ['[providers."tutti-agent"]'] + [
            f"{k} = {json.dumps(v)}" for k, v in config.items()
        ]
        (home / "agenthost.toml").write_text("\n".join(lines) + "\n")
        with in_process_daemon(home, timeout=120) as (daemon, c):
            work = home.parent / f"{home.name}-work"
            for i in range(5):
                (work / f"f{i}.txt").write_text(f"file {i}\n")
            sub = EventSubscriber(daemon.events_endpoint, [WS])
            sid = create_session(c, "turnstruct", provider="tutti-agent")
            for i in range(args.warm):
                run_turn(c, sid, f"warm {i}")
            time.sleep(0.3)
            assert daemon.store is not None
            stats = daemon.store.db.write_stats
            w0 = stats.snapshot()

            a, ea = fs._snap(), _edges()
            counting[0] = True
            for i in range(args.turns):
                _ms, arrivals = turns.host_turn(c, sub, sid, f"turn {i}")
                assert len(arrivals) == args.deltas, len(arrivals)
            time.sleep(args.after)  # the Turns' after-math (hand-offs; with 35 s, timers)
            counting[0] = False
            b, eb = fs._snap(), _edges()
            w1 = stats.snapshot()
            sub.close()
    n = args.turns
    print(f"{n} warm Turns of {args.deltas} deltas")
    print("\nwrite stats per Turn:")
    for k, v in w1.items():
        d = v - w0.get(k, 0)
        if d:
            print(f"  {k:40} {d / n:6.2f}")
    print("\nactor messages (inbox puts) per Turn, by type [putting thread]:")
    for k, v in sorted(messages.items(), key=lambda x: -x[1]):
        print(f"  {k:60} {v / n:6.2f}")
    print("\nevents published per Turn, by type:")
    for k, v in sorted(events.items(), key=lambda x: -x[1]):
        print(f"  {k:60} {v / n:6.2f}")
    print("\ntimers armed per Turn, by seconds and caller:")
    for k, v in sorted(timers.items(), key=lambda x: -x[1]):
        print(f"  {k:80} {v / n:6.2f}")
    if statements:
        print("\nSQL statements per Turn [thread]:")
        for k, v in sorted(statements.items(), key=lambda x: -x[1]):
            print(f"  {v / n:6.2f}  {k}")
    stats_d = fs._diff(a, b)
    edges_d = {th: {k: v - ea.get(th, {}).get(k, 0) for k, v in d.items()} for th, d in eb.items()}
    stats_d = {
        th: d
        for th, d in stats_d.items()
        if not any(
            x in th for x in ("process_request_thread", "responses-server", "agenthost-client")
        )
    }
    fs.ITEMS = fs.ITEMS + TURN_ITEMS
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fs.report("daemon", stats_d, n)
    print(out.getvalue().replace("committed fork", "Turn").replace("per fork", "per Turn"))
    top = os.environ.get("TURNSTRUCT_TOP")  # a thread name: its functions by calls per Turn
    if top:
        calls: Counter[str] = Counter()
        for th, d in stats_d.items():
            if th.startswith(top):
                for k, (c, _it, _tt) in d.items():
                    calls[fs._name(k).replace(str(fs.REPO) + "/", "")] += c
        print(f"\n{top}: functions by calls per Turn")
        for name, c in calls.most_common(60):
            print(f"  {c / n:7.2f}  {name}")
        callers: Counter[tuple[str, str]] = Counter()
        for th, d in edges_d.items():
            if th.startswith(top):
                for (caller, callee), c in d.items():
                    callers[(fs._name(callee), fs._name(caller))] += c
        for callee in ("<built-in method builtins.isinstance>", "<built-in method builtins.len>"):
            print(f"\n{top}: callers of {callee}, per Turn")
            for (ce, cr), c in callers.most_common():
                if ce.startswith(callee) and c / n >= 1:
                    print(f"  {c / n:7.2f}  {cr.replace(str(fs.REPO) + '/', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
