"""Schema v21: three indexes fewer on a fork's path (`turns_by_phase`,
`history_fences_by_op`, `session_reservations_by_operation`), the fence's release trigger
finding the row by its source's key, `session_reservations` and `fork_lineage` WITHOUT ROWID.
A v20 store with a Session, an active Turn, a committed fork and forks in flight migrates
with every row kept; the reads that used the dropped indexes still search through an index
(no scan); the release and the reservation's delete still find their one row.
"""

from __future__ import annotations

from pathlib import Path

import apsw
from store_builders import WS, new_session, settled_turn
from test_store_fork import request, run_to_commit

from storage.rows import SESSION_SELECT
from storage.schema import SCHEMA_VERSION, migrate, user_version
from storage.store import Store

# Schema v27 undone on a v27 store: the trigger that drops an ended fork's snapshot gone (v26
# made no object).
TO_V26 = "DROP TRIGGER fork_snapshots_of_ended; PRAGMA user_version = 26;"
# Schema v25 undone on a v25 store: the real cwd, the deleted tree's path and its index gone.
TO_V24 = (
    "DROP INDEX fork_operations_deleted_trees; DROP INDEX sessions_real_cwd;"
    " ALTER TABLE fork_operations DROP COLUMN deleted_tree_path;"
    " ALTER TABLE sessions DROP COLUMN real_cwd; PRAGMA user_version = 24;"
)
# Schema v24 undone on a v24 store: the Turns' `host_only` (and its CHECK) gone.
TO_V23 = "ALTER TABLE turns DROP COLUMN host_only; PRAGMA user_version = 23;"
# A v22 store made a v21 one: v22's flag (and its CHECK) gone, the barrier's index as v20 made it.
TO_V22 = (
    "DROP INDEX fork_operations_by_source;"
    " ALTER TABLE fork_operations DROP COLUMN stage;"
    " CREATE INDEX fork_operations_by_source"
    " ON fork_operations (workspace_id, source_session_id, status);"
    " PRAGMA user_version = 22;"
)
"""Schema v23 undone on a v23 store: its objects exactly a v22 store's (v2 made the index)."""
TO_V21 = (
    "DROP INDEX fork_operations_barrier_held;"
    " ALTER TABLE fork_operations DROP COLUMN barrier;"
    " CREATE INDEX fork_operations_barrier_held"
    " ON fork_operations (workspace_id, source_session_id, source_turn_id, op_seq)"
    " WHERE (status = 'prepared' OR status = 'dispatching' OR status = 'provider_accepted'"
    " OR status = 'unknown' OR (status = 'committed' AND client_observed_at_ms IS NULL));"
    " PRAGMA user_version = 21;"
)

DROPPED = ("turns_by_phase", "history_fences_by_op", "session_reservations_by_operation")
# v20's objects exactly as v1, v2, v15 and v20 made them (v22's undone first: `TO_V21`).
_TO_V20 = (
    "CREATE INDEX turns_by_phase ON turns (workspace_id, session_id, phase);"
    " CREATE INDEX session_reservations_by_operation"
    " ON session_reservations (workspace_id, operation_id);"
    " CREATE INDEX history_fences_by_op ON history_fences(op_seq);"
    " DROP TRIGGER history_fences_released;"
    " CREATE TRIGGER history_fences_released AFTER UPDATE OF status ON fork_operations"
    " WHEN NEW.status <> 'prepared' AND NEW.status <> 'dispatching'"
    " AND NEW.status <> 'provider_accepted'"
    " BEGIN DELETE FROM history_fences WHERE op_seq = NEW.op_seq; END;"
    " PRAGMA user_version = 20;"
)
_TABLES = (
    "sessions",
    "turns",
    "fork_operations",
    "history_fences",
    "session_reservations",
    "fork_lineage",
)


def _schema(conn: apsw.Connection) -> set[tuple[str, str, str]]:
    return {
        (str(t), str(n), " ".join(str(sql).split()))
        for t, n, sql in conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"
        )
    }


def _plan(conn: apsw.Connection, sql: str, bindings: tuple[object, ...]) -> list[str]:
    return [str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings)]


