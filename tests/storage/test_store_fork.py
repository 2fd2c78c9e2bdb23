"""The store's fork contract on real SQLite files: prepare, fence, barrier, ACK,
transitions, commit from the frozen snapshot, deterministic remap and fail-closed references."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from store_builders import WS, new_session, settled_turn

from domain.errors import (
    ForkAcknowledgeConflict,
    ForkBoundaryError,
    ForkConflict,
    ForkEvidenceRejected,
    ForkInProgress,
    ForkOperationNotFound,
    ForkRequestConflict,
    InvalidArgument,
    InvalidTransition,
    SessionIdTaken,
    SessionNotFound,
)
from domain.fork_states import ForkStatus
from storage import fork_child
from storage.fork_child import ForkReferenceError, OrdinalPrefixes, build_child
from storage.fork_snapshot import ForkSnapshotCorrupt, decode_frozen, source_blockers
from storage.history_links import history_digest, scan_history, visible_rows
from storage.models import (
    ForkOperation,
    ForkOperationChanged,
    ForkPrepareRequest,
    LeftoverCommit,
    ProviderForkEvidence,
    SessionChanged,
    TurnChanged,
)
from storage.rows import require_session
from storage.store import Store
from tests.support.invariants import history_copy_problem
from tests.support.store_reads import (
    begin_goal_control,
    begin_runtime_operation,
    fence_holder,
    find_session,
    finish_goal_control,
    finish_runtime_operation,
    fork_readiness,
    lineage_of,
    recoverable_fork_operations,
)

pytestmark = pytest.mark.timeout(30)


def request(
    sid: str,
    turn_id: str,
    *,
    request_id: str | None = None,
    target: str | None = None,
    binding_mode: str = "host_copy",
    runtime_identity: dict[str, Any] | None = None,
) -> ForkPrepareRequest:
    return ForkPrepareRequest(
        source_session_id=sid,
        request_id=request_id or f"req-{uuid.uuid4()}",
        target_session_id=target or str(uuid.uuid4()),
        turn_id=turn_id,
        driver_kind="tutti-agent",
        driver_version="0.0.10",
        binding_mode=binding_mode,
        runtime_identity=runtime_identity or {},
    )


def evidence(op: ForkOperation, **over: Any) -> ProviderForkEvidence:
    fields: dict[str, Any] = {
        "child_provider_session_id": f"child-of-{op.source_provider_session_id}-{op.operation_id}",
        "provider_turn_ids": op.source_provider_turn_ids,
        "binding_mode": op.binding_mode,
        "receipt": {"forkedFromId": op.source_provider_session_id, "sha256": "ab"},
        "turn_bindings": None,
    }
    fields.update(over)
    return ProviderForkEvidence(**fields)


def run_to_commit(store: Store, op: ForkOperation, **over: Any) -> ForkOperation:
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op, **over))
    committed, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed
    return committed


@pytest.fixture
def source(store: Store) -> tuple[str, list[str]]:
    sid = new_session(store, title="123")
    turns = [
        settled_turn(store, sid, text=f"t{i}", provider_turn_id=f"p{i}").turn_id for i in (1, 2, 3)
    ]
    return sid, turns


# -- prepare and commit --------------------------------------------------------------------------


def test_through_turn_clone_is_inclusive_and_stops_at_the_selected_turn(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert created and op.status is ForkStatus.PREPARED and op.phase == "frozen"
    assert op.source_provider_turn_ids == ("p1", "p2") and op.source_provider_turn_id == "p2"
    committed = run_to_commit(store, op)
    child_turns, _ = store.history.timeline(WS, op.target_session_id)
    source_turns, _ = store.history.timeline(WS, sid)
    assert [t.messages[0].text for t in child_turns] == ["t1", "t2"]
    assert [t.sequence for t in child_turns] == [1, 2]
    assert {t.sequence_provenance for t in child_turns} == {"fork_clone"}
    assert [t.root_provider_turn_id for t in child_turns] == ["p1", "p2"]
    for c, s in zip(child_turns, source_turns, strict=False):
        assert c.turn_id != s.turn_id
        assert [m.text for m in c.messages] == [m.text for m in s.messages]
        assert {m.message_id for m in c.messages}.isdisjoint({m.message_id for m in s.messages})
        # finalAssistantMessageId is rewritten to the child's own message.
        assert c.final_assistant_message_id == c.messages[-1].message_id
    assert committed.target_turn_id == child_turns[-1].turn_id
    assert committed.lineage is not None
    assert committed.lineage.source_turn_id == turns[1]
    assert committed.lineage.target_turn_id == child_turns[-1].turn_id


def test_child_is_an_independent_root_with_frozen_runtime_identity(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    store.sessions.set_pinned(WS, sid, True)
    store.goals.set_goal(WS, sid, "source goal")
    identity = {
        "cwd": "/prepared",
        "settings": {"effort": "high"},
        "runtime_context": {"driverKind": "tutti-agent", "resumeCursor": "prov-src"},
    }
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0], runtime_identity=identity))
    committed = run_to_commit(store, op)
    child = store.sessions.get_session(WS, op.target_session_id)
    assert child == committed.committed_session
    assert (child.kind, child.parent_session_id, child.parent_turn_id) == ("root", None, None)
    assert child.provider_session_id == f"child-of-prov-src-{op.operation_id}"
    assert (child.cwd, child.settings) == ("/prepared", {"effort": "high"})
    # A resume cursor into the source provider session must not cross the fork.
    assert child.runtime_context == {"driverKind": "tutti-agent"}
    assert (child.pinned, child.goal, child.active_turn_id) == (False, None, None)
    assert child.lineage == committed.lineage


def test_commit_replay_returns_same_result_unchanged(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[2]))
    first = run_to_commit(store, op)
    again, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert not changed and again == first
    assert store.history.timeline(WS, op.target_session_id)[0][-1].turn_id == first.target_turn_id


def test_child_ids_are_deterministic_from_operation_and_source_ids(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    committed = run_to_commit(store, op)
    raw = (
        store.db.connection()
        .execute(
            "SELECT s.snapshot_json, o.snapshot_hash FROM fork_operations o JOIN fork_snapshots s"
            " USING (op_seq) WHERE o.operation_id = ?",
            (op.operation_id,),
        )
        .fetchone()
    )
    from storage.fork_snapshot import load_snapshot

    snapshot = load_snapshot(raw[0], raw[1])
    plan = build_child(
        snapshot,
        child_provider_session_id="x",
        binding_mode="host_copy",
        turn_bindings=None,
        committed_at_ms=1,
    )
    child_turn_ids = [t.turn_id for t in store.history.timeline(WS, op.target_session_id)[0]]
    assert [r[2] for r in plan.turn_rows] == child_turn_ids
    assert plan.lineage.target_turn_id == committed.target_turn_id


def test_prepare_request_replay_returns_original_operation(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    req = request(sid, turns[0])
    op, created = store.fork_prepare.prepare_fork(WS, req)
    again, created_again = store.fork_prepare.prepare_fork(WS, req)
    assert created and not created_again and again == op


def test_same_request_id_with_different_body_is_request_conflict(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    store.fork_prepare.prepare_fork(WS, request(sid, turns[0], request_id="same", target="t-a"))
    with pytest.raises(ForkRequestConflict) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, turns[1], request_id="same", target="t-a"))
    assert err.value.reason == "agent_session_fork_request_conflict"


def test_prepare_of_unknown_source_is_session_not_found(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        store.fork_prepare.prepare_fork(WS, request("nope", "turn"))


def test_prepare_rejects_unsupported_point_kind(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    bad = request(sid, turns[0])
    bad = ForkPrepareRequest(**{**{f: getattr(bad, f) for f in bad.__slots__}, "point_kind": "x"})
    with pytest.raises(InvalidArgument):
        store.fork_prepare.prepare_fork(WS, bad)


# -- titles and the frozen snapshot -------------------------------------------------------------


def test_child_titles_count_non_failed_forks_of_the_source(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    first, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert first.target_title == "123 (2)"
    run_to_commit(store, first)
    store.fork_transitions.acknowledge_fork(WS, first.operation_id)
    failed, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert failed.target_title == "123 (3)"
    store.fork_transitions.mark_fork_failed(WS, failed.operation_id, "provider rejected")
    second, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert second.target_title == "123 (3)"
    committed = run_to_commit(store, second)
    assert committed.committed_session is not None
    assert committed.committed_session.title == "123 (3)"


def test_snapshot_is_frozen_despite_later_source_title_drift(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    store.sessions.update_title(WS, sid, "renamed while forking")
    committed = run_to_commit(store, op)
    assert store.sessions.get_session(WS, op.target_session_id).title == "123 (2)"
    store.sessions.update_title(WS, sid, "renamed again")
    assert store.fork_queries.get_fork_operation(WS, op.operation_id) == committed


def test_committed_projection_survives_deletion_of_the_child(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    committed = run_to_commit(store, op)
    store.sessions.delete_session(WS, op.target_session_id)
    got = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert got.committed_session == committed.committed_session
    assert got.lineage == committed.lineage


def test_child_can_be_forked_again(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    committed = run_to_commit(store, op)
    child = committed.target_session_id
    grand, created = store.fork_prepare.prepare_fork(
        WS, request(child, committed.target_turn_id or "")
    )
    # Seed 000 §5: the fork of a fork stacks the suffix; its ordinal counts its own source's forks.
    assert created and grand.target_title == "123 (2) (2)"
    done = run_to_commit(store, grand)
    assert done.lineage is not None and done.lineage.source_session_id == child


# -- boundary reasons ----------------------------------------------------------------------------


def _frozen(
    conn: Any, op: ForkOperation, sid: str, target: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The operation's names (as `history_copy_problem` reads them) and its frozen snapshot."""
    raw = conn.execute(
        "SELECT s.snapshot_json FROM fork_operations o JOIN fork_snapshots s USING (op_seq)"
        " WHERE o.operation_id = ?",
        (op.operation_id,),
    ).fetchone()
    names = {"operation_id": op.operation_id, "source_session_id": sid, "target_session_id": target}
    return names, decode_frozen(raw[0])


