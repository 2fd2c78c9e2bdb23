"""Property tests for the identity remap (law 5): random histories on a real store file.

For any history and boundary: the mapping is injective and disjoint from the source ids, a
replay yields the same ids, and every allowlisted reference resolves inside the child to the
twin of what it pointed at; a reference outside the boundary fails closed at prepare.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from storage.fork_child import (
    IDENTITY_NAMESPACE,
    IDENTITY_RULE_VERSION,
    REFERENCE_KEYS,
    EntityKind,
    ForkReferenceError,
    build_child,
    build_identity_map,
    child_id,
    is_typed_reference_key,
    remap_references,
)
from storage.fork_snapshot import load_snapshot
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store

pytestmark = pytest.mark.timeout(120)

# A reference in a history: (key, kind of target, index of the target's turn, slot in turn).
ref = st.tuples(
    st.sampled_from(["replyToMessageId", "toolCallMessageId", "parentMessageId", "turnId"]),
    st.integers(0, 4),
    st.integers(0, 2),
)
# References are host-owned payload keys, so one message holds each key at most once.
turn_plan = st.lists(st.lists(ref, max_size=2, unique_by=lambda r: r[0]), min_size=0, max_size=3)
history_plan = st.tuples(st.lists(turn_plan, min_size=1, max_size=5), st.data())


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    store = Store.open(Path(tmp_path_factory.mktemp("remap")) / "store.sqlite3")
    yield store
    store.close()


def _walk_refs(value: Any, found: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if k in REFERENCE_KEYS and isinstance(v, str):
                found.append((k, v))
            else:
                _walk_refs(v, found)
    elif isinstance(value, list):
        for v in value:
            _walk_refs(v, found)


@settings(
    max_examples=35,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=history_plan)
def test_remap_is_injective_stable_and_every_reference_resolves_in_the_child(
    shared_store: Store, plan: tuple[list[list[list[tuple[str, int, int]]]], Any]
) -> None:
    turns_plan, data = plan
    store = shared_store
    ws = f"ws-{uuid.uuid4()}"
    sid = str(uuid.uuid4())
    store.sessions.create_session(ws, session_id=sid, provider="p", title="T", cwd="/", settings={})
    store.sessions.update_runtime(ws, sid, provider_session_id="ps")
    n = len(turns_plan)
    # Message ids are chosen up front so a payload may point forward (outside a boundary).
    message_ids = [[f"{sid}-m{t}-{k}" for k in range(3)] for t in range(n)]
    turn_ids: list[str] = []
    for t, messages in enumerate(turns_plan):
        turn, _ = store.turns.claim_submit(ws, sid, f"r{t}", f"user {t}")
        turn_ids.append(turn.turn_id)
        store.turns.bind_provider_turn(ws, sid, turn.turn_id, f"p{t}")
        for k in range(3):
            refs = messages[k] if k < len(messages) else []
            payload: dict[str, Any] = {}
            for key, target_turn, slot in refs:
                if key == "turnId":
                    target_turn = min(target_turn, t)  # turn ids exist only once created
                    value = turn_ids[target_turn]
                else:
                    target_turn = min(target_turn, n - 1)
                    value = message_ids[target_turn][slot]
                payload[key] = value
            store.history.append_message(
                ws,
                sid,
                turn.turn_id,
                kind="assistant",
                text=f"mentions {value if refs else 'nothing'}",
                payload=payload,
                message_id=message_ids[t][k],
            )
        store.turns.settle_turn(ws, sid, turn.turn_id, outcome="completed")
    boundary = data.draw(st.integers(0, n - 1), label="boundary")
    refs_beyond = any(
        min(tt if key != "turnId" else min(tt, t), n - 1) > boundary
        for t, messages in enumerate(turns_plan[: boundary + 1])
        for k, refs in enumerate(messages[:3])
        for key, tt, _slot in refs
    )
    req = ForkPrepareRequest(
        source_session_id=sid,
        request_id="r",
        target_session_id=f"{sid}-child",
        turn_id=turn_ids[boundary],
        driver_kind="p",
        driver_version="1",
        binding_mode="host_copy",
    )
    event("dangling" if refs_beyond else "committed")
    if refs_beyond:
        with pytest.raises(ForkReferenceError) as err:
            store.fork_prepare.prepare_fork(ws, req)
        assert err.value.params["forkReferenceError"] == "dangling_reference"
        return
    op, _ = store.fork_prepare.prepare_fork(ws, req)
    store.fork_transitions.mark_fork_dispatching(ws, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(
        ws,
        op.operation_id,
        ProviderForkEvidence(
            child_provider_session_id="pc",
            provider_turn_ids=op.source_provider_turn_ids,
            binding_mode="host_copy",
            receipt={"forkedFromId": "ps"},
        ),
    )
    committed, _ = store.fork_commit.commit_fork(ws, op.operation_id)
    child_sid = committed.target_session_id

    source_turns, _ = store.history.timeline(ws, sid, limit=1000)
    child_turns, _ = store.history.timeline(ws, child_sid, limit=1000)
    assert len(child_turns) == boundary + 1
    source_ids = {t.turn_id for t in source_turns} | {
        m.message_id for t in source_turns for m in t.messages
    }
    child_ids = [t.turn_id for t in child_turns] + [
        m.message_id for t in child_turns for m in t.messages
    ]
    assert len(child_ids) == len(set(child_ids))  # injective
    assert source_ids.isdisjoint(child_ids)

    # Twins: same sequence for turns, same position for messages.
    twin_turn = {c.turn_id: s.turn_id for c, s in zip(child_turns, source_turns, strict=False)}
    child_by_pos = {m.message_id: m.position for t in child_turns for m in t.messages}
    source_by_pos = {m.position: m.message_id for t in source_turns for m in t.messages}
    for c, s in zip(child_turns, source_turns, strict=False):
        for cm, sm in zip(c.messages, s.messages, strict=True):
            child_refs: list[tuple[str, str]] = []
            source_refs: list[tuple[str, str]] = []
            _walk_refs(cm.payload, child_refs)
            _walk_refs(sm.payload, source_refs)
            assert len(child_refs) == len(source_refs)
            for (key, child_value), (_, source_value) in zip(child_refs, source_refs, strict=True):
                if key == "turnId":
                    assert twin_turn[child_value] == source_value
                else:
                    assert source_by_pos[child_by_pos[child_value]] == source_value
            # Free text is never rewritten.
            assert cm.text == sm.text

    # Replay: the same snapshot yields the same ids.
    raw = (
        store.db.connection()
        .execute(
            "SELECT s.snapshot_json, o.snapshot_hash FROM fork_operations o JOIN fork_snapshots s"
            " USING (op_seq) WHERE o.workspace_id = ? AND o.operation_id = ?",
            (ws, op.operation_id),
        )
        .fetchone()
    )
    replay = build_child(
        load_snapshot(raw[0], raw[1]),
        child_provider_session_id="pc",
        binding_mode="host_copy",
        turn_bindings=None,
        committed_at_ms=0,
    )
    assert [r[2] for r in replay.turn_rows] == [t.turn_id for t in child_turns]
    again, changed = store.fork_commit.commit_fork(ws, op.operation_id)
    assert not changed and again == committed


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12))
safe_key = st.text(alphabet="abcdefghijklmnopqrstuvwxyzXY_", min_size=1, max_size=10).filter(
    lambda k: not is_typed_reference_key(k) and k not in REFERENCE_KEYS and k != "$ref"
)
json_value = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(safe_key, children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(value=json_value, ids=st.lists(st.uuids().map(str), min_size=1, max_size=5, unique=True))
def test_payload_without_typed_references_is_left_byte_identical(
    value: Any, ids: list[str]
) -> None:
    mapping = build_identity_map("op", "ws", "s", "t", ids, ids, ids)
    assert remap_references(value, mapping, where="test") == value


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.uuids().map(str), min_size=1, max_size=30, unique=True),
    op=st.uuids().map(str),
)
def test_identity_map_is_injective_across_kinds_and_deterministic(ids: list[str], op: str) -> None:
    first = build_identity_map(op, "ws", "s", "t", ids, ids, ids)
    second = build_identity_map(op, "ws", "s", "t", ids, ids, ids)
    assert first == second
    targets = [*first.turns.values(), *first.messages.values(), *first.interactions.values()]
    assert len(targets) == len(set(targets)) == 3 * len(ids)
    assert set(targets).isdisjoint(ids)
    other = build_identity_map(op, "ws", "s", "other-target", ids, ids, ids)
    assert set(other.turns.values()).isdisjoint(first.turns.values())


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(st.text(max_size=40), min_size=5, max_size=5), kind=st.sampled_from(EntityKind)
)
def test_child_ids_are_the_documented_uuid5(fields: list[str], kind: EntityKind) -> None:
    # docs/design/store.md: uuid5(NS, "v1|<operation>|<workspace>|<source>|<target>|<kind>|<id>").
    # The fast minter must never drift from it: a replayed commit recomputes these ids.
    op, ws, source, target, source_id = fields
    name = "|".join((IDENTITY_RULE_VERSION, op, ws, source, target, kind.value, source_id))
    expected = str(uuid.uuid5(IDENTITY_NAMESPACE, name))
    assert child_id(op, ws, source, target, kind, source_id) == expected
    minted = build_identity_map(op, ws, source, target, [source_id], [], [])
    if kind is EntityKind.TURN:
        assert minted.turns[source_id] == expected


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.uuids().map(str), min_size=1, max_size=5, unique=True))
def test_duplicate_source_ids_fail_closed(ids: list[str]) -> None:
    with pytest.raises(ForkReferenceError) as err:
        build_identity_map("op", "ws", "s", "t", [*ids, ids[0]], [], [])
    assert err.value.params["forkReferenceError"] == "duplicate_key"
