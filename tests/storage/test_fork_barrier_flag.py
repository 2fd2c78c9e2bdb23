"""Schema v22: the barrier's set as a flag. `fork_operations.barrier` is 1 exactly where the
barrier rule holds (`domain.fork_states.BARRIER_RULE_SQL`, v21's partial index's WHERE) — its
CHECK refuses any other value — and the partial index `fork_operations_barrier_held` selects by
it, so a fork's status steps, which never set it, leave that index alone. Proven here over every
status, ACKed or not, and every transition of the state machine (and the ACK): the CHECK
accepts exactly the rule's flag, and the index then selects exactly the v21 rule's rows; the
store's own statements set it (a path that forgot would fail); a v21 store migrates with every
row and every barrier holder kept."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import request, run_to_commit
from test_v21_indexes import TO_V21

from domain.fork_states import (
    BARRIER_RULE_SQL,
    BARRIER_SQL,
    TRANSITIONS,
    ForkStatus,
    holds_barrier,
    stage_of,
)
from storage.fork_prepare import barrier_holder
from storage.schema import SCHEMA_VERSION, migrate, user_version
from storage.store import Store
from tests.storage.store_builders import bare_operation, operations_only

SRC = "src"
ACKS = (None, 5)


def _selected(conn: apsw.Connection, where: str) -> set[str]:
    return {str(r[0]) for r in conn.execute(f"SELECT operation_id FROM fork_operations {where}")}


def _agree(conn: apsw.Connection) -> None:
    """The flag's set is the v21 rule's, through the index and row by row."""
    by_index = _selected(
        conn,
        f"INDEXED BY fork_operations_barrier_held WHERE {BARRIER_SQL} AND workspace_id = '{WS}'",
    )
    by_rule = _selected(conn, f"NOT INDEXED WHERE {BARRIER_RULE_SQL}")
    assert by_index == by_rule
    wrong = conn.execute(
        f"SELECT operation_id FROM fork_operations WHERE barrier IS NOT {BARRIER_RULE_SQL}"
    )
    assert wrong.fetchall() == []


def test_every_status_and_every_transition_select_what_the_v21_rule_selects(
    tmp_path: Path,
) -> None:
    conn = operations_only(tmp_path / "store.sqlite3")
    rows: list[tuple[int, ForkStatus, int | None]] = []
    for status in ForkStatus:
        for observed in ACKS:
            n = len(rows)
            bare_operation(conn, n, status.value, observed, ws=WS, source=SRC, turn_id="t")
            rows.append((n, status, observed))
            _refused(conn, f"op-{n}", status.value, observed)
    _agree(conn)
    # 4 statuses ACKed or not, and the committed un-ACKed one.
    assert len(_selected(conn, f"WHERE {BARRIER_SQL}")) == 9
    moves = 0
    for n, status, observed in rows:
        targets = [(to, observed) for to in TRANSITIONS[status]]
        targets.append((status, None if observed else 7))  # the ACK (or its undoing)
        for to, seen in targets:
            flag = int(holds_barrier(to, seen is not None))
            conn.execute("SAVEPOINT move")
            _refused(conn, f"op-{n}", to.value, seen)  # the other flag: refused
            conn.execute(
                "UPDATE fork_operations SET status = ?, client_observed_at_ms = ?, barrier = ?,"
                " stage = ? WHERE operation_id = ?",
                (to.value, seen, flag, stage_of(to), f"op-{n}"),
            )
            _agree(conn)
            conn.execute("ROLLBACK TO move")
            conn.execute("RELEASE move")
            moves += 1
    assert moves == sum(len(TRANSITIONS[s]) + 1 for s in ForkStatus) * len(ACKS)
    _agree(conn)
    conn.close()


def _refused(conn: apsw.Connection, op_id: str, status: str, observed: int | None) -> None:
    """The flag that is not the rule's, for `status` and `observed`: the CHECK refuses it, as
    an INSERT and as an UPDATE; the row is left as it was."""
    wrong = 1 - int(holds_barrier(ForkStatus(status), observed is not None))
    before = conn.execute("SELECT * FROM fork_operations WHERE operation_id = ?", (op_id,))
    row = before.fetchall()
    with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed: barrier"):
        conn.execute(
            "UPDATE fork_operations SET status = ?, client_observed_at_ms = ?, barrier = ?,"
            " stage = ? WHERE operation_id = ?",
            (status, observed, wrong, stage_of(ForkStatus(status)), op_id),
        )
    with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed: barrier"):
        conn.execute(
            "INSERT INTO fork_operations (workspace_id, operation_id, request_id, request_hash,"
            " source_session_id, target_session_id, source_turn_id, source_provider_session_id,"
            " source_provider_turn_id, source_provider_turn_ids, target_title, driver_kind,"
            " driver_version, binding_mode, snapshot_hash, status,"
            " created_at_ms, client_observed_at_ms, barrier, stage) VALUES (?, 'x', 'x', 'h',"
            " ?, 'c', 't', 'p', 'pt', '[]', 't', 'd', '1', 'host_copy', 's', ?, 0, ?, ?, ?)",
            (WS, SRC, status, observed, wrong, stage_of(ForkStatus(status))),
        )
    after = conn.execute("SELECT * FROM fork_operations WHERE operation_id = ?", (op_id,))
    assert after.fetchall() == row


def test_the_store_s_own_steps_set_the_flag(tmp_path: Path) -> None:
    """The saga's steps (prepare, dispatching, accepted, committed, ACK) and its `failed`: the
    store's statements set the flag the CHECK wants (a path that forgot it would fail)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sid = new_session(store)
        last = settled_turn(store, sid, text="one", provider_turn_id="p1").turn_id
        op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
        _agree_store(store, op.operation_id, 1)
        run_to_commit(store, op)
        _agree_store(store, op.operation_id, 1)
        store.fork_transitions.acknowledge_fork(WS, op.operation_id)
        _agree_store(store, op.operation_id, 0)
        doomed, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
        store.fork_transitions.mark_fork_dispatching(WS, doomed.operation_id)
        _agree_store(store, doomed.operation_id, 1)
        store.fork_transitions.mark_fork_failed(WS, doomed.operation_id, "boom")
        _agree_store(store, doomed.operation_id, 0)
    finally:
        store.close()