def _expect_boundary(store: Store, req: ForkPrepareRequest, reason: str) -> None:
    with pytest.raises(ForkBoundaryError) as err:
        store.fork_prepare.prepare_fork(WS, req)
    assert err.value.params == {"forkBoundaryReason": reason}
    assert err.value.reason == "agent_session_fork_conflict"
    assert fence_holder(store, WS, req.source_session_id) is None


def test_boundary_source_not_root(store: Store) -> None:
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        WS, session_id=sid, provider="p", title="t", cwd="/", settings={}, kind="child"
    )
    store.sessions.update_runtime(WS, sid, provider_session_id="ps")
    turn = settled_turn(store, sid)
    _expect_boundary(store, request(sid, turn.turn_id), "source_not_root")


def test_boundary_source_provider_session_missing(store: Store) -> None:
    sid = new_session(store, provider_session_id=None)
    turn = settled_turn(store, sid)
    _expect_boundary(store, request(sid, turn.turn_id), "source_provider_session_missing")


def test_boundary_turn_not_found_and_other_sessions_turn(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, _ = source
    other = new_session(store)
    foreign = settled_turn(store, other)
    _expect_boundary(store, request(sid, "no-such-turn"), "turn_not_found")
    _expect_boundary(store, request(sid, foreign.turn_id), "turn_not_found")


def test_boundary_turn_not_settled(store: Store, source: tuple[str, list[str]]) -> None:
    sid, _ = source
    active, _ = store.turns.claim_submit(WS, sid, "r", "running")
    _expect_boundary(store, request(sid, active.turn_id), "turn_not_settled")


def test_boundary_source_turn_active(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    active, _ = store.turns.claim_submit(WS, sid, "r", "running")
    store.turns.bind_provider_turn(WS, sid, active.turn_id, "p-active")  # finishes the claim
    _expect_boundary(store, request(sid, turns[0]), "source_turn_active")


def test_boundary_source_submit_claim_active(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    store.turns.claim_submit(WS, sid, "r", "not yet bound")
    _expect_boundary(store, request(sid, turns[0]), "source_submit_claim_active")


def test_boundary_source_interaction_pending(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    active, _ = store.turns.claim_submit(WS, sid, "r", "ask")
    store.history.open_interaction(
        WS, sid, active.turn_id, request_id="q", kind="question", input={}
    )
    _expect_boundary(store, request(sid, turns[0]), "source_interaction_pending")


def test_boundary_source_goal_control_active(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    control = begin_goal_control(store, WS, sid, "set", "g")
    _expect_boundary(store, request(sid, turns[0]), "source_goal_control_active")
    finish_goal_control(store, WS, control)
    assert store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))[1]


def test_boundary_source_runtime_operation_active(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op_id = begin_runtime_operation(store, WS, sid, "compact")
    _expect_boundary(store, request(sid, turns[0]), "source_runtime_operation_active")
    finish_runtime_operation(store, WS, op_id)
    assert store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))[1]


def test_source_blockers_are_asked_in_order_by_one_statement(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """Every store-held reason at once, in the fixed order, from one statement (six, one per
    reason, before forkprof's cut)."""
    sid, turns = source
    begin_goal_control(store, WS, sid, "set", "g")
    begin_runtime_operation(store, WS, sid, "compact")
    active, _ = store.turns.claim_submit(WS, sid, "r", "ask")
    store.history.open_interaction(
        WS, sid, active.turn_id, request_id="q", kind="question", input={}
    )
    # A live fork of this source (its row as a prepare writes it, moved to `dispatching`):
    # written last, by hand, since a prepare refuses a source that is not quiescent.
    other = new_session(store)
    op, _ = store.fork_prepare.prepare_fork(WS, request(other, settled_turn(store, other).turn_id))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    with store.db.write(WS) as tx:
        tx.execute(
            "UPDATE fork_operations SET source_session_id = ? WHERE operation_id = ?",
            (sid, op.operation_id),
        )
    ran: list[str] = []

    def trace(_cursor: object, sql: str, _bindings: object) -> bool:
        ran.append(sql)
        return True

    with store.db.read() as conn:
        session = require_session(conn, WS, sid)
        conn.exec_trace = trace
        try:
            blockers = [r.value for r in source_blockers(conn, WS, session)]
        finally:
            conn.exec_trace = None
    assert blockers == [
        "source_goal_control_active",
        "source_runtime_operation_active",
        "source_interaction_pending",
        "source_submit_claim_active",
        "source_turn_active",
        "source_fork_active",
    ]
    assert len(ran) == 1


def test_boundary_source_fork_active_is_retryable_in_progress(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    with pytest.raises(ForkInProgress) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert err.value.retryable and err.value.params["forkBoundaryReason"] == "source_fork_active"
    assert "source_fork_active" in fork_readiness(store, WS, sid, turns[1]).blocking


def test_boundary_turn_sequence_unverified(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    # An imported (not host-assigned) sequence cannot be proven to mean the same prefix.
    store.db.connection().execute(
        "UPDATE turns SET sequence_provenance = 'imported' WHERE turn_id = ?", (turns[0],)
    )
    _expect_boundary(store, request(sid, turns[1]), "turn_sequence_unverified")


def test_boundary_provider_turn_missing(store: Store, source: tuple[str, list[str]]) -> None:
    sid, _ = source
    turn, _ = store.turns.claim_submit(WS, sid, "r", "never reached the provider")
    store.turns.settle_turn(WS, sid, turn.turn_id, outcome="failed", error="worker down")
    _expect_boundary(store, request(sid, turn.turn_id), "provider_turn_missing")


@pytest.mark.parametrize(
    ("kind", "payload"),
    [("descendant_lane", {}), ("tool_call", {"descendantLane": {"threadId": "sub"}})],
)
def test_boundary_descendant_lane(store: Store, kind: str, payload: dict[str, Any]) -> None:
    sid = new_session(store)
    turn = settled_turn(store, sid, extra=[(kind, "lane", payload)])
    _expect_boundary(store, request(sid, turn.turn_id), "descendant_lane_in_boundary")


def test_boundary_session_local_attachment(store: Store) -> None:
    sid = new_session(store)
    local = {"attachments": [{"scope": "session_local", "path": "a.png"}]}
    turn = settled_turn(store, sid, extra=[("user_attachment", "see", local)])
    _expect_boundary(store, request(sid, turn.turn_id), "session_local_attachment_in_boundary")
    # A workspace-scoped attachment is fine.
    ok = new_session(store)
    fine = settled_turn(store, ok, extra=[("x", "y", {"attachments": [{"scope": "workspace"}]})])
    assert store.fork_prepare.prepare_fork(WS, request(ok, fine.turn_id))[1]


def test_boundary_content_after_the_selected_turn_does_not_block(store: Store) -> None:
    sid = new_session(store)
    first = settled_turn(store, sid)
    settled_turn(store, sid, extra=[("descendant_lane", "later", {})])
    assert store.fork_prepare.prepare_fork(WS, request(sid, first.turn_id))[1]


def test_fork_readiness_lists_blockers_without_writing(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    assert fork_readiness(store, WS, sid, turns[0]).blocking == ()
    store.turns.claim_submit(WS, sid, "r", "x")
    ready = fork_readiness(store, WS, sid, turns[0])
    assert ready.blocking == ("source_submit_claim_active", "source_turn_active")
    assert ready.turn is not None and ready.turn.turn_id == turns[0]


# -- target reservation --------------------------------------------------------------------------


def test_target_id_of_existing_session_is_conflict(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    taken = new_session(store)
    with pytest.raises(ForkConflict) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, turns[0], target=taken))
    assert err.value.params["forkBoundaryReason"] == "target_session_exists"
    with pytest.raises(ForkConflict) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, turns[0], target=sid))
    assert err.value.params["forkBoundaryReason"] == "target_equals_source"


def test_target_reservation_blocks_create_and_is_released_only_by_failure(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0], target="reserved-id"))
    with pytest.raises(SessionIdTaken):
        new_session(store, session_id="reserved-id")
    other = new_session(store)
    other_turn = settled_turn(store, other)
    with pytest.raises(ForkConflict) as err:
        store.fork_prepare.prepare_fork(
            WS, request(other, other_turn.turn_id, target="reserved-id")
        )
    assert err.value.params["forkBoundaryReason"] == "target_session_reserved"
    store.fork_transitions.mark_fork_failed(WS, op.operation_id, "not started")
    new_session(store, session_id="reserved-id")


def test_unknown_operation_keeps_its_reservation(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0], target="kept"))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_unknown(WS, op.operation_id, "timeout")
    with pytest.raises(SessionIdTaken):
        new_session(store, session_id="kept")


