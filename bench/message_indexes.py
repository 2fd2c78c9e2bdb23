"""What each key of the `messages` table costs a big fork's commit, and what it buys the reads
(issue 20 row 10). Not part of `make bench`: an experiment that decides schema questions.

A store-only big source (`bench.scale.build_store_source`: 1,000 Turns × 10 Messages) is built
once; per variant, a copy gets its `messages` table rebuilt with that variant's keys. Each round
then, on a fresh copy per variant (variants interleaved, so machine load hits all alike), writes
a child like a fork's commit does: its Session and Turns in one transaction, then its 10,000
Messages (fresh random ids, the source's rows and positions, in position order) in one more,
with `synchronous=FULL`, foreign keys on and the writer's page cache, timing the `executemany`
and the COMMIT (wall and CPU) and the WAL bytes the COMMIT wrote. The reads that use the keys are
timed on the result (best of 9): the fork boundary's whole-Session read in position order, a
50-Turn timeline page, 2,000 Message lookups by id (a streamed update, a settle's final-Message
check) and 2,000 `MAX(position)` (every append); `EXPLAIN QUERY PLAN` says which key each used.

    build/venv/bin/python -m bench.message_indexes [--quick|--smoke] [--json PATH]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apsw

from bench.common import BenchResult, Mode, Table, bench_main, log, pick
from bench.scale import build_store_source
from storage.base import WRITER_CACHE_KIB

MODULE = "bench.message_indexes"

_COLUMNS = """workspace_id TEXT NOT NULL, session_id TEXT NOT NULL, message_id TEXT NOT NULL,
    turn_id TEXT, kind TEXT NOT NULL, text TEXT, payload_json TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 1, position INTEGER NOT NULL, created_at_ms INTEGER NOT NULL"""
_FOREIGN = """, FOREIGN KEY (workspace_id, session_id)
        REFERENCES sessions(workspace_id, session_id),
    FOREIGN KEY (workspace_id, session_id, turn_id)
        REFERENCES turns(workspace_id, session_id, turn_id)"""
_BY_TURN = "CREATE INDEX messages_by_turn ON messages (workspace_id, session_id, turn_id, position)"
_ID_KEY = ", PRIMARY KEY (workspace_id, session_id, message_id)"
_POSITION_KEY = ", UNIQUE (workspace_id, session_id, position)"

SESSION_KEY = "schema v7 (today): the keys on an integer Session key"
_BY_SESSION_KEY = (
    "session_key = (SELECT session_key FROM session_keys WHERE workspace_id = ? AND session_id = ?)"
)
# name -> (keys in the CREATE TABLE, table options, indexes, foreign keys enforced)
VARIANTS: dict[str, tuple[str, str, tuple[str, ...], bool]] = {
    "schema v6 (the text keys)": (_ID_KEY + _POSITION_KEY, "", (_BY_TURN,), True),
    "without the id key": (_POSITION_KEY, "", (_BY_TURN,), True),
    "without the position key": (_ID_KEY, "", (_BY_TURN,), True),
    "without messages_by_turn": (_ID_KEY + _POSITION_KEY, "", (), True),
    "WITHOUT ROWID, keyed by position": (
        ", PRIMARY KEY (workspace_id, session_id, position),"
        " UNIQUE (workspace_id, session_id, message_id)",
        " WITHOUT ROWID",
        (_BY_TURN,),
        True,
    ),
    "the text keys, foreign keys off": (_ID_KEY + _POSITION_KEY, "", (_BY_TURN,), False),
    "no key, no index (the table alone)": ("", "", (), True),
    # The same three keys on an integer per Session (`session_keys`, schema v7) instead of the
    # two 36-character ids; the row keeps its ids (the foreign keys and every query use them).
    SESSION_KEY: (
        ", PRIMARY KEY (session_key, message_id), UNIQUE (session_key, position)",
        "",
        ("CREATE INDEX messages_by_turn ON messages (session_key, turn_id, position)",),
        True,
    ),
}

_MESSAGE_SELECT = (
    "SELECT workspace_id, session_id, message_id, turn_id, kind, text, payload_json, version,"
    " position FROM messages"
)


def _files(path: Path) -> list[Path]:
    return [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]


def _copy(src: Path, dst: Path) -> Path:
    for f in _files(dst):
        f.unlink(missing_ok=True)
    for f, g in zip(_files(src), _files(dst), strict=True):
        if f.exists():
            shutil.copy(f, g)
    return dst


def prepare_variant(src: Path, dst: Path, name: str) -> Path:
    """A copy of `src` whose `messages` table has variant `name`'s keys (rows unchanged)."""
    keys, options, indexes, _ = VARIANTS[name]
    conn = apsw.Connection(str(_copy(src, dst)))
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("BEGIN")
    extra = ", session_key INTEGER NOT NULL" if name == SESSION_KEY else ""
    conn.execute(f"CREATE TABLE m2 ({_COLUMNS}{extra}{keys}{_FOREIGN}){options}")
    conn.execute(
        "INSERT INTO m2 SELECT m.workspace_id, m.session_id, m.message_id, m.turn_id, m.kind,"
        " m.text, m.payload_json, m.version, m.position,"
        f" m.created_at_ms{', k.session_key' if extra else ''} FROM messages m"
        " JOIN session_keys k USING (workspace_id, session_id)"
        " ORDER BY m.workspace_id, m.session_id, m.position"
    )
    conn.execute("DROP TABLE messages")
    conn.execute("ALTER TABLE m2 RENAME TO messages")
    for ddl in indexes:
        conn.execute(ddl)
    conn.execute("COMMIT")
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    return dst