def _agree_store(store: Store, op_id: str, flag: int) -> None:
    conn = store.db.connection()
    row = conn.execute(
        f"SELECT barrier, {BARRIER_RULE_SQL} FROM fork_operations WHERE operation_id = ?",
        (op_id,),
    ).fetchone()
    assert row == (flag, flag), (op_id, row)


def test_a_v21_store_migrates_keeping_every_row_and_every_holder(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    conn = operations_only(path, 22)  # (TO_V21 undoes v22 only)
    n = 0
    for status in ForkStatus:
        for observed in ACKS:
            for turn in ("t1", "t2"):
                bare_operation(conn, n, status.value, observed, ws=WS, source=SRC, turn_id=turn)
                n += 1
    conn.execute(TO_V21)
    fresh = apsw.Connection(":memory:")
    migrate(fresh, 21)
    shape = "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY 1, 2"
    assert conn.execute(shape).fetchall() == fresh.execute(shape).fetchall(), "a v21 store"
    before = conn.execute("SELECT * FROM fork_operations ORDER BY op_seq").fetchall()
    # The first holder of each boundary as v21 answers it: the rule over the status.
    v21_holder = (
        "SELECT operation_id FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
        f" AND source_turn_id = ? AND {BARRIER_RULE_SQL} ORDER BY op_seq LIMIT 1"
    )
    holders = {t: conn.execute(v21_holder, (WS, SRC, t)).fetchall() for t in ("t1", "t2", "t3")}
    assert [len(h) for h in holders.values()] == [1, 1, 0]
    held = _selected(conn, f"WHERE {BARRIER_RULE_SQL}")
    assert migrate(conn) == 21 and user_version(conn) == SCHEMA_VERSION
    after = conn.execute("SELECT * FROM fork_operations ORDER BY op_seq").fetchall()
    width = len(before[0])  # the flag appended (and v23's stage after it)
    assert [r[:width] for r in after] == before  # every row, every column
    assert {str(r[2]) for r in after if r[width] == 1} == held  # column 2: the operation's id
    _agree(conn)
    for t, h in holders.items():  # the store's lookup, through the flag's index
        found = barrier_holder(conn, WS, SRC, t)
        assert (found is None and not h) or [(found[1],)] == h, (t, found, h)
    current = apsw.Connection(":memory:")
    migrate(current)
    assert conn.execute(shape).fetchall() == current.execute(shape).fetchall(), "as made fresh"
    conn.close()