# -- the fence -----------------------------------------------------------------------------------

FENCED: dict[str, Callable[[Store, str, str], object]] = {
    "update_settings": lambda s, sid, t: s.sessions.update_settings(WS, sid, {"x": 1}),
    "delete_session": lambda s, sid, t: s.sessions.delete_session(WS, sid),
    "update_runtime": lambda s, sid, t: s.sessions.update_runtime(WS, sid, model="m2"),
    "set_goal": lambda s, sid, t: s.goals.set_goal(WS, sid, "g"),
    "clear_goal": lambda s, sid, t: s.goals.clear_goal(WS, sid),
    "begin_goal_control": lambda s, sid, t: begin_goal_control(s, WS, sid, "set", "g"),
    "begin_runtime_operation": lambda s, sid, t: begin_runtime_operation(s, WS, sid, "k"),
    "claim_submit": lambda s, sid, t: s.turns.claim_submit(WS, sid, "new-request", "x"),
    "bind_provider_turn": lambda s, sid, t: s.turns.bind_provider_turn(WS, sid, t, "p1"),
    "record_turn_binding": lambda s, sid, t: s.turns.record_turn_binding(WS, sid, t, "{}"),
    "append_message": lambda s, sid, t: s.history.append_message(WS, sid, t, kind="a", text="x"),
    "open_interaction": lambda s, sid, t: s.history.open_interaction(
        WS, sid, t, request_id="q", kind="question", input={}
    ),
    "prepare_fork_other_turn": lambda s, sid, t: s.fork_prepare.prepare_fork(WS, request(sid, t)),
}


@pytest.mark.parametrize("path", sorted(FENCED))
def test_fenced_write_fails_while_fork_is_active(
    store: Store, source: tuple[str, list[str]], path: str
) -> None:
    sid, turns = source
    store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    before = store.db.connection().execute("SELECT total_changes()").fetchone()
    with pytest.raises(ForkInProgress) as err:
        FENCED[path](store, sid, turns[0])
    assert err.value.to_wire()["reason"] == "agent_session_fork_in_progress"
    assert store.db.connection().execute("SELECT total_changes()").fetchone() == before


def test_settle_and_resolve_are_fenced_inside_the_transaction(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[2]))
    # Simulate a turn left active by a crashed writer (only raw SQL can do this under a fence).
    store.db.connection().execute(
        "INSERT INTO turns (workspace_id, session_id, turn_id, sequence, sequence_provenance,"
        " phase, created_at_ms) VALUES (?, ?, 'stray', 99, 'host', 'active', 0)",
        (WS, sid),
    )
    with pytest.raises(ForkInProgress):
        store.turns.settle_turn(WS, sid, "stray", outcome="completed")
    with pytest.raises(ForkInProgress):
        store.history.resolve_interaction(WS, sid, "stray", "q", {"text": "a"})
    assert store.fork_queries.get_fork_operation(WS, op.operation_id).is_active


