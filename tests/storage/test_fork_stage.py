"""Schema v23: where an operation stands for its source as a column. `fork_operations.stage` is
2 for an active operation, 1 for a committed or `unknown` one, 0 for a failed or abandoned one
(`domain.fork_states.stage_of`) — its CHECK refuses any other value — and
`fork_operations_by_source` keys on it instead of the status, so a fork's dispatching and
provider_accepted steps, which do not move it, leave that index alone. Proven here over every
status and every transition of the state machine: the CHECK accepts exactly the status's
stage, and the index then answers the fence probe (`stage = 2`) and the forks' count
(`stage > 0`) with exactly the rows the status selects; the store's own statements set it (a
path that forgot would fail), the steps that keep it name no column of the index, every reader
of the source's operations searches an index; a v22 store migrates with every row kept."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request, run_to_commit

from domain.fork_states import (
    ACTIVE,
    NOT_A_FORK,
    STAGE_A_FORK_SQL,
    STAGE_ACTIVE_SQL,
    STAGE_RULE_SQL,
    TRANSITIONS,
    ForkStatus,
    holds_barrier,
    sql_in,
    stage_of,
)
from storage.schema import SCHEMA_VERSION, STAGE_COLUMN, migrate, user_version
from storage.store import Store
from tests.storage.store_builders import bare_operation, operations_only

SRC = "src"


def _ids(conn: apsw.Connection, sql: str) -> set[str]:
    return {str(r[0]) for r in conn.execute(sql)}


def _agree(conn: apsw.Connection) -> None:
    """The stage's two sets are the status's, through the index and row by row."""
    by_index = "SELECT operation_id FROM fork_operations INDEXED BY fork_operations_by_source"
    where = f" WHERE workspace_id = '{WS}' AND source_session_id = '{SRC}'"
    by_status = "SELECT operation_id FROM fork_operations NOT INDEXED WHERE status"
    assert _ids(conn, f"{by_index}{where} AND {STAGE_ACTIVE_SQL}") == _ids(
        conn, f"{by_status} IN {sql_in(ACTIVE)}"
    )
    assert _ids(conn, f"{by_index}{where} AND {STAGE_A_FORK_SQL}") == _ids(
        conn, f"{by_status} NOT IN {sql_in(NOT_A_FORK)}"
    )
    wrong = conn.execute(
        f"SELECT operation_id FROM fork_operations WHERE stage IS NOT {STAGE_RULE_SQL}"
    )
    assert wrong.fetchall() == []


def test_the_check_is_the_domain_s_rule() -> None:
    """The migration's CHECK (written out) is `STAGE_RULE_SQL`, which is `stage_of`."""
    assert STAGE_COLUMN[1].endswith(f"CHECK (stage = {STAGE_RULE_SQL})")
    conn = apsw.Connection(":memory:")
    for status in ForkStatus:
        (got,) = conn.execute(
            f"SELECT {STAGE_RULE_SQL} FROM (SELECT ? AS status)", (status.value,)
        ).fetchone()
        assert got == stage_of(status), status


def test_every_status_and_every_transition_select_what_the_status_selects(
    tmp_path: Path,
) -> None:
    conn = operations_only(tmp_path / "store.sqlite3")
    for n, status in enumerate(ForkStatus):
        bare_operation(conn, n, status.value, ws=WS, source=SRC, turn_id=f"t{n}")
        _refused(conn, f"op-{n}", status)
    _agree(conn)
    assert (
        len(_ids(conn, f"SELECT operation_id FROM fork_operations WHERE {STAGE_ACTIVE_SQL}")) == 3
    )
    moves = 0
    for n, status in enumerate(ForkStatus):
        for to in TRANSITIONS[status]:
            conn.execute("SAVEPOINT move")
            _refused(conn, f"op-{n}", to)  # every other stage: refused
            conn.execute(
                "UPDATE fork_operations SET status = ?, barrier = ?, stage = ?"
                " WHERE operation_id = ?",
                (to.value, int(holds_barrier(to, False)), stage_of(to), f"op-{n}"),
            )
            _agree(conn)
            conn.execute("ROLLBACK TO move")
            conn.execute("RELEASE move")
            moves += 1
    assert moves == sum(len(t) for t in TRANSITIONS.values())
    # A move that crosses a stage's edge without naming the stage is refused.
    with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed: stage"):
        conn.execute(
            "UPDATE fork_operations SET status = 'committed', barrier = 1 WHERE status = ?",
            (ForkStatus.PROVIDER_ACCEPTED.value,),
        )
    conn.close()


