"""The store's side of the checkpoint size cap (docs/design/workspace.md): which Turns it
may drop, in which order, and the write that says so on a Turn — refused while a fork not
yet finished goes through that Turn (real SQLite files)."""

from __future__ import annotations

import json
import uuid

from store_builders import WS, new_session

from storage.models import ForkPrepareRequest
from storage.store import Store


def _checkpointed_turn(store: Store, sid: str, tree: str) -> tuple[str, str]:
    turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "hi")
    store.turns.bind_provider_turn(WS, sid, turn.turn_id, f"pt-{uuid.uuid4().hex[:8]}", None)
    record = json.dumps({"cwd": "/w", "before": f"{tree}-0", "after": tree, "changedFiles": []})
    assert store.turns.record_settlement(
        WS, sid, turn.turn_id, outcome="completed", checkpoint_json=record
    )
    return turn.turn_id, record


def _fork_through(store: Store, sid: str, turn_id: str) -> str:
    op, _ = store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=f"req-{uuid.uuid4()}",
            target_session_id=str(uuid.uuid4()),
            turn_id=turn_id,
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
            runtime_identity={},
        ),
    )
    return op.operation_id


def test_the_oldest_sessions_oldest_turns_come_first_and_deleted_sessions_never(
    store: Store,
) -> None:
    old = new_session(store)
    t1, _ = _checkpointed_turn(store, old, "a1")
    new = new_session(store)
    n1, _ = _checkpointed_turn(store, new, "b1")
    t2, _ = _checkpointed_turn(store, old, "a2")
    gone = new_session(store)
    _checkpointed_turn(store, gone, "c1")
    store.sessions.delete_session(WS, gone)
    order = [turn for _ws, _sid, turn, _rec in store.turns.droppable_checkpoints(10)]
    assert order == [t1, t2, n1]


def test_a_drop_is_refused_while_a_fork_through_the_turn_is_not_finished(store: Store) -> None:
    sid = new_session(store)
    turn_id, record = _checkpointed_turn(store, sid, "a1")
    op_id = _fork_through(store, sid, turn_id)  # prepared: its tree is planned from the record
    assert not store.turns.mark_checkpoint_dropped(WS, sid, turn_id, record, "dropped for the cap")
    assert store.turns.turn_checkpoint(WS, sid, turn_id) == json.loads(record)

    store.fork_transitions.mark_fork_failed(
        WS, op_id, "given up"
    )  # finished: nothing reads it any more
    assert store.turns.mark_checkpoint_dropped(WS, sid, turn_id, record, "dropped for the cap")
    assert store.turns.turn_checkpoint(WS, sid, turn_id) == {
        "state": "unavailable",
        "reason": "dropped",
        "message": "dropped for the cap",
    }
    # Said once: a second drop of the record it read before changes nothing.
    assert not store.turns.mark_checkpoint_dropped(WS, sid, turn_id, record, "again")
    assert turn_id not in [t for _w, _s, t, _r in store.turns.droppable_checkpoints(10)]


def test_a_sessions_checkpoint_trees_are_those_its_records_name_until_dropped(
    store: Store,
) -> None:
    """What a Session's shared tree refs must keep (the size cap asks before dropping one):
    every tree a Turn record names, a dropped record's no more, another Session's never."""
    sid = new_session(store)
    t1, r1 = _checkpointed_turn(store, sid, "a1")
    _checkpointed_turn(store, sid, "a2")
    _checkpointed_turn(store, new_session(store), "b1")
    assert store.turns.session_checkpoint_trees(WS, sid) == {"a1-0", "a1", "a2-0", "a2"}
    assert store.turns.mark_checkpoint_dropped(WS, sid, t1, r1, "dropped for the cap")
    assert store.turns.session_checkpoint_trees(WS, sid) == {"a2-0", "a2"}