def test_title_and_pin_stay_writable_under_the_fence(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert store.sessions.update_title(WS, sid, "new").title == "new"
    assert store.sessions.set_pinned(WS, sid, True).pinned


def test_submit_replay_is_answered_under_the_fence(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    first = store.history.timeline(WS, sid)[0][0]
    claim = (
        store.db.connection()
        .execute("SELECT request_id FROM submit_claims WHERE turn_id = ?", (first.turn_id,))
        .fetchone()[0]
    )
    replay, created = store.turns.claim_submit(WS, sid, claim, "t1")
    assert not created and replay.turn_id == first.turn_id


@pytest.mark.parametrize("terminal", ["failed_from_prepared", "failed", "unknown", "committed"])
def test_each_terminal_state_releases_the_fence(
    store: Store, source: tuple[str, list[str]], terminal: str
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert fence_holder(store, WS, sid) is not None
    if terminal == "failed_from_prepared":
        store.fork_transitions.mark_fork_failed(WS, op.operation_id, "x")
    elif terminal == "committed":
        run_to_commit(store, op)
    else:
        store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
        mark = (
            store.fork_transitions.mark_fork_failed
            if terminal == "failed"
            else store.fork_transitions.mark_fork_unknown
        )
        mark(WS, op.operation_id, "x")
    assert fence_holder(store, WS, sid) is None
    assert store.sessions.update_settings(WS, sid, {"after": True}).settings == {"after": True}


# -- barrier and ACK -----------------------------------------------------------------------------


def test_barrier_returns_original_operation_to_a_new_identity_until_ack(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    held, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert not created and held.operation_id == op.operation_id
    committed = run_to_commit(store, op)
    held, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert not created and held == committed  # committed but not yet observed
    acked, changed = store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    assert changed and acked.client_observed_at_ms is not None
    again, changed = store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    assert not changed and again.client_observed_at_ms == acked.client_observed_at_ms
    branch, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert created and branch.operation_id != op.operation_id


def test_unknown_holds_the_barrier_forever_and_cannot_be_acked(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    unknown, _ = store.fork_transitions.mark_fork_unknown(WS, op.operation_id, "worker lost")
    assert (unknown.public_status, unknown.phase) == ("unknown", "deliveryUnknown")
    with pytest.raises(ForkAcknowledgeConflict):
        store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    held, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert not created and held.operation_id == op.operation_id
    # Another boundary of the same source is not held (the fence was released).
    assert store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))[1]


def test_failed_releases_the_barrier(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    store.fork_transitions.mark_fork_failed(WS, op.operation_id, "rejected")
    with pytest.raises(ForkAcknowledgeConflict):
        store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    fresh, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert created and fresh.operation_id != op.operation_id


# -- transitions and evidence --------------------------------------------------------------------


def test_repeated_transitions_are_unchanged_and_wrong_ones_typed(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    with pytest.raises(InvalidTransition):
        store.fork_transitions.mark_fork_unknown(
            WS, op.operation_id, "x"
        )  # prepared → unknown is not allowed
    with pytest.raises(InvalidTransition):
        store.fork_commit.commit_fork(WS, op.operation_id)
    with pytest.raises(InvalidTransition):
        store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    d1, c1 = store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    d2, c2 = store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    assert (c1, c2) == (True, False) and d1 == d2 and d1.phase == "dispatching"
    a1, c1 = store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    a2, c2 = store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    assert (c1, c2) == (True, False) and a1.phase == "materializing"
    with pytest.raises(InvalidTransition):
        store.fork_transitions.mark_fork_provider_accepted(
            WS, op.operation_id, evidence(op, child_provider_session_id="another")
        )
    with pytest.raises(InvalidTransition):
        store.fork_transitions.mark_fork_failed(WS, op.operation_id, "too late")
    with pytest.raises(InvalidTransition):
        store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    with pytest.raises(ForkOperationNotFound):
        store.fork_transitions.mark_fork_dispatching(WS, "missing")
    with pytest.raises(ForkOperationNotFound):
        store.fork_queries.get_fork_operation("other-workspace", op.operation_id)


@pytest.mark.parametrize(
    "over",
    [
        {"provider_turn_ids": ("p1",)},  # truncated
        {"provider_turn_ids": ("p2", "p1")},  # reordered
        {"provider_turn_ids": ("p1", "p2", "p3")},  # extra
        {"provider_turn_ids": ("p1", "p1")},  # duplicated
        {"child_provider_session_id": ""},
        {"child_provider_session_id": "prov-src"},
        {"binding_mode": "provider_owned"},
        {"receipt": {}},
        {"receipt": {"forkedFromId": "someone-else"}},
    ],
)
def test_unverifiable_provider_evidence_is_rejected_and_nothing_changes(
    store: Store, source: tuple[str, list[str]], over: dict[str, Any]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    with pytest.raises(ForkEvidenceRejected) as err:
        store.fork_transitions.mark_fork_provider_accepted(
            WS, op.operation_id, evidence(op, **over)
        )
    assert err.value.reason == "agent_session_fork_delivery_unknown"
    assert (
        store.fork_queries.get_fork_operation(WS, op.operation_id).status is ForkStatus.DISPATCHING
    )


def test_provider_owned_child_gets_the_returned_turn_bindings(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(
        WS, request(sid, turns[1], binding_mode="provider_owned")
    )
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    with pytest.raises(ForkEvidenceRejected):
        store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    bindings = {turns[1]: ("child-uuid-2", '{"checkpointMessageId":"c2"}')}
    committed = run_to_commit_from_dispatching(store, op, turn_bindings=bindings)
    child_turns, _ = store.history.timeline(WS, committed.target_session_id)
    assert [t.root_provider_turn_id for t in child_turns] == [None, "child-uuid-2"]
    assert child_turns[1].provider_turn_binding_json == '{"checkpointMessageId":"c2"}'


def run_to_commit_from_dispatching(store: Store, op: ForkOperation, **over: Any) -> ForkOperation:
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op, **over))
    return store.fork_commit.commit_fork(WS, op.operation_id)[0]


def test_commit_reproves_source_provider_identity(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    # The operation's provider identity no longer matches what the snapshot froze.
    store.db.connection().execute(
        "UPDATE fork_operations SET source_provider_session_id = 'swapped' WHERE operation_id = ?",
        (op.operation_id,),
    )
    with pytest.raises(ForkSnapshotCorrupt):
        store.fork_commit.commit_fork(WS, op.operation_id)
    assert find_session(store, WS, op.target_session_id) is None


def test_commit_refuses_a_snapshot_that_no_longer_matches_its_hash(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    store.db.connection().execute(
        "UPDATE fork_snapshots SET snapshot_json = replace(snapshot_json, 't1', 'tX')"
        " WHERE op_seq = (SELECT op_seq FROM fork_operations WHERE operation_id = ?)",
        (op.operation_id,),
    )
    with pytest.raises(ForkSnapshotCorrupt):
        store.fork_commit.commit_fork(WS, op.operation_id)
    assert (
        store.fork_queries.get_fork_operation(WS, op.operation_id).status
        is ForkStatus.PROVIDER_ACCEPTED
    )


def test_commit_refuses_a_source_history_drifted_behind_the_fence(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    # Drift the live source behind the store's back (no store path can: the fence refuses it).
    # The commit copies the source's boundary, so it re-proves it against prepare's digest and
    # fails closed: no child, the operation still provider_accepted (law 2, law 4).
    store.db.connection().execute(
        "UPDATE messages SET text = 'drifted' WHERE session_id = ?", (sid,)
    )
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    with pytest.raises(ForkSnapshotCorrupt, match="changed since prepare"):
        store.fork_commit.commit_fork(WS, op.operation_id)
    after = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert after.status == ForkStatus.PROVIDER_ACCEPTED
    with pytest.raises(SessionNotFound):
        store.sessions.get_session(WS, op.target_session_id)


def _witness(store: Store, sid: str) -> tuple[str, int] | None:
    """(operation id, changes) of the fence's witness of Session `sid`, or None."""
    row = (
        store.db.connection()
        .execute(
            "SELECT o.operation_id, f.changes FROM history_fences f JOIN fork_operations o"
            " USING (op_seq) WHERE f.session_key = (SELECT session_key FROM session_keys"
            " WHERE workspace_id = ? AND session_id = ?)",
            (WS, sid),
        )
        .fetchone()
    )
    return None if row is None else (str(row[0]), int(row[1]))


# Raw SQL behind the daemon's back on the boundary (the source's first Turn, `?2`) of a fork
# through it: every kind of change the witness (schema v13) must count.
_RAW_BOUNDARY_WRITES = {
    "text": "UPDATE messages SET text = 'drifted' WHERE session_id = ?1 AND turn_id = ?2",
    "payload": "UPDATE messages SET payload_json = '{\"k\":1}' WHERE session_id = ?1"
    " AND turn_id = ?2 AND kind = 'user'",
    "removed": "DELETE FROM messages WHERE session_id = ?1 AND turn_id = ?2 AND kind = 'user'",
    "added": "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
    " payload_json, version, position, created_at_ms, session_key) SELECT workspace_id,"
    " session_id, 'raw-' || message_id, turn_id, kind, text, payload_json, version,"
    " (SELECT max(position) + 1 FROM messages WHERE session_id = ?1), created_at_ms, session_key"
    " FROM messages WHERE session_id = ?1 AND turn_id = ?2 AND kind = 'user'",
    "turn renumbered": "UPDATE turns SET sequence = 99 WHERE session_id = ?1 AND turn_id = ?2",
}


@pytest.mark.parametrize("write", sorted(_RAW_BOUNDARY_WRITES))
def test_the_fence_witness_catches_a_raw_write_behind_the_daemons_back(
    store: Store, source: tuple[str, list[str]], write: str
) -> None:
    """The commit trusts the witness's one row instead of re-reading the boundary; raw SQL on
    the fenced source — whatever it changes — is counted by SQLite's triggers, so the commit
    falls back to the digest and fails closed: no child, still provider_accepted (law 2)."""
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    seq = _witness(store, sid)
    assert seq is not None and seq[1] == 0
    store.db.connection().execute(_RAW_BOUNDARY_WRITES[write], (sid, turns[0]))
    witness = _witness(store, sid)
    assert witness is not None and witness[0] == seq[0] and witness[1] > 0
    with pytest.raises(ForkSnapshotCorrupt, match="changed since prepare"):
        store.fork_commit.commit_fork(WS, op.operation_id)
    after = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert after.status == ForkStatus.PROVIDER_ACCEPTED
    assert _witness(store, sid) == witness  # the failed commit rolled back, the count stays
    with pytest.raises(SessionNotFound):
        store.sessions.get_session(WS, op.target_session_id)


def test_a_change_the_witness_counts_outside_the_boundary_is_re_proved_and_commits(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """The witness counts every change of the source's history, the boundary's or not; a
    counted change is re-proved with prepare's digest, which a later Turn's Message, or a change
    undone, leaves as it was: the fork commits the boundary prepare froze."""
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    conn = store.db.connection()
    conn.execute(
        "UPDATE messages SET text = 'later' WHERE session_id = ? AND turn_id = ?", (sid, turns[2])
    )
    conn.execute(
        "UPDATE messages SET text = text || '!' WHERE session_id = ? AND turn_id = ?",
        (sid, turns[0]),
    )
    conn.execute(
        "UPDATE messages SET text = substr(text, 1, length(text) - 1)"
        " WHERE session_id = ? AND turn_id = ?",
        (sid, turns[0]),
    )
    witness = _witness(store, sid)
    assert witness is not None and witness[1] > 0
    committed = run_to_commit(store, op)
    assert committed.status == ForkStatus.COMMITTED
    row, snapshot = _frozen(conn, op, sid, op.target_session_id)
    assert history_copy_problem(conn, WS, row, snapshot) is None
    assert len(store.history.timeline(WS, op.target_session_id)[0]) == 1


def test_the_witness_is_held_while_the_operation_is_active_and_goes_with_it(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    failed, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert _witness(store, sid) == (failed.operation_id, 0)
    store.fork_transitions.mark_fork_dispatching(WS, failed.operation_id)
    assert _witness(store, sid) == (failed.operation_id, 0)  # a status change is no history change
    store.fork_transitions.mark_fork_failed(WS, failed.operation_id, "boom")
    assert _witness(store, sid) is None
    unknown, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert _witness(store, sid) == (unknown.operation_id, 0)
    store.fork_transitions.mark_fork_dispatching(WS, unknown.operation_id)
    store.fork_transitions.mark_fork_unknown(WS, unknown.operation_id, "lost")
    assert _witness(store, sid) is None
    # Unfenced again: the source's Turns write their Messages, and nothing counts them.
    settled_turn(store, sid, text="after")
    assert _witness(store, sid) is None
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[2]))
    assert _witness(store, sid) == (op.operation_id, 0)
    run_to_commit(store, op)
    assert _witness(store, sid) is None


# -- references ----------------------------------------------------------------------------------


def test_allowlisted_references_are_rewritten_and_lineage_left_alone(store: Store) -> None:
    sid = new_session(store)
    first = settled_turn(store, sid, text="q")
    user_msg = first.messages[0].message_id
    payload = {
        "replyToMessageId": user_msg,
        "turnId": first.turn_id,
        "parentMessageId": user_msg,
        "providerTurnId": "p-raw",
        "sourceTurnId": first.turn_id,
        "output": f"tool said {user_msg}",
    }
    second = settled_turn(store, sid, extra=[("tool_call", f"see {user_msg}", payload)])
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, second.turn_id))
    committed = run_to_commit(store, op)
    child_turns, _ = store.history.timeline(WS, committed.target_session_id)
    tool = child_turns[1].messages[1]
    child_user = child_turns[0].messages[0].message_id
    assert tool.payload["replyToMessageId"] == child_user
    assert tool.payload["turnId"] == child_turns[0].turn_id
    assert tool.payload["parentMessageId"] == child_user
    # Provider/source lineage and free text are never rewritten.
    assert tool.payload["providerTurnId"] == "p-raw"
    assert tool.payload["sourceTurnId"] == first.turn_id
    assert tool.payload["output"] == f"tool said {user_msg}"
    assert tool.text == f"see {user_msg}"


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({"replyToMessageId": "not-in-boundary"}, "dangling_reference"),
        ({"customMessageId": "x"}, "unknown_typed_reference"),
        ({"messageId": "x"}, "unknown_typed_reference"),
        ({"$ref": "turn:1"}, "unknown_typed_reference"),
        ({"turnId": 7}, "malformed_reference"),
    ],
)
def test_unsafe_references_fail_closed_at_prepare(
    store: Store, payload: dict[str, Any], why: str
) -> None:
    sid = new_session(store)
    turn = settled_turn(store, sid, extra=[("tool_call", "x", payload)])
    with pytest.raises(ForkReferenceError) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, turn.turn_id))
    assert err.value.params["forkReferenceError"] == why
    # Every agent_session_fork_conflict names a forkBoundaryReason (PROTOCOL.md).
    assert err.value.reason == "agent_session_fork_conflict"
    assert err.value.params["forkBoundaryReason"] == "history_reference_unsafe"
    assert fence_holder(store, WS, sid) is None


def test_model_and_provider_content_below_the_payload_keys_is_copied_byte_identical(
    store: Store,
) -> None:
    """Seed 000 §5: the allowlist names host-owned payload keys; a tool call's `input` or
    `arguments` and a raw provider `item` are model/provider content — never refused, never
    rewritten, even when they hold `messageId`/`turnId`/`$ref` keys or canonical ids."""
    sid = new_session(store)
    first = settled_turn(store, sid, text="q")
    content = {
        "messageId": "abc",
        "turnId": first.turn_id,
        "replyToMessageId": "not-an-id-here",
        "deep": [{"$ref": "turn:1", "interactionId": 7}],
    }
    payloads = [
        {"providerToolUseId": "toolu_1", "input": content},
        {"providerItemId": "call_1", "tool": "t", "arguments": content},
        {"providerItemType": "x", "item": {"type": "x", "payload": content}},
    ]
    second = settled_turn(store, sid, extra=[("tool_call", "t", p) for p in payloads])
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, second.turn_id))
    committed = run_to_commit(store, op)
    conn = store.db.connection()
    source_json = [
        r[0]
        for r in conn.execute(
            "SELECT payload_json FROM messages WHERE session_id = ? AND turn_id = ?"
            " ORDER BY position",
            (sid, second.turn_id),
        )
    ]
    child_turns, _ = store.history.timeline(WS, committed.target_session_id)
    child_json = [  # the stored JSON the child shows (its own rows and its linked ones)
        r[4]
        for r in visible_rows(conn, WS, committed.target_session_id, 2)
        if r[1] == child_turns[1].turn_id
    ]
    assert child_json == source_json
    assert [m.payload for m in child_turns[1].messages[1:4]] == payloads