def insert_child(
    path: Path, ws: str, sid: str, foreign_keys: bool, session_key: bool = False
) -> dict[str, Any]:
    """Write a 10,000-Message child of `sid` as a fork's commit does; time the Messages."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
    conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
    where = " WHERE workspace_id = ? AND session_id = ? ORDER BY position"
    rows = conn.execute(_MESSAGE_SELECT + where, (ws, sid)).fetchall()
    turns = conn.execute(
        "SELECT * FROM turns WHERE workspace_id = ? AND session_id = ?", (ws, sid)
    ).fetchall()
    child = str(uuid.uuid4())
    turn_ids = {str(t[2]): str(uuid.uuid4()) for t in turns}
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO sessions SELECT workspace_id, ?, kind, provider, provider_session_id, title,"
        " cwd, settings_json, runtime_context_json, model, pinned, deleted, goal,"
        " parent_session_id, parent_turn_id, rail_placement, visibility, created_at_ms,"
        " updated_at_ms, 0, real_cwd FROM sessions WHERE workspace_id = ? AND session_id = ?",
        (child, ws, sid),
    )
    key_row = conn.execute(
        "SELECT session_key FROM session_keys WHERE workspace_id = ? AND session_id = ?",
        (ws, child),
    ).fetchone()
    key = key_row[0] if key_row is not None else None
    conn.executemany(
        "INSERT INTO turns VALUES (" + ", ".join("?" * len(turns[0])) + ")",
        [(t[0], child, turn_ids[str(t[2])], *t[3:]) for t in turns],
    )
    conn.execute("COMMIT")
    tail = (key,) if session_key else ()
    messages = [(r[0], child, str(uuid.uuid4()), turn_ids[str(r[3])], *r[4:], *tail) for r in rows]
    wal_before = os.path.getsize(f"{path}-wal")
    c0, t0 = time.process_time(), time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
        f" payload_json, version, position, created_at_ms{', session_key' if tail else ''})"
        f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1{', ?' if tail else ''})",
        messages,
    )
    c1, t1 = time.process_time(), time.perf_counter()
    conn.execute("COMMIT")
    c2, t2 = time.process_time(), time.perf_counter()
    wal = os.path.getsize(f"{path}-wal") - wal_before
    conn.close()
    return {
        "insertMs": (t1 - t0) * 1000,
        "insertCpuMs": (c1 - c0) * 1000,
        "commitMs": (t2 - t1) * 1000,
        "commitCpuMs": (c2 - c1) * 1000,
        "walMb": wal / 1e6,
    }


def _best(fn: Callable[[], object], n: int = 9) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def time_reads(
    path: Path, ws: str, sid: str, session_key: bool = False
) -> tuple[dict[str, float], dict[str, str]]:
    """The reads that use `messages`' keys, on `sid` (best of 9, ms), and their query plans;
    with `session_key` they find the Session's integer key first (one primary-key lookup)."""
    conn = apsw.Connection(str(path))
    turns = [
        str(r[0])
        for r in conn.execute(
            "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ? ORDER BY sequence",
            (ws, sid),
        )
    ]
    ids = [
        str(r[0])
        for r in conn.execute(
            "SELECT message_id FROM messages WHERE workspace_id = ? AND session_id = ?", (ws, sid)
        )
    ][:2000]
    page = turns[:50]
    whole = _MESSAGE_SELECT + " WHERE workspace_id = ? AND session_id = ? ORDER BY position"
    in_page = (
        _MESSAGE_SELECT + " WHERE workspace_id = ? AND session_id = ?"
        f" AND turn_id IN ({','.join('?' * len(page))}) ORDER BY position"
    )
    by_id = (
        "SELECT turn_id FROM messages WHERE workspace_id = ? AND session_id = ? AND message_id = ?"
    )
    last = (
        "SELECT COALESCE(MAX(position), 0) + 1 FROM messages WHERE workspace_id = ?"
        " AND session_id = ?"
    )

    def fetch_all(sql: str, params: Sequence[Any]) -> object:
        return conn.execute(sql, params).fetchall()

    def each_id(sql: str, _params: Sequence[Any]) -> object:
        return [conn.execute(sql, (ws, sid, i)).fetchone() for i in ids]

    def repeated(sql: str, params: Sequence[Any]) -> object:
        return [conn.execute(sql, params).fetchone() for _ in range(2000)]

    reads: dict[str, tuple[str, Sequence[Any], Callable[[str, Sequence[Any]], object]]] = {
        "boundary read (whole Session, position order)": (whole, (ws, sid), fetch_all),
        "50-Turn page": (in_page, (ws, sid, *page), fetch_all),
        "2,000 lookups by id": (by_id, (ws, sid, ids[0]), each_id),
        "2,000 MAX(position)": (last, (ws, sid), repeated),
    }
    timings: dict[str, float] = {}
    plans: dict[str, str] = {}
    for label, (text, params, read) in reads.items():
        sql = (
            text.replace(
                "workspace_id = ? AND session_id = ?",
                _BY_SESSION_KEY,
            )
            if session_key
            else text
        )
        timings[label] = _best(lambda: read(sql, params))  # noqa: B023 - called right here
        plan = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
        plans[label] = "; ".join(str(step[3]) for step in plan)
    conn.close()
    return timings, plans


