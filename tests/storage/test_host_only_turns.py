"""A Turn its provider never got (`host_only`, schema v24), on real SQLite files: marked by its
settlement, left out of a fork's provider prefix (so the Session stays forkable), copied into
the child still marked, never a fork's own boundary, never re-bound, never given a provider
turn id; a Turn left unbound without the mark still refuses the fork."""

from __future__ import annotations

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import _expect_boundary, request, run_to_commit

from storage.store import Store

pytestmark = pytest.mark.timeout(30)


def _failed_before_sent(store: Store, sid: str, text: str = "never sent") -> str:
    """What the Session actor writes for a Turn whose `turn.start` never left the host."""
    turn, _ = store.turns.claim_submit(WS, sid, f"r-{text}", text)
    assert store.turns.record_settlement(
        WS, sid, turn.turn_id, outcome="failed", error="worker unavailable", host_only=True
    )
    return turn.turn_id


def _host_only(store: Store, sid: str) -> list[int]:
    rows = store.db.connection().execute(
        "SELECT host_only FROM turns WHERE workspace_id = ? AND session_id = ? ORDER BY sequence",
        (WS, sid),
    )
    return [int(r[0]) for r in rows]


def test_a_turn_never_sent_is_left_out_of_the_provider_prefix_and_the_fork_commits(
    store: Store,
) -> None:
    sid = new_session(store)
    _failed_before_sent(store, sid)
    done = [settled_turn(store, sid, text=t, provider_turn_id=f"p-{t}").turn_id for t in "ab"]
    assert _host_only(store, sid) == [1, 0, 0]
    op, created = store.fork_prepare.prepare_fork(WS, request(sid, done[1]))
    assert created
    # The provider's thread holds exactly the bound Turns; the saga's frozen Turns line up.
    assert op.source_provider_turn_ids == ("p-a", "p-b")
    assert [t for t, _ in op.frozen_turns or ()] == done
    committed = run_to_commit(store, op)
    child = committed.target_session_id
    child_turns, _ = store.history.timeline(WS, child)
    # The child's canonical transcript copies all three, the first still host-only.
    assert [t.sequence for t in child_turns] == [1, 2, 3]
    assert [t.root_provider_turn_id for t in child_turns] == [None, "p-a", "p-b"]
    assert child_turns[0].outcome == "failed" and child_turns[0].error == "worker unavailable"
    assert _host_only(store, child) == [1, 0, 0]
    # ... so the child forks again through its last Turn, with the same provider prefix.
    again, _ = store.fork_prepare.prepare_fork(WS, request(child, child_turns[2].turn_id))
    assert again.source_provider_turn_ids == ("p-a", "p-b")
    run_to_commit(store, again)


def test_a_provider_owned_child_keeps_the_mark_on_its_copy(store: Store) -> None:
    sid = new_session(store)
    _failed_before_sent(store, sid)
    done = settled_turn(store, sid, text="a", provider_turn_id="p-a").turn_id
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, done, binding_mode="provider_owned"))
    assert op.source_provider_turn_ids == ("p-a",)
    committed = run_to_commit(store, op, turn_bindings={done: ("child-a", None)})
    child_turns, _ = store.history.timeline(WS, committed.target_session_id)
    assert [t.root_provider_turn_id for t in child_turns] == [None, "child-a"]
    assert _host_only(store, committed.target_session_id) == [1, 0]


def test_no_fork_goes_through_a_host_only_turn(store: Store) -> None:
    sid = new_session(store)
    settled_turn(store, sid, text="a", provider_turn_id="p-a")
    lost = _failed_before_sent(store, sid)
    # The provider has no Turn to fork at: through it (or latestSettled onto it) is refused.
    _expect_boundary(store, request(sid, lost), "provider_turn_missing")


def test_an_unbound_turn_without_the_mark_still_refuses_every_later_fork(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "fate unknown")
    assert store.turns.record_settlement(WS, sid, turn.turn_id, outcome="interrupted")
    done = settled_turn(store, sid, text="a", provider_turn_id="p-a").turn_id
    assert _host_only(store, sid) == [0, 0]
    _expect_boundary(store, request(sid, done), "provider_turn_missing")