def _refused(conn: apsw.Connection, op_id: str, status: ForkStatus) -> None:
    """Every stage that is not `status`'s: the CHECK refuses it, as an INSERT and as an
    UPDATE; the row is left as it was."""
    row = conn.execute("SELECT * FROM fork_operations WHERE operation_id = ?", (op_id,)).fetchall()
    flag = int(holds_barrier(status, False))
    for wrong in {0, 1, 2} - {stage_of(status)}:
        with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed: stage"):
            conn.execute(
                "UPDATE fork_operations SET status = ?, barrier = ?, stage = ?"
                " WHERE operation_id = ?",
                (status.value, flag, wrong, op_id),
            )
        with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed: stage"):
            conn.execute(
                "INSERT INTO fork_operations (workspace_id, operation_id, request_id,"
                " request_hash, source_session_id, target_session_id, source_turn_id,"
                " source_provider_session_id, source_provider_turn_id, source_provider_turn_ids,"
                " target_title, driver_kind, driver_version, binding_mode, snapshot_hash,"
                " status, created_at_ms, barrier, stage) VALUES (?, 'x', 'x', 'h', ?, 'c', 't',"
                " 'p', 'pt', '[]', 't', 'd', '1', 'host_copy', 's', ?, 0, ?, ?)",
                (WS, SRC, status.value, flag, wrong),
            )
    after = conn.execute("SELECT * FROM fork_operations WHERE operation_id = ?", (op_id,))
    assert after.fetchall() == row


def _stage(store: Store, op_id: str) -> int:
    row = (
        store.db.connection()
        .execute(
            f"SELECT stage, {STAGE_RULE_SQL} FROM fork_operations WHERE operation_id = ?", (op_id,)
        )
        .fetchone()
    )
    assert row is not None and row[0] == row[1], (op_id, row)
    return int(row[0])