def test_a_v20_store_migrates_keeping_its_rows_and_its_reads_indexed(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    try:
        sid = new_session(store)
        last = settled_turn(store, sid, text="one", provider_turn_id="p1").turn_id
        other = new_session(store)
        other_last = settled_turn(store, other, text="two", provider_turn_id="p2").turn_id
        held, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))  # fence + reservation
        doomed, _ = store.fork_prepare.prepare_fork(WS, request(other, other_last))
        done = new_session(store)
        done_last = settled_turn(store, done, text="three", provider_turn_id="p3").turn_id
        committed = run_to_commit(
            store, store.fork_prepare.prepare_fork(WS, request(done, done_last))[0]
        )
        busy = new_session(store)
        store.turns.claim_submit(WS, busy, "r-active", "now")
    finally:
        store.close()
    fresh = apsw.Connection(":memory:")
    migrate(fresh, 20)
    conn = apsw.Connection(str(path))
    # The two tables back as v1 made them (rowid tables; their SQL the fresh v20 store's).
    for table in ("session_reservations", "fork_lineage"):
        (made,) = fresh.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        conn.execute(
            f"ALTER TABLE {table} RENAME TO old_{table}; {made};"
            f" INSERT INTO {table} SELECT * FROM old_{table}; DROP TABLE old_{table};"
        )
    (by_source,) = fresh.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'fork_lineage_by_source'"
    ).fetchone()
    conn.execute(f"{by_source};")
    conn.execute(TO_V26)
    conn.execute(TO_V24)
    conn.execute(TO_V23)
    conn.execute(TO_V22)
    conn.execute(TO_V21)
    conn.execute(_TO_V20)
    assert _schema(conn) == _schema(fresh), "the store is exactly a v20 store"
    before = {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in _TABLES}
    assert len(before["history_fences"]) == 2 and len(before["session_reservations"]) == 3
    assert len(before["fork_lineage"]) == 1
    assert migrate(conn, 21) == 20 and user_version(conn) == 21 < SCHEMA_VERSION
    after = {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in _TABLES}
    assert after == before
    names = {str(n) for (n,) in conn.execute("SELECT name FROM sqlite_master")}
    assert not names & set(DROPPED)
    current = apsw.Connection(":memory:")
    migrate(current, 21)
    assert _schema(conn) == _schema(current), "migrated = made fresh at v21"

    # The reads that went through `turns_by_phase`: the active Turn by `turns_active`, the
    # Session's Turns by the primary key's prefix; none scans.
    reads = {
        SESSION_SELECT + " WHERE s.workspace_id = ? AND s.session_id = ?": "turns_active",
        "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND phase = 'active' LIMIT 1": "turns_active",
        "SELECT sequence FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND sequence_provenance = 'fork_clone'": "sqlite_autoindex_turns_",
        # The reservation's delete (a failed or abandoned operation): its primary key.
        "DELETE FROM session_reservations WHERE workspace_id = ? AND session_id = ?"
        " AND operation_id = ?": "session_reservations USING PRIMARY KEY"
        " (workspace_id=? AND session_id=?)",
        # The lineage tree's children of a source (v21: a WITHOUT ROWID table's index).
        "SELECT target_session_id FROM fork_lineage WHERE workspace_id = ?"
        " AND source_session_id = ?": "fork_lineage_by_source",
    }
    for sql, index in reads.items():
        plan = _plan(conn, sql, (None,) * sql.count("?"))
        assert not any(step.startswith("SCAN") for step in plan), (sql, plan)
        assert any(index in step for step in plan), (sql, plan)
    # With statistics, as a long-lived store may gain them: the same.
    conn.execute("ANALYZE")
    for sql, index in reads.items():
        plan = _plan(conn, sql, (None,) * sql.count("?"))
        assert not any(step.startswith("SCAN") for step in plan), (sql, plan)
        assert any(index in step for step in plan), (sql, plan)
    conn.close()

    # Through the store: a failed operation frees its fence and its reservation, the other
    # operation's stay; the Session still shows its active Turn.
    store = Store.open(path)
    try:
        store.fork_transitions.mark_fork_dispatching(WS, doomed.operation_id)
        store.fork_transitions.mark_fork_failed(WS, doomed.operation_id, "boom")
        c = store.db.connection()
        fences = c.execute("SELECT op_seq FROM history_fences").fetchall()
        reserved = c.execute("SELECT operation_id FROM session_reservations").fetchall()
        held_seq = c.execute(
            "SELECT op_seq FROM fork_operations WHERE operation_id = ?", (held.operation_id,)
        ).fetchall()
        assert fences == held_seq
        assert sorted(reserved) == sorted([(held.operation_id,), (committed.operation_id,)])
        assert store.sessions.get_session(WS, busy).active_turn_id is not None
        assert store.sessions.get_session(WS, sid).active_turn_id is None
    finally:
        store.close()
