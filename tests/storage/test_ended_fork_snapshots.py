"""A fork that ended without a child (`failed`, `abandoned`) keeps no frozen snapshot: the
document prepare froze (the source's history through the boundary: ~150 bytes a Turn, more
with its Messages' ids) is read only by a commit and by a committed child's projection, and
neither can happen to an operation in a terminal status without a child. It went on being kept
for good, so a store grew by a whole boundary's document with every fork the provider refused,
every `prepared` a restart failed and every `abandoned` one. Each store step that ends an
operation so drops its snapshot in its own transaction (schema v27, a trigger on the stage's
0), and the migration drops those a store already holds; every other operation keeps its own."""

from __future__ import annotations

import uuid
from pathlib import Path

import apsw
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request, run_to_commit

from domain.fork_states import ForkStatus
from storage.models import ForkOperation
from storage.schema import SCHEMA_VERSION, migrate, user_version
from storage.sqlite import open_connection
from storage.store import Store


def _kept(store: Store) -> dict[str, str]:
    """Each operation that has a snapshot row: operation id → status."""
    rows = store.db.connection().execute(
        "SELECT o.operation_id, o.status FROM fork_operations o JOIN fork_snapshots s"
        " USING (op_seq)"
    )
    return {str(op_id): str(status) for op_id, status in rows}


def _forks(store: Store, n: int) -> list[ForkOperation]:
    """`n` prepared operations, each through its own Session's settled Turn."""
    ops = []
    for i in range(n):
        sid = new_session(store, title=f"S{i}")
        last = settled_turn(store, sid, text="one", provider_turn_id=f"p{i}").turn_id
        ops.append(store.fork_prepare.prepare_fork(WS, request(sid, last))[0])
    return ops


def _abandon(store: Store, op: ForkOperation) -> None:
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_unknown(WS, op.operation_id, "no answer")
    store.resolution.begin_resolution(
        WS,
        op.operation_id,
        request_id=str(uuid.uuid4()),
        action="abandon",
        child_id=None,
        evidence={"verdict": "absent"},
    )
    store.resolution.abandon_fork(WS, op.operation_id, {"action": "abandon"})


def test_a_fork_that_ends_without_a_child_drops_its_snapshot(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        committed, refused, gone, lost, accepted, prepared = _forks(store, 6)
        assert len(_kept(store)) == 6
        run_to_commit(store, committed)
        store.fork_transitions.mark_fork_dispatching(WS, refused.operation_id)
        store.fork_transitions.mark_fork_failed(WS, refused.operation_id, "refused")
        _abandon(store, gone)
        store.fork_transitions.mark_fork_dispatching(WS, lost.operation_id)
        store.fork_transitions.mark_fork_unknown(WS, lost.operation_id, "no answer")
        store.fork_transitions.mark_fork_dispatching(WS, accepted.operation_id)
        store.fork_transitions.mark_fork_provider_accepted(
            WS, accepted.operation_id, evidence(accepted)
        )
        assert _kept(store) == {
            committed.operation_id: "committed",
            lost.operation_id: "unknown",
            accepted.operation_id: "provider_accepted",
            prepared.operation_id: "prepared",
        }
        # A restart's settle fails the `prepared` one: its snapshot goes in that transaction.
        assert store.fork_recovery.settle_leftover_fork_statuses(
            prepared_error="restart", dispatching_error="restart"
        ) == (1, 0)
        assert set(_kept(store)) == {
            committed.operation_id,
            lost.operation_id,
            accepted.operation_id,
        }
        # What is kept is still read: the accepted one commits, the committed child projects,
        # and an ended one still answers `fork.get` (no snapshot is read for it).
        store.fork_commit.commit_fork(WS, accepted.operation_id)
        got = store.fork_queries.get_fork_operation(WS, committed.operation_id)
        assert got.committed_session is not None
        for op, status in ((refused, ForkStatus.FAILED), (gone, ForkStatus.ABANDONED)):
            assert store.fork_queries.get_fork_operation(WS, op.operation_id).status is status
        conn = store.db.connection()
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        store.close()


def test_the_migration_drops_the_snapshots_a_store_kept_for_ended_forks(tmp_path: Path) -> None:
    """A store the previous schema wrote, holding the snapshots of a failed and an abandoned
    fork beside a committed, an `unknown` and a `prepared` one's: the upgrade drops the two."""
    path = tmp_path / "store.sqlite3"
    raw = open_connection(str(path))
    migrate(raw, target=SCHEMA_VERSION - 1)
    raw.close()
    # The steps a previous build made, through the store's own code on the older schema.
    store = Store(path)
    try:
        committed, refused, gone, lost, prepared = _forks(store, 5)
        run_to_commit(store, committed)
        store.fork_transitions.mark_fork_failed(WS, refused.operation_id, "refused")
        _abandon(store, gone)
        store.fork_transitions.mark_fork_dispatching(WS, lost.operation_id)
        store.fork_transitions.mark_fork_unknown(WS, lost.operation_id, "no answer")
        assert len(_kept(store)) == 5
        assert user_version(store.db.connection()) == SCHEMA_VERSION - 1
    finally:
        store.close()
    store = Store.open(path)
    try:
        assert user_version(store.db.connection()) == SCHEMA_VERSION
        assert set(_kept(store)) == {
            committed.operation_id,
            lost.operation_id,
            prepared.operation_id,
        }
        got = store.fork_queries.get_fork_operation(WS, committed.operation_id)
        assert got.committed_session is not None
    finally:
        store.close()
    conn = apsw.Connection(str(path))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