def run(mode: Mode) -> BenchResult:
    turns = pick(mode, 1000, 1000, 10)
    rounds = pick(mode, 7, 3, 1)
    result = BenchResult("message-indexes", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-message-indexes-") as tmp_text:
        tmp = Path(tmp_text)
        sid, _ = build_store_source(tmp / "big", turns, 10)
        src = tmp / "big" / "store.sqlite3"
        conn = apsw.Connection(str(src))
        row = conn.execute("SELECT workspace_id FROM sessions WHERE session_id = ?", (sid,))
        ws = str(row.fetchone()[0])  # type: ignore[index]
        conn.close()
        bases = {
            name: prepare_variant(src, tmp / f"variant-{i}.sqlite3", name)
            for i, name in enumerate(VARIANTS)
        }
        load = os.getloadavg()[0]
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        reads: dict[str, dict[str, float]] = {}
        plans: dict[str, dict[str, str]] = {}
        for r in range(rounds):
            log(f"message_indexes: round {r + 1} of {rounds}")
            for name, base in bases.items():
                copy = _copy(base, tmp / "round.sqlite3")
                keyed = name == SESSION_KEY
                samples[name].append(insert_child(copy, ws, sid, VARIANTS[name][3], keyed))
                if r == 0:
                    reads[name], plans[name] = time_reads(copy, ws, sid, keyed)
        load_end = os.getloadavg()[0]

    def med(name: str, key: str) -> float:
        return float(statistics.median(s[key] for s in samples[name]))

    result.tables.append(
        Table(
            f"a {turns * 10}-Message child's insert + COMMIT, median of {rounds} interleaved"
            f" rounds (1-min load average {load:.2f} at start, {load_end:.2f} at end)",
            ("messages keys", "insert ms", "insert CPU", "COMMIT ms", "COMMIT CPU", "WAL MB"),
            tuple(
                (
                    name,
                    med(name, "insertMs"),
                    med(name, "insertCpuMs"),
                    med(name, "commitMs"),
                    med(name, "commitCpuMs"),
                    med(name, "walMb"),
                )
                for name in VARIANTS
            ),
        )
    )
    labels = list(next(iter(reads.values())))
    result.tables.append(
        Table(
            "reads of the source's Messages on each variant, best of 9, ms",
            ("messages keys", *labels),
            tuple((name, *(reads[name][label] for label in labels)) for name in VARIANTS),
        )
    )
    for name in VARIANTS:
        for label in labels:
            result.notes.append(f"plan [{name}] {label}: {plans[name][label]}")
    quick = {Mode.QUICK: " --quick", Mode.SMOKE: " --smoke"}.get(mode, "")
    result.notes.append(f"command: build/venv/bin/python -m {MODULE}{quick}")
    result.figures = {"samples": samples, "reads": reads, "plans": plans, "load": [load, load_end]}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
