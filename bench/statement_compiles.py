"""SQL compilations on the daemon's warm paths, per connection kind (issue 36 targets 3, 4, 2).

An in-process daemon (tests/support/in_process.py: the real store, worker and tutti-agent
app-server). Every connection the store opens is recorded as it opens (`storage.base`'s
`open_connection` wrapped) with its kind: `writer` (the pool connection the writes run on),
`reader` (the other pooled connections, each with its own apsw statement cache), `readview`
(the transport's read-only `ReadView`), `checkpoint` (the checkpointer's own). Each phase runs
`--warm` rounds to fill the caches, then counts over `--rounds` rounds:

- compilations: SQLite's authorizer is asked while a statement compiles and never when a cached
  statement runs again; a compilation is an execution (`trace_v2` STMT event) preceded by
  authorizer calls. Setting the authorizer expires every prepared statement, so it is set
  before the warm rounds, never between them and the counted ones.
- apsw's statement cache: `cache_stats()` deltas (misses, evictions, too_big, no_cache).

Counts, not timings: the load does not move them. Phases: `fork` (a warm fork of a 3-Turn
source and its ACK), `turn` (a warm Turn submitted and read until settled), `reads` (the reads a
GUI makes: session list and get, a timeline page, the lineage), `sources` (the first fork of
each of many one-Turn sources), `mixed` (a fork, three Turns and the reads: apsw's cache is a
ring that a statement's every execution re-enters, so one run less often than the last
`statementcachesize` executions is evicted).

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.statement_compiles \\
        [--warm 5] [--rounds 10] [--sql]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw

import storage.base
from bench.common import cpu_probe_ms

if TYPE_CHECKING:
    from transport.client import Client

CACHE_KEYS = ("hits", "misses", "evictions", "too_big", "no_cache")


class Watched:
    """One connection: its kind, its compilations (with their SQL), its cache stats."""

    def __init__(self, conn: apsw.Connection, kind: str) -> None:
        self.conn = conn
        self.kind = kind
        self.pending = 0
        self.compiles = 0
        self.sql: Counter[str] = Counter()
        self.lock = threading.Lock()

    def authorizer(self, *_: object) -> int:
        with self.lock:
            self.pending += 1
        return apsw.SQLITE_OK

    def trace(self, event: dict[str, Any]) -> None:
        with self.lock:
            if self.pending:
                self.pending = 0
                self.compiles += 1
                self.sql[" ".join(str(event.get("sql", "")).split())[:160]] += 1

    def watch(self) -> None:
        self.conn.authorizer = self.authorizer
        self.conn.trace_v2(apsw.SQLITE_TRACE_STMT, self.trace)

    def snapshot(self) -> tuple[int, dict[str, int], Counter[str]]:
        with self.lock:
            stats = self.conn.cache_stats()
            return self.compiles, {k: int(stats[k]) for k in CACHE_KEYS}, Counter(self.sql)


WATCHED: list[Watched] = []


def _kind_of_caller() -> str:
    frame = sys._getframe(2)
    name = frame.f_code.co_name
    return {"_checkout": "reader", "_checkpoint_loop": "checkpoint", "_connection": "readview"}.get(
        name, name
    )


def install() -> None:
    real: Callable[..., apsw.Connection] = storage.base.open_connection

    def opened(*args: Any, **kwargs: Any) -> apsw.Connection:
        conn = real(*args, **kwargs)
        w = Watched(conn, _kind_of_caller())
        w.watch()
        WATCHED.append(w)
        return conn

    storage.base.open_connection = opened  # type: ignore[assignment]
    real_writer = storage.base.Database._writer_connection

    def writer(self: storage.base.Database) -> apsw.Connection:
        conn = real_writer(self)
        for w in WATCHED:
            if w.conn is conn:
                w.kind = "writer"
        return conn

    storage.base.Database._writer_connection = writer  # type: ignore[method-assign]


def kinds(daemon: Any) -> None:
    writer = daemon.store.db._writer_conn
    for w in WATCHED:
        if w.conn is writer:
            w.kind = "writer"


Snap = dict[int, tuple[int, dict[str, int], Counter[str]]]


def snap_all() -> Snap:
    return {id(w): w.snapshot() for w in WATCHED}


def report(phase: str, rounds: int, before: Snap, after: Snap, show_sql: bool) -> None:
    by_kind: dict[str, list[int]] = {}
    conns: Counter[str] = Counter()
    sql: Counter[str] = Counter()
    for w in WATCHED:
        b = before.get(id(w), (0, dict.fromkeys(CACHE_KEYS, 0), Counter()))
        a = after[id(w)]
        row = by_kind.setdefault(w.kind, [0] * (1 + len(CACHE_KEYS)))
        row[0] += a[0] - b[0]
        for i, k in enumerate(CACHE_KEYS):
            row[1 + i] += a[1][k] - b[1][k]
        conns[w.kind] += 1
        for text, n in (a[2] - b[2]).items():
            sql[f"{w.kind}: {text}"] += n
    print(f"{phase}: per round over {rounds} rounds")
    print(f"  {'kind':<11} {'conns':>5} {'compiles':>9} " + " ".join(f"{k:>9}" for k in CACHE_KEYS))
    for kind, row in sorted(by_kind.items()):
        print(
            f"  {kind:<11} {conns[kind]:>5} {row[0] / rounds:>9.2f} "
            + " ".join(f"{v / rounds:>9.2f}" for v in row[1:])
        )
    if show_sql:
        for text, n in sql.most_common(40):
            print(f"    {n / rounds:6.2f}  {text}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sql", action="store_true", help="name the statements compiled")
    ap.add_argument("--cache", type=int, default=0, help="statementcachesize (0: the store's)")
    ap.add_argument("--series", help="print a bench/compiles_site file's counts and stop")
    args = ap.parse_args()
    if args.series:
        series(args.series)
        return
    # Here, not at the top: bench/compiles_site imports this module into a daemon.
    from tests.support.daemon import WS, create_session, fork_params, run_turn
    from tests.support.in_process import in_process_daemon

    with open("/proc/loadavg") as f:
        print(f"load {f.read().split()[0]} probe {cpu_probe_ms():.1f} ms")
    if args.cache:
        real_connection = apsw.Connection

        def sized(path: str, *a: Any, **kw: Any) -> apsw.Connection:
            kw["statementcachesize"] = args.cache
            return real_connection(path, *a, **kw)

        apsw.Connection = sized  # type: ignore[misc,assignment]
    install()
    with (
        tempfile.TemporaryDirectory() as tmp,
        in_process_daemon(Path(tmp) / "home", 60.0) as (
            daemon,
            c,
        ),
    ):
        sid = create_session(c, title="src")["agentSessionId"]
        turn_id = ""
        for i in range(3):
            turn_id = run_turn(c, sid, f"turn {i}")["turnId"]

        def fork_round() -> None:
            status, body = c.call_raw("fork.create", fork_params(WS, sid, turn_id))
            assert status == 200 and body["operation"]["status"] == "committed", body
            c.call(
                "fork.acknowledge",
                {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
            )

        tsid = create_session(c, title="turns")["agentSessionId"]

        def turn_round() -> None:
            run_turn(c, tsid, "again")

        def reads_round() -> None:
            reads(c, sid)

        # Sources of one Turn each, the first fork of each counted: its snapshot's reads of a
        # Session not forked before.
        fresh: list[tuple[str, str]] = []
        for i in range(args.warm + args.rounds):
            other = create_session(c, title=f"src {i}")["agentSessionId"]
            fresh.append((other, run_turn(c, other, "one")["turnId"]))

        def sources_round() -> None:
            other, other_turn = fresh.pop()
            status, body = c.call_raw("fork.create", fork_params(WS, other, other_turn))
            assert status == 200 and body["operation"]["status"] == "committed", body
            c.call(
                "fork.acknowledge",
                {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
            )

        def mixed_round() -> None:
            fork_round()
            for _ in range(3):
                turn_round()
            reads_round()

        phases = (
            ("fork", fork_round),
            ("turn", turn_round),
            ("reads", reads_round),
            ("sources", sources_round),
            ("mixed", mixed_round),
        )
        for phase, fn in phases:
            for _ in range(args.warm):
                fn()
            kinds(daemon)
            before = snap_all()
            for _ in range(args.rounds):
                fn()
            kinds(daemon)
            report(phase, args.rounds, before, snap_all(), args.sql)
        print(f"SQLite memory in use at the end: {apsw.memory_used() / 1e6:.1f} MB")
        print("statement caches at the end (entries held / size, lifetime evictions):")
        for w in WATCHED:
            stats = w.conn.cache_stats(include_entries=True)
            entries = len(stats["entries"])
            print(f"  {w.kind:<11} {entries:>4} / {stats['size']}  {stats['evictions']}")


def series(path: str) -> None:
    """A bench/compiles_site file: each kind's counts over the run's last 60 % (the first 40 %
    is start-up and warm-up), per second, and the whole run's."""
    import json

    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    t0, t1 = rows[0][0], rows[-1][0]
    mid = next(r for r in rows if r[0] >= t0 + 0.4 * (t1 - t0))
    end = rows[-1]
    secs = end[0] - mid[0]
    print(f"{len(rows)} s sampled; per second over the last {secs:.0f} s (whole run's total):")
    print(f"  {'kind':<11} {'conns':>5} {'compiles':>9} " + " ".join(f"{k:>9}" for k in CACHE_KEYS))
    for kind, row in sorted(end[1].items()):
        before = mid[1].get(kind, [0] * len(row))
        rates = [(a - b) / secs for a, b in zip(row[1:], before[1:], strict=True)]
        print(
            f"  {kind:<11} {row[0]:>5} "
            + " ".join(f"{r:>9.2f}" for r in rates)
            + "  ("
            + " ".join(str(v) for v in row[1:])
            + ")"
        )
    if len(end) > 2:
        first = mid[2] if len(mid) > 2 else {}
        grew = sorted(((n - first.get(k, 0), k) for k, n in end[2].items()), reverse=True)
        for n, text in grew[:25]:
            if n:
                print(f"    {n:5d}  {text}")


def reads(c: Client, sid: str) -> None:
    from tests.support.daemon import WS

    c.call("session.list", {"workspaceId": WS})
    c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
    c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})
    c.call("session.lineage", {"workspaceId": WS, "agentSessionId": sid})


if __name__ == "__main__":
    main()