def test_reference_to_a_later_turn_is_dangling_in_the_child(store: Store) -> None:
    sid = new_session(store)
    first = settled_turn(store, sid)
    later = settled_turn(store, sid)
    store.db.connection().execute(
        "UPDATE messages SET payload_json = ? WHERE message_id = ?",
        (f'{{"replyToMessageId": "{later.messages[0].message_id}"}}', first.messages[1].message_id),
    )
    with pytest.raises(ForkReferenceError):
        store.fork_prepare.prepare_fork(WS, request(sid, first.turn_id))
    # Through the later turn the same reference resolves.
    assert store.fork_prepare.prepare_fork(WS, request(sid, later.turn_id))[1]


def test_a_final_assistant_message_outside_the_boundary_fails_closed_at_prepare(
    store: Store,
) -> None:
    """Prepare's dry run (`fork_child.prove_child`) refuses what the commit's `build_child`
    would: a Turn whose final assistant Message is a later Turn's, before anything is written."""
    sid = new_session(store)
    first = settled_turn(store, sid)
    later = settled_turn(store, sid)
    store.db.connection().execute(
        "UPDATE turns SET final_assistant_message_id = ? WHERE turn_id = ?",
        (later.messages[-1].message_id, first.turn_id),
    )
    with pytest.raises(ForkReferenceError) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, first.turn_id))
    assert err.value.params["forkReferenceError"] == "dangling_reference"
    assert fence_holder(store, WS, sid) is None
    ops = store.db.connection().execute("SELECT count(*) FROM fork_operations").fetchone()
    assert ops == (0,)
    # Through the later Turn the same Message is in the boundary: the fork prepares.
    assert store.fork_prepare.prepare_fork(WS, request(sid, later.turn_id))[1]


