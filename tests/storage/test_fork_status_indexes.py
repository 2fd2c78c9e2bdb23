"""The indexes a fork's status change moves (schema v19): each of a fork's three status
UPDATEs rewrites the operation in every index that names `status`, so only those a query reads
are kept — the source's (the fence, the child's title count), the barrier's partial one, and the
worktrees' partial one (which holds no shared fork). Start-up recovery, the only reader of the
dropped `(status, op_seq)` index, walks the barrier's partial index: every active operation
holds its barrier. A real SQLite file; a v18 store migrates and recovers."""

from __future__ import annotations

from pathlib import Path

import apsw

from domain.fork_states import ForkStatus
from storage.fork_recovery import _BY_BARRIER, _leftover
from storage.store import Store
from tests.storage.store_builders import bare_operation, operations_only

WS, SRC = "ws", "src"


def _status_indexes(conn: apsw.Connection) -> set[str]:
    """The indexes of `fork_operations` a status UPDATE must maintain: those naming `status`
    as a column or in their WHERE."""
    found: set[str] = set()
    for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'fork_operations'"
    ):
        columns = {str(r[2]) for r in conn.execute(f"PRAGMA index_info({name})")}
        if "status" in columns or (sql is not None and "status" in str(sql)):
            found.add(str(name))
    return found


def _plan(conn: apsw.Connection, sql: str, params: tuple[object, ...] = ()) -> str:
    return " | ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_a_status_change_moves_only_the_indexes_a_query_reads(tmp_path: Path) -> None:
    conn = operations_only(tmp_path / "store.sqlite3")
    # The barrier's partial index is not one since v22: its WHERE is a flag, which only the
    # prepare, `failed`, `abandoned` and the ACK set (tests/storage/test_fork_barrier_flag.py);
    # the source's is not one since v23: its key has the stage, which only the prepare, the
    # commit, `failed`, `unknown`, an adopt and `abandoned` set (tests/storage/test_fork_stage.py).
    assert _status_indexes(conn) == {"fork_operations_worktrees"}
    conn.close()


def test_recovery_walks_the_barrier_index_not_the_table(tmp_path: Path) -> None:
    conn = operations_only(tmp_path / "store.sqlite3")
    for n in range(300):  # forks committed and ACKed long ago: no barrier, not recovered
        _op(conn, n, "committed", observed=1)
    conn.execute("ANALYZE")
    commits = (
        f"SELECT workspace_id, operation_id FROM {_BY_BARRIER}"
        f" {_leftover(ForkStatus.PROVIDER_ACCEPTED)} ORDER BY op_seq"
    )
    plan = _plan(conn, commits)
    assert "USING INDEX fork_operations_barrier_held" in plan, plan
    settle = (
        f"UPDATE {_BY_BARRIER} SET status = 'failed' {_leftover(ForkStatus.PREPARED)}"
        " RETURNING workspace_id"
    )
    plan = _plan(conn, settle)
    assert "USING INDEX fork_operations_barrier_held" in plan, plan
    conn.close()


def test_a_v18_store_migrates_and_recovers_in_op_seq_order(tmp_path: Path) -> None:
    conn = operations_only(tmp_path / "store.sqlite3", 18)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "fork_operations_recoverable" in names
    statuses = ["committed", "provider_accepted", "prepared", "dispatching", "unknown"]
    for n in range(40):
        _op(conn, n, statuses[n % len(statuses)], observed=1 if n % 10 == 0 else None)
    conn.close()

    store = Store.open(tmp_path / "store.sqlite3")  # migrates to the current version
    try:
        names = {r[0] for r in store.db.rows("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "fork_operations_recoverable" not in names
        assert "fork_operations_barrier_held" in names
        leftover = store.fork_recovery.leftover_commits()
        assert [c.operation_id for c in leftover] == [f"op-{n}" for n in range(1, 40, 5)]
        failed, unknown = store.fork_recovery.settle_leftover_fork_statuses(
            prepared_error="e1", dispatching_error="e2"
        )
        assert (failed, unknown) == (8, 8)
        rows = dict(store.db.rows("SELECT operation_id, status FROM fork_operations"))
        for n in range(40):
            was = statuses[n % len(statuses)]
            now = {"prepared": "failed", "dispatching": "unknown"}.get(was, was)
            assert rows[f"op-{n}"] == now, n
    finally:
        store.close()


def _op(conn: apsw.Connection, n: int, status: str, observed: int | None = None) -> None:
    bare_operation(conn, n, status, observed, ws=WS, source=SRC)