def test_the_store_s_own_steps_set_the_stage(tmp_path: Path) -> None:
    """The saga's steps, its `failed` and `unknown`, `fork.resolve`'s adopt and abandon and
    recovery's set-based settle: each store statement sets the stage the CHECK wants (a path
    that forgot it fails), and the fence and the title follow it."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sid = new_session(store, title="Trip")
        last = settled_turn(store, sid, text="one", provider_turn_id="p1").turn_id
        op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
        assert op.target_title == "Trip (2)"
        assert _stage(store, op.operation_id) == 2
        run_to_commit(store, op)
        assert _stage(store, op.operation_id) == 1
        store.fork_transitions.acknowledge_fork(WS, op.operation_id)
        assert _stage(store, op.operation_id) == 1
        # failed from dispatching: 0, the title's number not used up.
        doomed, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
        assert doomed.target_title == "Trip (3)"
        store.fork_transitions.mark_fork_dispatching(WS, doomed.operation_id)
        assert _stage(store, doomed.operation_id) == 2
        store.fork_transitions.mark_fork_failed(WS, doomed.operation_id, "boom")
        assert _stage(store, doomed.operation_id) == 0
        # unknown: 1 (still a fork: the next title counts it), then adopted: 2, committed: 1.
        lost, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
        assert lost.target_title == "Trip (3)"
        store.fork_transitions.mark_fork_dispatching(WS, lost.operation_id)
        store.fork_transitions.mark_fork_unknown(WS, lost.operation_id, "no answer")
        assert _stage(store, lost.operation_id) == 1
        store.resolution.begin_resolution(
            WS,
            lost.operation_id,
            request_id=str(uuid.uuid4()),
            action="adopt",
            child_id=f"child-{lost.operation_id}",
            evidence={"verdict": "adoptable"},
        )
        lost_now = store.fork_queries.get_fork_operation(WS, lost.operation_id)
        store.resolution.adopt_unknown_fork(WS, lost.operation_id, evidence(lost_now))
        assert _stage(store, lost.operation_id) == 2
        store.fork_commit.commit_fork(WS, lost.operation_id)
        assert _stage(store, lost.operation_id) == 1
        store.fork_transitions.acknowledge_fork(WS, lost.operation_id)  # frees the boundary
        # unknown, abandoned: 0.
        gone, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
        assert gone.target_title == "Trip (4)"
        store.fork_transitions.mark_fork_dispatching(WS, gone.operation_id)
        store.fork_transitions.mark_fork_unknown(WS, gone.operation_id, "no answer")
        store.resolution.begin_resolution(
            WS,
            gone.operation_id,
            request_id=str(uuid.uuid4()),
            action="abandon",
            child_id=None,
            evidence={"verdict": "absent"},
        )
        store.resolution.abandon_fork(WS, gone.operation_id, {"action": "abandon"})
        assert _stage(store, gone.operation_id) == 0
    finally:
        store.close()


def test_recovery_s_set_based_settle_sets_the_stage(tmp_path: Path) -> None:
    """`prepared` → failed (0) and `dispatching` → unknown (1) in one UPDATE per status, each
    through the barrier's index; `provider_accepted` stays 2 until its commit."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        ops = []
        for i in range(3):
            sid = new_session(store, title=f"S{i}")
            last = settled_turn(store, sid, text="one", provider_turn_id=f"p{i}").turn_id
            op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
            ops.append(op)
        store.fork_transitions.mark_fork_dispatching(WS, ops[1].operation_id)
        store.fork_transitions.mark_fork_dispatching(WS, ops[2].operation_id)
        store.fork_transitions.mark_fork_provider_accepted(
            WS, ops[2].operation_id, evidence(ops[2])
        )
        assert store.fork_recovery.settle_leftover_fork_statuses(
            prepared_error="restart", dispatching_error="restart"
        ) == (1, 1)
        assert [_stage(store, op.operation_id) for op in ops] == [0, 1, 2]
        (leftover,) = store.fork_recovery.leftover_commits()
        assert leftover.operation_id == ops[2].operation_id
    finally:
        store.close()


_READERS = {
    # The fence probe (`check_fence`) and the snapshot's boundary check: a seek on the stage.
    "fence": (
        f"SELECT operation_id FROM fork_operations WHERE workspace_id = ?"
        f" AND source_session_id = ? AND {STAGE_ACTIVE_SQL} LIMIT 1",
        r"USING INDEX fork_operations_by_source \(workspace_id=\? AND source_session_id=\?"
        r" AND stage=\?\)",
    ),
    "boundary": (
        f"SELECT 1 FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
        f" AND {STAGE_ACTIVE_SQL} LIMIT 1",
        r"COVERING INDEX fork_operations_by_source \(workspace_id=\? AND source_session_id=\?"
        r" AND stage=\?\)",
    ),
    # The child title's count: covering, a range of the stage.
    "title": (
        "SELECT COUNT(*) FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
        f" AND {STAGE_A_FORK_SQL}",
        r"COVERING INDEX fork_operations_by_source \(workspace_id=\? AND source_session_id=\?"
        r" AND stage>\?\)",
    ),
    "prefixes": (
        "SELECT source_provider_turn_ids FROM fork_operations WHERE workspace_id = ?"
        f" AND source_session_id = ? AND operation_id != ? AND {STAGE_A_FORK_SQL}",
        r"INDEX fork_operations_by_source \(workspace_id=\? AND source_session_id=\?"
        r" AND stage>\?\)",
    ),
    # The checkpoint guard and the delete's `unknown` check: the barrier's few holders.
    "checkpoint": (
        "UPDATE turns SET checkpoint_json = ? WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ? AND checkpoint_json = ? AND NOT EXISTS (SELECT 1 FROM"
        " fork_operations f WHERE f.workspace_id = ? AND f.source_session_id = ?"
        " AND f.source_turn_id = ? AND f.barrier = 1 AND f.status <> 'committed')",
        r"INDEX fork_operations_barrier_held \(workspace_id=\? AND source_session_id=\?"
        r" AND source_turn_id=\?\)",
    ),
    "delete": (
        "SELECT operation_id FROM fork_operations INDEXED BY fork_operations_barrier_held"
        " WHERE workspace_id = ? AND source_session_id = ? AND barrier = 1"
        " AND status = 'unknown' ORDER BY op_seq",
        r"INDEX fork_operations_barrier_held \(workspace_id=\? AND source_session_id=\?\)",
    ),
}