def test_duplicate_json_key_in_a_payload_fails_closed(store: Store) -> None:
    sid = new_session(store)
    turn = settled_turn(store, sid)
    store.db.connection().execute(
        'UPDATE messages SET payload_json = \'{"a": 1, "a": 2}\' WHERE message_id = ?',
        (turn.messages[0].message_id,),
    )
    with pytest.raises(ForkReferenceError) as err:
        store.fork_prepare.prepare_fork(WS, request(sid, turn.turn_id))
    assert err.value.params["forkReferenceError"] == "duplicate_key"


def test_normalisation_settles_open_turns_and_supersedes_pending_interactions() -> None:
    snapshot = {
        "version": 1,
        "operation_id": "op",
        "workspace_id": WS,
        "point": {"kind": "through_turn", "turn_id": "t1"},
        "source": {"session_id": "s", "provider": "p", "provider_session_id": "ps", "title": "T"},
        "target": {
            "session_id": "c",
            "title": "T (2)",
            "provider": "p",
            "model": None,
            "cwd": "/",
            "settings": {},
            "runtime_context": {},
            "rail_placement": None,
            "visibility": "visible",
        },
        "provider_turn_ids": ["p1"],
        "turns": [
            {
                "turn_id": "t1",
                "sequence": 1,
                "sequence_provenance": "host",
                "phase": "active",
                "outcome": None,
                "root_provider_turn_id": "p1",
                "provider_turn_binding_json": None,
                "final_assistant_message_id": None,
                "error": None,
                "created_at_ms": 1,
                "settled_at_ms": None,
                "messages": [],
                "interactions": [
                    {
                        "interaction_id": "i1",
                        "request_id": "q",
                        "kind": "question",
                        "status": "pending",
                        "input": {"interactionId": "i1"},
                        "output": None,
                    }
                ],
            }
        ],
    }
    plan = build_child(
        snapshot,
        child_provider_session_id="pc",
        binding_mode="host_copy",
        turn_bindings=None,
        committed_at_ms=5,
    )
    turn = plan.turn_rows[0]
    assert (turn[5], turn[6], turn[12]) == ("settled", "interrupted", 5)
    interaction = plan.interaction_rows[0]
    assert interaction[6] == "superseded"
    assert interaction[7] == f'{{"interactionId":"{plan.ids.interactions["i1"]}"}}'


# -- queries and events --------------------------------------------------------------------------


def test_recoverable_operations_page_across_workspaces_by_stable_cursor(store: Store) -> None:
    created: list[str] = []
    for ws in ("w1", "w2", "w3"):
        for _ in range(3):
            sid = new_session(store, ws)
            turn = settled_turn(store, sid, ws)
            op, _ = store.fork_prepare.prepare_fork(ws, request(sid, turn.turn_id))
            created.append(op.operation_id)
    # Terminal ones are not recoverable.
    store.fork_transitions.mark_fork_failed("w2", created[3], "x")
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = recoverable_fork_operations(store, after=cursor, limit=2)
        seen += [op.operation_id for op in page]
        if cursor is None:
            break
    assert seen == [c for c in created if c != created[3]]


