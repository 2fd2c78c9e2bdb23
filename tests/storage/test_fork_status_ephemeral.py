"""A fork operation's status change builds no ephemeral B-tree (schema v20). SQLite tests
`x IN (a, b, c)` — more than two constants — by building an ephemeral index of the list at each
run of a statement (each row, inside a trigger's program): every status UPDATE built four (the
status CHECK, the barrier index's predicate on the old and the new row, the fence witness
trigger's WHEN), about a third of a start-up recovery commit's CPU. Counted on the programs
SQLite compiles (`EXPLAIN`, trigger programs included), never timed; and the restated tests
accept, select and release exactly what the lists did. A real SQLite file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request

from domain.fork_states import BARRIER_SQL, ForkStatus, holds_barrier, stage_of
from storage.models import LeftoverCommit
from storage.store import Store
from tests.storage.store_builders import bare_operation, operations_only

pytestmark = pytest.mark.timeout(60)

_CONTROL = ("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT", "ROLLBACK")


def _ephemeral(conn: apsw.Connection, sql: str, bindings: Any) -> tuple[int, int]:
    """OpenEphemeral opcodes in the program of `sql`: (its own, its triggers' programs'). The
    programs of its triggers follow its own in `EXPLAIN`, each numbered from 0 again."""
    counts = [0, 0]
    program = -1
    for r in conn.execute(f"EXPLAIN {sql}", bindings):
        if r[0] == 0:
            program += 1
        if r[1] == "OpenEphemeral":
            counts[min(program, 1)] += 1
    return counts[0], counts[1]


def _leftover_store(path: Path, n: int = 3) -> list[str]:
    """A store left by a stop: `n` operations `provider_accepted`, one `prepared`, one
    `dispatching` (each source a Session of two settled Turns)."""
    store = Store.open(path)
    try:
        accepted: list[str] = []
        for i in range(n + 2):
            sid = new_session(store, provider_session_id=f"prov-{i}")
            turn = ""
            for t in range(2):
                turn = settled_turn(store, sid, text=f"t{t}", provider_turn_id=f"p{i}-{t}").turn_id
            op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn))
            if i == n:
                continue  # left prepared
            store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
            if i == n + 1:
                continue  # left dispatching
            store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
            accepted.append(op.operation_id)
        return accepted
    finally:
        store.close()


def test_start_up_recovery_runs_no_statement_that_builds_an_ephemeral_table(
    tmp_path: Path,
) -> None:
    """Every statement the writer runs in start-up recovery's status changes and its batch of
    commits, compiled again with the bindings it ran with: no ephemeral B-tree per row or per
    operation (on schema v19 each commit's status UPDATE built four, and the fence witness
    trigger one per settled row)."""
    accepted = _leftover_store(tmp_path / "store.sqlite3")
    store = Store.open(tmp_path / "store.sqlite3")  # a restarted process's store
    ran: list[tuple[str, Any]] = []
    conn = store.db._writer_connection()

    def trace(_cursor: object, sql: str, bindings: Any) -> bool:
        if sql.split(None, 1)[0].upper() not in _CONTROL:
            ran.append((sql, bindings))
        return True

    conn.exec_trace = trace
    try:
        failed, unknown = store.fork_recovery.settle_leftover_fork_statuses(
            prepared_error="e1", dispatching_error="e2"
        )
        keys = [LeftoverCommit(WS, op_id) for op_id in accepted]
        committed = store.fork_commit.commit_fork_operations(keys)
    finally:
        conn.exec_trace = None
    assert (failed, unknown, committed) == (1, 1, (len(accepted), 0))
    status_updates = [s for s, _ in ran if s.startswith("UPDATE fork_operations")]
    assert len(status_updates) == 2 + len(accepted)  # the two settles, one per commit
    built = {sql: _ephemeral(conn, sql, b or ()) for sql, b in ran}
    store.close()
    # No trigger program builds one (each runs per row), nor a statement run per operation;
    # the two set-based settles build the two of their one run (the rowids of the index they
    # walk and change, their RETURNING rows), whatever the number of rows.
    settles = {sql for sql in built if "SET status = ?, error = ?" in sql}
    assert len(settles) == 2
    assert {sql: n for sql, n in built.items() if n != ((2, 0) if sql in settles else (0, 0))} == {}


def test_the_restated_tests_accept_select_and_release_what_the_lists_did(
    tmp_path: Path,
) -> None:
    """A v19 store with an operation in every status migrates to v20: the CHECK still takes
    every status and refuses any other, the barrier's index holds exactly the rows the rule
    (`holds_barrier`) selects and still serves its queries, and the fence witness is released
    exactly when an operation leaves the active statuses."""
    conn = operations_only(tmp_path / "store.sqlite3", 19)
    statuses = [s.value for s in ForkStatus]
    for n, status in enumerate(statuses * 2):
        bare_operation(conn, n, status, 1 if n >= len(statuses) else None, ws=WS, source="src")
    conn.close()
    store = Store.open(tmp_path / "store.sqlite3")  # migrates to v20
    try:
        w = store.db._writer_connection()
        table = str(
            w.execute("SELECT sql FROM sqlite_master WHERE name = 'fork_operations'").fetchone()[0]
        )
        assert "status IN" not in table
        with pytest.raises(apsw.ConstraintError):
            w.execute("UPDATE fork_operations SET status = 'bogus' WHERE operation_id = 'op-0'")
        rows = w.execute(
            "SELECT operation_id, status, client_observed_at_ms FROM fork_operations"
        ).fetchall()
        want = {op for op, st, seen in rows if holds_barrier(ForkStatus(st), seen is not None)}
        held = {
            str(r[0])
            for r in w.execute(
                "SELECT operation_id FROM fork_operations INDEXED BY fork_operations_barrier_held"
                f" WHERE {BARRIER_SQL}"
            )
        }
        assert held == want and len(want) == 9  # 4 statuses twice, committed un-ACKed once
        # The witness: the source's row, held by one operation (as `fence_history` writes it;
        # since v21 the trigger finds it by the source's key), released on leaving the active set.
        w.execute("PRAGMA foreign_keys = OFF")
        w.execute("INSERT INTO session_keys (workspace_id, session_id) VALUES (?, 'src')", (WS,))
        for n, status in enumerate(statuses):
            for to in statuses:
                w.execute("SAVEPOINT t")
                w.execute(
                    "INSERT OR REPLACE INTO history_fences (session_key, op_seq, changes)"
                    " SELECT k.session_key, o.op_seq, 0 FROM session_keys k, fork_operations o"
                    " WHERE k.workspace_id = ? AND k.session_id = 'src' AND o.operation_id = ?",
                    (WS, f"op-{n}"),
                )
                flag = int(holds_barrier(ForkStatus(to), False))  # schema v22's CHECK
                w.execute(  # (and v23's)
                    "UPDATE fork_operations SET status = ?, barrier = ?, stage = ?"
                    " WHERE operation_id = ?",
                    (to, flag, stage_of(ForkStatus(to)), f"op-{n}"),
                )
                kept = w.execute(
                    "SELECT count(*) FROM history_fences f JOIN fork_operations o"
                    " ON o.op_seq = f.op_seq WHERE o.operation_id = ?",
                    (f"op-{n}",),
                ).fetchone()[0]
                w.execute("ROLLBACK TO t")
                w.execute("RELEASE t")
                active = to in ("prepared", "dispatching", "provider_accepted")
                assert kept == int(active), (status, to)
    finally:
        store.close()


def test_the_writer_keeps_its_statement_and_savepoint_journals_in_memory(tmp_path: Path) -> None:
    """Each recovery commit runs in its own savepoint, whose journal holds every page of the
    store it changes; on the store of months (random pages of the Turns' and Sessions' indexes)
    that is well over the 64 KiB SQLite keeps in memory before it moves the journal to a
    temporary file written two `pwrite`s a page (~10 % of a commit's CPU, py-spy). The writer
    runs with `temp_store = MEMORY` (set when it is made), and its commits still work."""
    accepted = _leftover_store(tmp_path / "store.sqlite3", n=2)
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        keys = [LeftoverCommit(WS, op_id) for op_id in accepted]
        assert store.fork_commit.commit_fork_operations(keys) == (2, 0)
        assert store.db._writer_connection().execute("PRAGMA temp_store").fetchone() == (2,)
    finally:
        store.close()