_IN_STORE = {
    "fence": ("storage/sqlite.py", "AND source_session_id = ? AND {STAGE_ACTIVE_SQL} LIMIT 1"),
    # (one `EXISTS` of `source_blockers`' one statement, its parameters numbered)
    "boundary": ("storage/fork_snapshot.py", "AND source_session_id = ?2 AND {STAGE_ACTIVE_SQL}"),
    "title": ("storage/fork_prepare.py", "source_session_id = ? AND {STAGE_A_FORK_SQL}"),
    "prefixes": ("storage/fork_resolution.py", "operation_id != ? AND {STAGE_A_FORK_SQL}"),
    "checkpoint": ("storage/turns.py", _READERS["checkpoint"][0]),
    "delete": ("storage/sessions.py", _READERS["delete"][0]),
}
"""Where each reader lives and the part of its text the plan above is of."""


@pytest.mark.parametrize("analyzed", [False, True])
@pytest.mark.parametrize("name", sorted(_READERS))
def test_every_reader_of_a_source_s_operations_searches_an_index(
    tmp_path: Path, name: str, analyzed: bool
) -> None:
    """The readers v23 rewrote (their text as the store has it: `storage/sqlite.py`,
    `fork_snapshot.py`, `fork_prepare.py`, `fork_resolution.py`, `turns.py`, `sessions.py`),
    planned on a store of 300 operations of one source, also after `ANALYZE`."""
    sql, wanted = _READERS[name]
    where, fragment = _IN_STORE[name]
    text = (Path(__file__).parents[2] / where).read_text()
    assert fragment in re.sub(r'"\s+f?"', "", text), name  # the store's adjacent literals
    conn = operations_only(tmp_path / "store.sqlite3")
    statuses = list(ForkStatus)
    for n in range(300):
        status = statuses[n % len(statuses)] if n % 10 == 0 else ForkStatus.COMMITTED
        bare_operation(conn, n, status.value, 1, ws=WS, source=SRC, turn_id=f"t{n % 7}")
    if analyzed:
        conn.execute("ANALYZE")
    plan = " / ".join(
        str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, [None] * sql.count("?"))
    )
    assert re.search(wanted, plan), plan
    assert "SCAN fork_operations" not in plan and "SCAN f" not in plan, plan
    conn.close()


def test_a_v22_store_migrates_keeping_every_row(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    conn = operations_only(path, 22)
    n = 0
    for status in ForkStatus:
        for observed in (None, 5):
            for turn in ("t1", "t2"):
                bare_operation(conn, n, status.value, observed, ws=WS, source=SRC, turn_id=turn)
                n += 1
    fresh = apsw.Connection(":memory:")
    migrate(fresh, 22)
    shape = "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY 1, 2"
    assert conn.execute(shape).fetchall() == fresh.execute(shape).fetchall(), "a v22 store"
    before = conn.execute("SELECT * FROM fork_operations ORDER BY op_seq").fetchall()
    statuses = [
        ForkStatus(str(r[0]))
        for r in conn.execute("SELECT status FROM fork_operations ORDER BY op_seq")
    ]
    assert migrate(conn) == 22 and user_version(conn) == SCHEMA_VERSION
    after = conn.execute("SELECT * FROM fork_operations ORDER BY op_seq").fetchall()
    width = len(before[0])  # every row, every column; the stage (and later columns) appended
    assert [r[:width] for r in after] == before
    stages = [r[0] for r in conn.execute("SELECT stage FROM fork_operations ORDER BY op_seq")]
    assert stages == [stage_of(s) for s in statuses]
    _agree(conn)
    current = apsw.Connection(":memory:")
    migrate(current)
    assert conn.execute(shape).fetchall() == current.execute(shape).fetchall(), "as made fresh"
    conn.close()