def test_lineage_of_child_and_of_plain_root(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    committed = run_to_commit(store, op)
    assert lineage_of(store, WS, sid) is None
    assert lineage_of(store, WS, op.target_session_id) == committed.lineage
    listed = {s.session_id: s for s in store.sessions.list_sessions(WS)[0]}
    assert listed[op.target_session_id].lineage == committed.lineage


def test_fork_events_follow_each_durable_step(store: Store, source: tuple[str, list[str]]) -> None:
    sid, turns = source
    events: list[object] = []
    store.db.subscribe(events.append)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
    assert events == [ForkOperationChanged(WS, op.operation_id)]
    events.clear()
    run_to_commit(store, op)
    assert SessionChanged(WS, op.target_session_id) in events
    assert SessionChanged(WS, sid) not in events
    assert events.count(ForkOperationChanged(WS, op.operation_id)) == 3
    events.clear()
    store.fork_commit.commit_fork(WS, op.operation_id)  # replay: nothing changed, nothing published
    assert events == []


def test_a_fork_writes_nothing_of_its_source_and_announces_no_change_of_it(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """No step of a fork (the prepare, durable or at `dispatching`; its transitions; the
    commit; the ACK) writes its source's `sessions` row — the fence is the operation's row and
    `history_fences` — so none emits a change of the source: no Session changed, and its
    `session.upserted` would repeat a row every subscriber already heard (docs/design/store.md,
    "A fork announces no change of its source")."""
    sid, turns = source
    before = store.sessions.get_session(WS, sid)
    events: list[object] = []
    store.db.subscribe(events.append)
    for dispatching in (False, True):
        op, _ = store.fork_prepare.prepare_fork(
            WS, request(sid, turns[-1]), dispatching=dispatching
        )
        if dispatching:
            store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
            assert store.fork_commit.commit_fork(WS, op.operation_id)[1]
        else:
            run_to_commit(store, op)
        store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    after = store.sessions.get_session(WS, sid)
    assert after == before and after.version == before.version
    assert [e for e in events if isinstance(e, SessionChanged) and e.session_id == sid] == []


def test_a_commit_publishes_the_child_once_not_one_event_per_cloned_turn(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """A commit's events do not grow with the child's history (a 1,000-Turn fork publishes no
    `turn.updated` per Turn); the child's `SessionChanged` announces it."""
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(
        WS, request(sid, turns[-1])
    )  # through the 3rd: 3 cloned Turns
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    events: list[object] = []
    store.db.subscribe(events.append)
    _, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed
    assert events == [
        ForkOperationChanged(WS, op.operation_id),
        SessionChanged(WS, op.target_session_id),
    ]
    assert not any(isinstance(e, TurnChanged) for e in events)
    child_turns, _ = store.history.timeline(WS, op.target_session_id)
    assert len(child_turns) == 3  # the Turns are there, read with the timeline


def test_each_transition_and_the_commit_answer_with_the_row_a_read_returns(store: Store) -> None:
    """A transition answers with the row it read plus what it wrote, and the commit
    with the child projected from the plan it built — exactly what a fresh read returns (the
    projection rebuilt from the snapshot alone, law 4); prepare hands back the snapshot's
    frozen (Turn id, binding JSON) of the prefix, which no other read carries."""
    sid = new_session(store, title="123")
    turns = [
        settled_turn(
            store, sid, text=f"t{i}", provider_turn_id=f"p{i}", binding_json=f'{{"b":{i}}}'
        )
        for i in (1, 2, 3)
    ]
    op, created = store.fork_prepare.prepare_fork(WS, request(sid, turns[1].turn_id))
    assert created
    assert op.frozen_turns == ((turns[0].turn_id, '{"b":1}'), (turns[1].turn_id, '{"b":2}'))
    assert store.fork_queries.get_fork_operation(WS, op.operation_id).frozen_turns is None
    op, _ = store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    assert op == store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert op.status is ForkStatus.DISPATCHING and op.dispatched_at_ms is not None
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    op, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed and op.status is ForkStatus.COMMITTED
    read = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert op == read
    assert op.committed_session == read.committed_session and op.lineage == read.lineage
    assert op.committed_session is not None


def test_a_failed_or_unknown_transition_answers_with_the_row_it_wrote(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    for dispatched, mark in (
        (False, store.fork_transitions.mark_fork_failed),
        (True, store.fork_transitions.mark_fork_unknown),
    ):
        op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
        if dispatched:
            store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
        op, changed = mark(WS, op.operation_id, "why")
        assert changed and op.error == "why" and op.completed_at_ms is not None
        assert op == store.fork_queries.get_fork_operation(WS, op.operation_id)


def test_what_prepare_remembers_for_the_commit_belongs_to_its_store(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """The frozen document and the child's history live in the store instance that prepared
    (no process-global cache): another store on the same file holds none, and the commit
    releases both."""
    sid, turns = source
    other = Store.open(store.path)
    try:
        op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[0]))
        assert len(store.db.fork_memo.frozen) == 1 and len(store.db.fork_memo.histories) == 1
        assert len(other.db.fork_memo.frozen) == 0 and len(other.db.fork_memo.histories) == 0
        committed = run_to_commit(store, op)
        assert committed.status == "committed"
        assert len(store.db.fork_memo.frozen) == 0 and len(store.db.fork_memo.histories) == 0
    finally:
        other.close()


def test_a_recovery_commit_derives_the_rule_v2_prefixes_once_as_uuid5_heads(
    store: Store, source: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up recovery commits thousands of leftovers in a store that holds nothing of their
    prepare (`ForkMemo` empty): each commit derives its operation's three rule v2 prefixes
    once (the ids and the final Messages share them), and each prefix is exactly the head
    `uuid.uuid5` gives (`ordinal_prefix` hashes without building a `UUID`)."""
    sid, turns = source
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    derived: list[OrdinalPrefixes] = []
    counted = fork_child.prefixes_of

    def counting(snapshot: Any) -> OrdinalPrefixes:
        derived.append(counted(snapshot))
        return derived[-1]

    monkeypatch.setattr(fork_child, "prefixes_of", counting)
    restarted = Store.open(store.path)  # a fresh process's store: no memo of the prepare
    try:
        key = LeftoverCommit(WS, op.operation_id)
        assert restarted.fork_commit.commit_fork_operations([key]) == (1, 0)
    finally:
        restarted.close()
    assert len(derived) == 1
    committed = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert committed.status is ForkStatus.COMMITTED and committed.target_turn_id is not None
    name = "|".join(("v2", op.operation_id, WS, sid, op.target_session_id))
    for kind, prefix in (("turn", derived[0].turn), ("message", derived[0].message)):
        assert prefix == str(uuid.uuid5(fork_child.IDENTITY_NAMESPACE, f"{name}|{kind}"))[:24]
    assert committed.target_turn_id == fork_child.ordinal_id(derived[0].turn, 2)
    for text in ("", "é|x", "\u2603" * 40, str(uuid.uuid4())):
        for kind in fork_child.EntityKind:
            got = fork_child.ordinal_prefix(text, WS, sid, text[::-1], kind)
            want = "|".join(("v2", text, WS, sid, text[::-1], kind.value))
            assert got == str(uuid.uuid5(fork_child.IDENTITY_NAMESPACE, want))[:24]


def test_the_child_copies_the_source_boundary_row_by_row_with_rule_v2_ids(store: Store) -> None:
    """Snapshot version 4: SQLite copies the boundary's Messages; each child id is the
    operation's rule v2 prefix and the row's ordinal, a UUID in the protocol's 8-4-4-4-12 shape;
    the law the invariant checker holds every committed child to (tests/support/invariants.py
    `history_copy_problem`) holds, and reports a cloned row changed afterwards."""
    sid = new_session(store)
    first = settled_turn(store, sid, text="one", extra=[("reasoning", "r", {"k": [1, "é"]})])
    store.history.append_message(WS, sid, None, kind="notice", text="session-level")
    user = first.messages[0].message_id
    second = settled_turn(
        store, sid, text="two", extra=[("tool_call", "call", {"replyToMessageId": user})]
    )
    settled_turn(store, sid, text="three: after the boundary")
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, second.turn_id))
    committed = run_to_commit(store, op)
    child, _ = store.history.timeline(WS, committed.target_session_id)
    source, _ = store.history.timeline(WS, sid)
    assert len(child) == 2
    for c_turn, s_turn in zip(child, source, strict=False):
        assert uuid.UUID(c_turn.turn_id).version == 5
        assert c_turn.turn_id.endswith(f"-{s_turn.sequence:012x}")
        assert [(m.kind, m.text, m.position) for m in c_turn.messages] == [
            (m.kind, m.text, m.position) for m in s_turn.messages
        ]
        for m in c_turn.messages:
            assert str(uuid.UUID(m.message_id)) == m.message_id
            assert m.message_id.endswith(f"-{m.position:012x}")
    assert child[0].messages[1].payload == {"k": [1, "é"]}
    assert child[1].messages[1].payload == {"replyToMessageId": child[0].messages[0].message_id}
    assert child[-1].turn_id == committed.target_turn_id
    assert child[1].final_assistant_message_id == child[1].messages[-1].message_id

    conn = store.db.connection()
    names, document = _frozen(conn, op, sid, committed.target_session_id)
    assert history_copy_problem(conn, WS, names, document) is None
    # The child reads the row through its history link: a row of its own at that position
    # (which wins over the linked one) with another text.
    conn.execute(
        "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
        " payload_json, version, position, created_at_ms, session_key)"
        " SELECT ?, ?, ?, ?, kind, 'tampered', payload_json, version, position, 0,"
        " (SELECT session_key FROM session_keys WHERE workspace_id = ? AND session_id = ?)"
        " FROM messages WHERE session_id = ? AND position = ?",
        (
            WS, committed.target_session_id, child[0].messages[1].message_id,
            child[0].turn_id, WS, committed.target_session_id, sid,
            child[0].messages[1].position,
        ),
    )  # fmt: skip
    assert "position" in (history_copy_problem(conn, WS, names, document) or "")


def test_the_history_digest_is_every_boundary_row_in_position_order(store: Store) -> None:
    """What prepare freezes and the commit re-proves: SHA-256 over each boundary Message's
    columns, one line per Message in position order (storage/history_links.py), here rebuilt in
    Python from a plain ordered read — the Session-level Message and a later Turn's left out."""
    sid = new_session(store)
    first = settled_turn(store, sid, text="one", extra=[("reasoning", "é\nx", {"k": 1})])
    store.history.append_message(WS, sid, None, kind="notice", text="session-level")
    settled_turn(store, sid, text="two")
    rows = (
        store.db.connection()
        .execute(
            "SELECT position, version, turn_id, message_id, kind, text, payload_json FROM messages"
            " WHERE workspace_id = ? AND session_id = ? AND turn_id = ? ORDER BY position",
            (WS, sid, first.turn_id),
        )
        .fetchall()
    )

    def line(position: int, version: int, turn: str, mid: str, kind: str, text: Any, p: str) -> str:
        body = "-1:" if text is None else f"{len(text.encode())}:{text}"
        return f"{position},{version},{turn},{mid},{kind},{body},{len(p.encode())}:{p}"

    expected = hashlib.sha256("\n".join(line(*r) for r in rows).encode()).hexdigest()
    assert history_digest(store.db.connection(), WS, sid, 1) == (len(rows), expected)
    # Through the last Turn the statement takes every Message of a Turn instead of looking each
    # one's Turn up in the boundary's list: the same rows, the Session-level one still left out;
    # prepare's pass (which also finds the non-empty payload) freezes the same digest.
    every = (
        store.db.connection()
        .execute(
            "SELECT position, version, turn_id, message_id, kind, text, payload_json FROM messages"
            " WHERE workspace_id = ? AND session_id = ? AND turn_id IS NOT NULL ORDER BY position",
            (WS, sid),
        )
        .fetchall()
    )
    whole = hashlib.sha256("\n".join(line(*r) for r in every).encode()).hexdigest()
    assert history_digest(store.db.connection(), WS, sid, 2) == (len(every), whole)
    scan = scan_history(store.db.connection(), WS, sid, 2)
    assert (scan.count, scan.digest, scan.top) == (len(every), whole, every[-1][0])
    assert [(p[1], p[2]) for p in scan.payloads] == [(r[0], {"k": 1}) for r in rows if r[6] != "{}"]


@pytest.mark.parametrize("plain_turns", [1, 12])
def test_prepare_reads_the_messages_it_must_look_at_whether_few_or_many(
    store: Store, plain_turns: int
) -> None:
    """Prepare's pass finds the lanes and non-empty payloads; few are read by position, many by
    one walk of the boundary: either way every one of them, in position order, and no other."""
    sid = new_session(store)
    for i in range(plain_turns):
        settled_turn(store, sid, text=f"plain {i}")
    settled_turn(store, sid, text="a", extra=[("tool_call", "t", {"n": 1}), ("note", "x", {})])
    last = settled_turn(store, sid, text="b", extra=[("tool_call", "u", {"n": 2})]).turn_id
    conn = store.db.connection()
    expected = [
        (str(r[0]), int(r[1]))
        for r in conn.execute(
            "SELECT message_id, position FROM messages WHERE workspace_id = ? AND session_id = ?"
            " AND payload_json != '{}' ORDER BY position",
            (WS, sid),
        )
    ]
    through = conn.execute(
        "SELECT sequence FROM turns WHERE workspace_id = ? AND session_id = ? AND turn_id = ?",
        (WS, sid, last),
    ).fetchone()[0]
    scan = scan_history(conn, WS, sid, int(through))
    assert [(p[0], p[1]) for p in scan.payloads] == expected
    assert [p[2] for p in scan.payloads] == [{"n": 1}, {"n": 2}]
    assert (scan.count, scan.digest) == history_digest(conn, WS, sid, int(through))


def test_a_childs_cloned_turns_and_messages_have_distinct_short_ids(store: Store) -> None:
    """Rule v2 ids end in the ordinal; their first 8 hex digits (the short id the CLI and the
    GUI show, and the start of the unique prefix the CLI accepts) are scrambled by it, so two
    cloned Turns or Messages of one child never share them — and the ids SQLite wrote are the
    ones `ordinal_id` computes (the invariant checker's law holds)."""
    sid = new_session(store)
    turns = [settled_turn(store, sid, text=f"turn {n}") for n in range(6)]
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turns[-1].turn_id))
    committed = run_to_commit(store, op)
    child, _ = store.history.timeline(WS, committed.target_session_id)
    assert len(child) == 6
    short_turns = {t.turn_id[:8] for t in child}
    short_messages = {m.message_id[:8] for t in child for m in t.messages}
    assert len(short_turns) == 6
    assert len(short_messages) == sum(len(t.messages) for t in child)
    conn = store.db.connection()
    names, document = _frozen(conn, op, sid, committed.target_session_id)
    assert history_copy_problem(conn, WS, names, document) is None


def _accepted(store: Store, sid: str, turn_id: str) -> ForkOperation:
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn_id))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    return op


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ("DELETE FROM session_reservations WHERE session_id = ?1", "not reserved"),
        (
            "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
            " title, cwd, settings_json, runtime_context_json, model, pinned, deleted,"
            " created_at_ms, updated_at_ms) SELECT workspace_id, ?1, kind, provider, NULL, title,"
            " cwd, settings_json, runtime_context_json, model, pinned, deleted, created_at_ms,"
            " updated_at_ms FROM sessions WHERE session_id = ?2",
            "already exists",
        ),
    ],
    ids=["unreserved", "target-exists"],
)
def test_the_commit_refuses_a_target_not_reserved_by_it_or_already_there(
    store: Store, source: tuple[str, list[str]], tamper: str, why: str
) -> None:
    sid, turns = source
    op = _accepted(store, sid, turns[0])
    store.db.connection().execute(tamper, (op.target_session_id, sid)[: tamper.count("?")])
    with pytest.raises(ForkSnapshotCorrupt, match=why):
        store.fork_commit.commit_fork(WS, op.operation_id)
    assert (
        store.fork_queries.get_fork_operation(WS, op.operation_id).status
        is ForkStatus.PROVIDER_ACCEPTED
    )


def test_the_commit_refuses_an_operation_whose_snapshot_row_is_missing(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    op = _accepted(store, sid, turns[0])
    conn = store.db.connection()
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute(
        "DELETE FROM fork_snapshots WHERE op_seq ="
        " (SELECT op_seq FROM fork_operations WHERE operation_id = ?)",
        (op.operation_id,),
    )
    conn.execute("PRAGMA foreign_keys = ON")
    with pytest.raises(ForkSnapshotCorrupt, match="row is missing"):
        store.fork_commit.commit_fork(WS, op.operation_id)
    assert find_session(store, WS, op.target_session_id) is None