def test_a_host_only_turn_is_never_re_bound_nor_bound(store: Store) -> None:
    sid = new_session(store)
    lost = _failed_before_sent(store, sid)
    turn, _ = store.turns.claim_submit(WS, sid, "r2", "fate unknown")
    store.turns.record_settlement(WS, sid, turn.turn_id, outcome="interrupted")
    # The re-bind from the provider's history asks only about the one whose fate is unknown.
    assert store.turns.unanswered_turns_missing_binding(WS, sid) == [turn.turn_id]
    # The schema's CHECK: a marked Turn never gets a provider turn id.
    with pytest.raises(apsw.ConstraintError):
        store.turns.bind_provider_turn(WS, sid, lost, "p-late")


def test_the_mark_is_not_written_on_a_turn_the_provider_named(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "bound")
    store.turns.bind_provider_turn(WS, sid, turn.turn_id, "p-1")
    assert store.turns.record_settlement(
        WS, sid, turn.turn_id, outcome="failed", error="late", host_only=True
    )
    assert _host_only(store, sid) == [0]


def test_the_re_binds_proof_marks_only_a_settled_unanswered_unbound_turn(store: Store) -> None:
    """`mark_host_only`, the re-bind's own statement (a final provider history without the
    Turn): it marks a settled, not `completed`, unbound Turn once, and then the fork's provider
    prefix leaves it out; never an active, a `completed` or a bound Turn."""
    sid = new_session(store)
    lost, _ = store.turns.claim_submit(WS, sid, "r-lost", "fate unknown")
    # Active: never marked.
    assert not store.turns.mark_host_only(WS, sid, lost.turn_id)
    assert store.turns.record_settlement(WS, sid, lost.turn_id, outcome="interrupted")
    done = settled_turn(store, sid, text="a", provider_turn_id="p-a").turn_id
    _expect_boundary(store, request(sid, done), "provider_turn_missing")
    # Bound or completed: never marked.
    assert not store.turns.mark_host_only(WS, sid, done)
    answered, _ = store.turns.claim_submit(WS, sid, "r-answered", "answered")
    store.turns.record_settlement(WS, sid, answered.turn_id, outcome="completed")
    assert not store.turns.mark_host_only(WS, sid, answered.turn_id)
    assert _host_only(store, sid) == [0, 0, 0]
    # The proven one: marked once (a second proof changes nothing), no longer asked about.
    assert store.turns.mark_host_only(WS, sid, lost.turn_id)
    assert not store.turns.mark_host_only(WS, sid, lost.turn_id)
    assert _host_only(store, sid) == [1, 0, 0]
    assert store.turns.unanswered_turns_missing_binding(WS, sid) == []
    op, created = store.fork_prepare.prepare_fork(WS, request(sid, done))
    assert created and op.source_provider_turn_ids == ("p-a",)
    assert run_to_commit(store, op).status == "committed"


def test_the_mark_is_on_the_turn_read_back_and_its_change_is_announced(store: Store) -> None:
    """The Turn as the store reads it (and the wire projects it) says it is host-only, by its
    settlement's mark or the re-bind's; the re-bind's mark announces the Turn's change (a
    client following events sees it flip, never back)."""
    sid = new_session(store)
    marked = _failed_before_sent(store, sid)
    assert store.turns.get_turn(WS, sid, marked).host_only
    lost, _ = store.turns.claim_submit(WS, sid, "r-lost", "fate unknown")
    assert not lost.host_only
    assert store.turns.record_settlement(WS, sid, lost.turn_id, outcome="interrupted")
    assert not store.turns.get_turn(WS, sid, lost.turn_id).host_only
    changes: list[object] = []
    unsubscribe = store.db.subscribe(changes.append)
    try:
        assert store.turns.mark_host_only(WS, sid, lost.turn_id)
        assert not store.turns.mark_host_only(WS, sid, lost.turn_id)
    finally:
        unsubscribe()
    assert store.turns.get_turn(WS, sid, lost.turn_id).host_only
    assert [getattr(c, "turn_id", None) for c in changes] == [lost.turn_id], changes
