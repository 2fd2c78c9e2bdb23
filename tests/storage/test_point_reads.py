"""The read path's own connection: `ReadView` point reads see every committed write
at once (read-your-writes), hold no snapshot between reads, can never write, and agree with
the `Store`'s reads field for field; a committed operation's child projection is built once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request

from domain.errors import ForkOperationNotFound, SessionNotFound
from domain.fork_states import ForkStatus
from storage.base import ReadView
from storage.store import Store

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def view(store: Store, store_path: Path) -> Iterator[ReadView]:
    v = ReadView(str(store_path), projections=store.db.projections)
    yield v
    v.close()


def test_a_read_after_a_committed_write_sees_it(store: Store, view: ReadView) -> None:
    sid = new_session(store, title="first")
    assert view.get_session(WS, sid).title == "first"
    assert not view.in_transaction  # no snapshot kept between two reads
    for i in range(20):
        store.sessions.update_title(WS, sid, f"title {i}")
        assert view.get_session(WS, sid).title == f"title {i}"
        assert not view.in_transaction
    store.sessions.delete_session(WS, sid)
    with pytest.raises(SessionNotFound):
        view.get_session(WS, sid)


def test_session_exists_agrees_with_get_session(store: Store, view: ReadView) -> None:
    """What routing a request to its Session actor asks: live → True; deleted,
    unknown, or another workspace's → False, exactly where `get_session` is not found."""
    sid = new_session(store)
    assert view.session_exists(WS, sid) and view.get_session(WS, sid).session_id == sid
    assert not view.session_exists("ws-other", sid)
    assert not view.session_exists(WS, str(uuid.uuid4()))
    store.sessions.delete_session(WS, sid)
    assert not view.session_exists(WS, sid)
    with pytest.raises(SessionNotFound):
        view.get_session(WS, sid)
    assert not view.in_transaction


def test_the_read_connection_cannot_write(store: Store, view: ReadView) -> None:
    sid = new_session(store)
    view.get_session(WS, sid)
    conn = view._connection()
    with pytest.raises(apsw.ReadOnlyError):
        conn.execute("UPDATE sessions SET title = 'x' WHERE session_id = ?", (sid,))
    assert store.sessions.get_session(WS, sid).title == "Task"


def test_a_read_does_not_wait_for_an_open_write(store: Store, view: ReadView) -> None:
    """A write transaction held open (the writer mid-commit) does not block the point read,
    which sees the state committed before it."""
    sid = new_session(store, title="before")
    writer = apsw.Connection(store.path)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE sessions SET title = 'uncommitted' WHERE session_id = ?", (sid,))
    try:
        assert view.get_session(WS, sid).title == "before"
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_point_reads_equal_the_stores_including_lineage(store: Store, view: ReadView) -> None:
    sid = new_session(store)
    turns = [settled_turn(store, sid, text=f"t{i}", provider_turn_id=f"p{i}") for i in (1, 2)]
    busy = new_session(store)
    active, _ = store.turns.claim_submit(WS, busy, str(uuid.uuid4()), "still running")
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1].turn_id))
    assert view.get_fork_operation(WS, op.operation_id) == store.fork_queries.get_fork_operation(
        WS, op.operation_id
    )
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    assert committed.status is ForkStatus.COMMITTED
    got = view.get_fork_operation(WS, op.operation_id)
    assert got == store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert got.committed_session is not None and got.lineage is not None
    # A Session with an active Turn, the source and the child (a lineage) read the same.
    running = view.get_session(WS, busy)
    assert (
        running == store.sessions.get_session(WS, busy) and running.active_turn_id == active.turn_id
    )
    assert view.get_session(WS, sid) == store.sessions.get_session(WS, sid)
    child = view.get_session(WS, op.target_session_id)
    assert child == store.sessions.get_session(WS, op.target_session_id)
    assert child.lineage is not None and child.lineage.operation_id == op.operation_id
    assert child.lineage.source_turn_id == turns[1].turn_id
    with pytest.raises(ForkOperationNotFound):
        view.get_fork_operation(WS, "no-such-operation")


def test_a_committed_projection_is_built_once(store: Store, view: ReadView) -> None:
    sid = new_session(store)
    turn = settled_turn(store, sid, provider_turn_id="p1")
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn.turn_id))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    store.fork_commit.commit_fork(WS, op.operation_id)
    first = view.get_fork_operation(WS, op.operation_id)
    misses = store.db.projections.misses
    for _ in range(5):
        again = view.get_fork_operation(WS, op.operation_id)
        assert again == first
        assert store.fork_queries.get_fork_operation(WS, op.operation_id) == first
    assert store.db.projections.misses == misses  # no snapshot re-read, re-hashed, re-parsed


def test_the_generation_changes_with_every_commit_by_anyone_and_only_then(
    store: Store, view: ReadView, store_path: Path
) -> None:
    """`generation()` stamps what the view read (the daemon's reply cache): unchanged while
    nothing is committed (reads, a rolled-back write), changed by each commit of the store's
    writer or of another connection."""
    sid = new_session(store, title="first")
    g0 = view.generation()
    view.get_session(WS, sid)
    assert view.generation() == g0
    store.sessions.update_title(WS, sid, "second")
    g1 = view.generation()
    assert g1 != g0
    other = apsw.Connection(str(store_path))
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE sessions SET title = 'never' WHERE session_id = ?", (sid,))
        assert view.generation() == g1  # not committed: nothing changed for a reader
        other.execute("ROLLBACK")
        assert view.generation() == g1
        other.execute("UPDATE sessions SET title = 'third' WHERE session_id = ?", (sid,))
        assert view.generation() != g1
    finally:
        other.close()
    assert not view.in_transaction
