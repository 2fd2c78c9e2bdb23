"""Tool: two or more stores of months compared statement by statement, for the reads the store of
months times (the session list's first page, `session.get` and the newest timeline page of the
10,000-Turn Session) and the failed forks' trees every start asks for.

For each store: its schema version, whether it holds planner statistics (`sqlite_stat1`), its
freelist, and each b-tree those statements read (pages, cells, depth, from `dbstat`); for each
statement, SQLite's plan on every store (marked where they differ) and its time on every store,
interleaved round by round (wall and CPU ms of this thread, p50 / p90), so a difference of the
host hits every store alike.

The stores are opened read-only as immutable files: nothing is written beside them (no -shm), so
a cache under build/bench-cache/ can be read in place. A store with a `-wal` file is refused
(immutable would not see the WAL's pages): stop its daemon first.

    build/venv/bin/python -m bench.months_compare \\
        build/bench-cache/months-...-schema12-gen1 build/bench-cache/months-...-schema14-gen1
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import apsw

from bench.common import percentile
from bench.harness import WS
from bench.months import PAGE, SESSION, _id
from storage.rows import HYDRATE_MESSAGES_SQL, INTERACTION_COLUMNS, SESSION_SELECT, TURN_COLUMNS

BIG = _id(SESSION, 0)
_LIST_WHERE = (
    " WHERE s.workspace_id = ? AND s.deleted = 0"
    " AND (s.created_at_ms > ? OR (s.created_at_ms = ? AND s.session_id > ?))"
    " ORDER BY s.created_at_ms, s.session_id LIMIT ?"
)
TREES = (
    "fork_operations",
    "fork_lineage",
    "history_links",
    "interactions",
    "messages",
    "session_keys",
    "sessions",
    "turns",
)


def _open(target: Path) -> apsw.Connection:
    path = target / "store.sqlite3" if target.is_dir() else target
    if Path(f"{path}-wal").exists():
        raise SystemExit(f"{path} has a -wal file: stop its daemon (a clean close removes it)")
    return apsw.Connection(
        f"file:{path}?immutable=1", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
    )


def statements(conn: apsw.Connection) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """The statements of the three reads (as storage/ writes them) and the start's trees query,
    bound as the benchmark binds them: the list's first page, the big Session's newest page."""
    last = int(
        conn.execute(
            "SELECT max(sequence) FROM turns WHERE workspace_id = ? AND session_id = ?", (WS, BIG)
        ).fetchall()[0][0]
    )
    after = max(0, last - PAGE)
    turn_ids = tuple(
        str(r[0])
        for r in conn.execute(
            "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ? AND sequence > ?"
            " ORDER BY sequence LIMIT ?",
            (WS, BIG, after, PAGE),
        )
    )
    marks = ",".join("?" * len(turn_ids))
    sizes = (
        "SELECT length(s.settings_json) + length(s.runtime_context_json) + length(s.title)"
        " + length(s.cwd) + coalesce(length(s.goal), 0) FROM sessions s"
    )
    return {
        "list: sizes": (sizes + _LIST_WHERE, (WS, -1, -1, "", PAGE + 1)),
        "list: page": (SESSION_SELECT + _LIST_WHERE, (WS, -1, -1, "", PAGE + 1)),
        "get: the Session": (
            SESSION_SELECT + " WHERE s.workspace_id = ? AND s.session_id = ?",
            (WS, BIG),
        ),
        "timeline: live": (
            "SELECT deleted FROM sessions WHERE workspace_id = ? AND session_id = ?",
            (WS, BIG),
        ),
        "timeline: Turns": (
            f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND sequence > ? ORDER BY sequence LIMIT ?",
            (WS, BIG, after, PAGE + 1),
        ),
        "timeline: Messages": (HYDRATE_MESSAGES_SQL.format(marks=marks), (WS, BIG, *turn_ids)),
        "timeline: Interactions": (
            f"SELECT {INTERACTION_COLUMNS} FROM interactions WHERE workspace_id = ?"
            f" AND session_id = ? AND turn_id IN ({marks}) ORDER BY created_at_ms, rowid",
            (WS, BIG, *turn_ids),
        ),
        "start: failed forks' trees": (
            "SELECT workspace_id, operation_id, workspace_json FROM fork_operations"
            " WHERE status = ? AND workspace_state IN (?, ?) ORDER BY +op_seq LIMIT ?",
            ("failed", "planned", "made", 500),
        ),
    }


def describe(name: str, conn: apsw.Connection) -> list[str]:
    def one(sql: str) -> Any:
        return conn.execute(sql).fetchall()[0][0]

    stats = one("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'")
    lines = [
        f"{name}: schema v{one('PRAGMA user_version')}, {one('PRAGMA page_count'):,} pages,"
        f" freelist {one('PRAGMA freelist_count')}, sqlite_stat1 {'present' if stats else 'absent'}"
    ]
    try:
        rows = conn.execute(
            "SELECT t.name, count(*), sum(d.ncell), max(length(d.path) - length(replace(d.path,"
            " '/', ''))) FROM dbstat d JOIN sqlite_master t ON t.name = d.name"
            f" WHERE t.tbl_name IN ({','.join('?' * len(TREES))}) GROUP BY t.name ORDER BY t.name",
            TREES,
        ).fetchall()
    except apsw.Error as exc:  # a build without the dbstat table
        return [*lines, f"  (no dbstat: {exc})"]
    return lines + [f"  {n}: {p:,} pages, {c:,} cells, depth {d}" for n, p, c, d in rows]


def plans(names: Sequence[str], conns: Sequence[apsw.Connection]) -> list[str]:
    lines = []
    for label, (sql, args) in statements(conns[0]).items():
        got = [
            " | ".join(str(r[-1]) for r in c.execute("EXPLAIN QUERY PLAN " + sql, args))
            for c in conns
        ]
        same = all(g == got[0] for g in got)
        lines.append(f"{label}: {'same plan' if same else 'PLANS DIFFER'}")
        for name, plan in zip(names, got if not same else got[:1], strict=False):
            lines.append(f"  {name if not same else 'all'}: {plan}")
    return lines


def timings(names: Sequence[str], conns: Sequence[apsw.Connection], rounds: int) -> list[str]:
    stmts = statements(conns[0])
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = list(zip(names, conns, strict=True))
        if r % 2:
            order.reverse()
        for label, (sql, args) in stmts.items():
            for name, conn in order:
                w, c = time.perf_counter(), time.thread_time()
                conn.execute(sql, args).fetchall()
                cpu.setdefault((label, name), []).append((time.thread_time() - c) * 1000)
                wall.setdefault((label, name), []).append((time.perf_counter() - w) * 1000)
    lines = [f"wall p50 / p90 ms, then CPU p50 ms, {rounds} rounds interleaved:"]
    for label in stmts:
        cells = [
            f"{name} {percentile(wall[(label, name)], 50):.3f} /"
            f" {percentile(wall[(label, name)], 90):.3f},"
            f" CPU {percentile(cpu[(label, name)], 50):.3f}"
            for name in names
        ]
        lines.append(f"  {label}: " + "; ".join(cells))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.months_compare", description=__doc__)
    ap.add_argument("stores", nargs="+", type=Path, help="cache dirs, daemon homes or files")
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args(argv)
    names = [chr(ord("A") + i) for i in range(len(args.stores))]
    conns = [_open(p) for p in args.stores]
    try:
        for name, conn, path in zip(names, conns, args.stores, strict=True):
            print("\n".join(describe(f"{name} = {path}", conn)))
        print("\n".join(plans(names, conns)))
        print("\n".join(timings(names, conns, args.rounds)))
    finally:
        for conn in conns:
            conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
