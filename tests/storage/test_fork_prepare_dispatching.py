"""A warm fork's prepare is its dispatching marker (docs/design/fork-saga.md): `prepare_fork(
dispatching=True)` writes the operation at `dispatching` in the prepare's own fsync'd
transaction — one transaction and its statements where the lazy `prepared` and the `dispatching`
UPDATE were two — with every row and law of a prepare followed by `dispatching`: the fence, the
reservation, the snapshot, the barrier, the stage, the step times in order, recovery's view
(`dispatching` → `unknown`, never re-sent), and the invariant checker's store laws."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import request, run_to_commit_from_dispatching

from actors.recovery import apply_restart_rule
from domain.fork_states import ForkStatus
from storage.models import ChangeEvent, ForkOperationChanged
from storage.store import Store
from tests.support.invariants import STORE_LAWS, check_invariants

pytestmark = pytest.mark.timeout(60)


class Statements:
    """Statements the store's writer runs while `on` (BEGIN and COMMIT included)."""

    def __init__(self) -> None:
        self.on = False
        self.texts: list[str] = []

    def hook(self, conn: apsw.Connection) -> None:
        conn.exec_trace = self._exec

    def _exec(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if self.on:
            self.texts.append(" ".join(sql.split())[:40])
        return True


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def counted(home: Path) -> Iterator[tuple[Store, Statements]]:
    counter = Statements()
    apsw.connection_hooks.append(counter.hook)
    home.mkdir()
    try:
        store = Store.open(home / "store.sqlite3")
        try:
            yield store, counter
        finally:
            store.close()
    finally:
        apsw.connection_hooks.remove(counter.hook)


def _source(store: Store) -> tuple[str, str]:
    sid = new_session(store, title="src")
    last = ""
    for i in range(3):
        last = settled_turn(store, sid, text=f"t{i}", provider_turn_id=f"p{i}").turn_id
    return sid, last


def _steps(store: Store, counter: Statements, *, folded: bool) -> tuple[list[str], int, int, int]:
    """A fork of a fresh source's last Turn to `dispatching`, as the saga's warm path writes it
    (folded) or as it did (a lazy prepare, then the guarded UPDATE): the statements, and the
    transactions, fsync'd and lazy COMMITs."""
    sid, last = _source(store)
    req = request(sid, last, target=str(uuid.uuid4()))
    before = store.db.write_stats.snapshot()
    counter.texts.clear()
    counter.on = True
    try:
        op, created = store.fork_prepare.prepare_fork(WS, req, durable=folded, dispatching=folded)
        assert created
        if not folded:
            op, _ = store.fork_transitions.mark_fork_dispatching(WS, op.operation_id, known=op)
    finally:
        counter.on = False
    after = store.db.write_stats.snapshot()
    assert op.status is ForkStatus.DISPATCHING
    return (
        list(counter.texts),
        after["transactions"] - before["transactions"],
        after["commits"] - before["commits"],
        after["lazy_commits"] - before["lazy_commits"],
    )


def test_a_prepare_at_dispatching_is_one_fsynced_transaction_and_three_statements_fewer(
    counted: tuple[Store, Statements],
) -> None:
    store, counter = counted
    _steps(store, counter, folded=True)  # warm: the statement cache and the b-trees' pages
    _steps(store, counter, folded=False)
    folded, f_tx, f_commits, f_lazy = _steps(store, counter, folded=True)
    split, s_tx, s_commits, s_lazy = _steps(store, counter, folded=False)
    assert (f_tx, f_commits, f_lazy) == (1, 1, 0)
    assert (s_tx, s_commits, s_lazy) == (2, 1, 1)
    # The dispatching step's BEGIN IMMEDIATE, UPDATE and COMMIT are gone; the prepare's own
    # statements are the same texts (the INSERT names the status and dispatched_at_ms).
    assert len(split) - len(folded) == 3, (split, folded)
    assert not any(t.startswith("UPDATE fork_operations") for t in folded), folded
    assert sum(t.startswith("UPDATE fork_operations") for t in split) == 1, split


def test_a_prepare_at_dispatching_writes_what_prepare_then_dispatching_wrote(
    counted: tuple[Store, Statements],
) -> None:
    store, _ = counted
    sid, last = _source(store)
    events: list[ChangeEvent] = []
    unsubscribe = store.db.subscribe(events.append)
    try:
        op, created = store.fork_prepare.prepare_fork(
            WS, request(sid, last, target=str(uuid.uuid4())), dispatching=True
        )
    finally:
        unsubscribe()
    assert created and op.status is ForkStatus.DISPATCHING
    assert op.dispatched_at_ms == op.created_at_ms  # one transaction's time
    read = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert read.status is ForkStatus.DISPATCHING
    assert (read.created_at_ms, read.dispatched_at_ms) == (op.created_at_ms, op.dispatched_at_ms)
    conn = store.db.connection()
    stage, barrier = conn.execute(
        "SELECT stage, barrier FROM fork_operations WHERE operation_id = ?", (op.operation_id,)
    ).fetchone()
    assert (stage, barrier) == (2, 1)  # active, holding the boundary
    (reserved,) = conn.execute(
        "SELECT operation_id FROM session_reservations WHERE workspace_id = ? AND session_id = ?",
        (WS, op.target_session_id),
    ).fetchone()
    assert reserved == op.operation_id
    # Its change carries the row as written (the events thread reads none back); the source's
    # row is not written (its fence is this row and `history_fences`): no change of it.
    (changed,) = [e for e in events if isinstance(e, ForkOperationChanged)]
    assert changed.row is not None and changed.row.status is ForkStatus.DISPATCHING
    assert [type(e) for e in events] == [ForkOperationChanged]
    # A replay answers the original and writes nothing.
    again, created = store.fork_prepare.prepare_fork(
        WS,
        request(sid, last, target=op.target_session_id, request_id=op.request_id),
        dispatching=True,
    )
    assert not created and again.operation_id == op.operation_id
    # Recovery's view: `dispatching` without a saga is `unknown`, never re-sent.
    recovered = apply_restart_rule(store, read)
    assert recovered.status is ForkStatus.UNKNOWN


def test_a_prepare_at_dispatching_is_only_durable_and_only_for_a_shared_fork(
    counted: tuple[Store, Statements],
) -> None:
    store, _ = counted
    sid, last = _source(store)
    with pytest.raises(ValueError):
        store.fork_prepare.prepare_fork(
            WS, request(sid, last, target=str(uuid.uuid4())), durable=False, dispatching=True
        )
    with pytest.raises(ValueError):
        store.fork_prepare.prepare_fork(
            WS,
            replace(request(sid, last, target=str(uuid.uuid4())), workspace="worktree"),
            dispatching=True,
        )
    assert store.db.connection().execute("SELECT COUNT(*) FROM fork_operations").fetchone() == (0,)


def test_the_store_laws_hold_over_forks_prepared_at_dispatching(
    counted: tuple[Store, Statements], home: Path
) -> None:
    """Committed, ACKed, and left at `dispatching` (a killed host's view): the invariant
    checker's store laws (step order, reservations, barrier, stage, single active) hold."""
    store, _ = counted
    sid, last = _source(store)
    first, _ = store.fork_prepare.prepare_fork(
        WS, request(sid, last, target=str(uuid.uuid4())), dispatching=True
    )
    run_to_commit_from_dispatching(store, first)
    store.fork_transitions.acknowledge_fork(WS, first.operation_id)
    other, other_last = _source(store)
    store.fork_prepare.prepare_fork(
        WS, request(other, other_last, target=str(uuid.uuid4())), dispatching=True
    )
    report = check_invariants(home, probe_fence=False)
    broken = [v for v in report.violations if v.law in STORE_LAWS]
    assert not broken, broken
