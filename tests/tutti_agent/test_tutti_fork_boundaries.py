"""Seed 004 §9, §12.3: named boundaries, history_base, and lineage rejections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tutti_agent.items import (
    assistant_msg,
    explicit_turn,
    task_complete,
    task_started,
    user_msg,
)
from tests.tutti_agent.storeutil import append, write_root
from tutti_agent.errors import (
    LineageError,
    NoRolloutFound,
    TurnInProgress,
    TurnNotFound,
    TurnStartMissing,
)
from tutti_agent.fork import (
    BeforeTurn,
    ForkOptions,
    ForkPersistence,
    ForkService,
    Latest,
    ThroughTurn,
)
from tutti_agent.history import build_turns, message_text
from tutti_agent.rollout import RolloutItem, read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "tutti-home")


def _has_user(items: tuple[RolloutItem, ...] | list[RolloutItem], text: str) -> bool:
    return any(
        it.payload.get("role") == "user" and message_text(it.payload) == text for it in items
    )


def _prepare(service: ForkService, thread_id: str, boundary: object):  # type: ignore[no-untyped-def]
    prepared = service.prepare(thread_id, boundary)  # type: ignore[arg-type]
    prepared.reservation.release()
    return prepared


def test_referenced_paginated_rollout_projects_inherited_ordinal_range(store: ThreadStore) -> None:
    service = ForkService(store)
    ancestor = write_root(store, explicit_turn("source-turn", "source message", "a1"))
    child = service.fork(
        ancestor, ForkOptions(boundary=Latest(), persistence=ForkPersistence.REFERENCED)
    ).child
    history_base = child.history_base
    assert history_base is not None and history_base.thread_id == ancestor
    append(store, child.thread_id, explicit_turn("child-turn", "child message", "a2"))

    latest_base = _prepare(service, child.thread_id, Latest()).history_base
    assert latest_base is not None and latest_base.thread_id == child.thread_id
    table = [
        (Latest(), latest_base),
        (ThroughTurn("source-turn"), history_base),
        (BeforeTurn("child-turn"), history_base),
        (ThroughTurn("child-turn"), latest_base),
        (BeforeTurn("source-turn"), None),
    ]
    for boundary, expected in table:
        prepared = _prepare(service, child.thread_id, boundary)
        assert prepared.history_base == expected, boundary
        assert _has_user(prepared.model_context, "source message") == (expected is not None)
        assert _has_user(prepared.model_context, "child message") == (expected == latest_base)


def test_boundary_at_segment_start_falls_back_to_previous_segment_end(store: ThreadStore) -> None:
    service = ForkService(store)
    ancestor = write_root(store, explicit_turn("t1", "u1", "a1"))
    child = service.fork(ancestor, ForkOptions(persistence=ForkPersistence.REFERENCED)).child
    # The child segment holds only its header: Latest on it must not reference it.
    prepared = _prepare(service, child.thread_id, Latest())
    assert prepared.history_base == child.history_base
    grandchild = service.fork(
        child.thread_id, ForkOptions(persistence=ForkPersistence.REFERENCED)
    ).child
    assert grandchild.history_base == child.history_base
    assert [t.id for t in build_turns(grandchild.items)] == ["t1"]


def test_through_turn_rejects_in_progress_turn(store: ThreadStore) -> None:
    source = write_root(
        store, explicit_turn("t1", "u1", "a1") + [task_started("t2"), user_msg("u2")]
    )
    with pytest.raises(TurnInProgress, match="lastTurnId 't2' identifies an in-progress turn"):
        ForkService(store).prepare(source, ThroughTurn("t2"))
    assert not store.is_reserved(source)


def test_unknown_turn_is_rejected_not_approximated(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    for boundary in (ThroughTurn("nope"), BeforeTurn("nope")):
        with pytest.raises(TurnNotFound, match="turn not found: nope"):
            ForkService(store).prepare(source, boundary)


def test_before_turn_without_persisted_start_is_rejected(store: ThreadStore) -> None:
    # A turn named only by its terminal event (its start was never persisted).
    source = write_root(store, [user_msg("u1"), assistant_msg("a1"), task_complete("t-legacy")])
    turns = build_turns(store.load(source).items)
    assert turns[0].id == "t-legacy" and turns[0].start_index is None
    service = ForkService(store)
    with pytest.raises(TurnStartMissing, match="'t-legacy' has no persisted start boundary"):
        service.prepare(source, BeforeTurn("t-legacy"))
    assert not store.is_reserved(source)
    # Its end is persisted, so ThroughTurn is fine.
    assert _prepare(service, source, ThroughTurn("t-legacy")).end_ordinal_exclusive == 4


def test_through_turn_keeps_source_turn_ids_and_drops_later_turns(store: ThreadStore) -> None:
    source = write_root(
        store,
        explicit_turn("t1", "u1", "a1")
        + explicit_turn("t2", "u2", "a2")
        + explicit_turn("t3", "u3", "a3"),
    )
    for persistence in ForkPersistence:
        child = (
            ForkService(store)
            .fork(source, ForkOptions(boundary=ThroughTurn("t2"), persistence=persistence))
            .child
        )
        assert [t.id for t in build_turns(child.items)] == ["t1", "t2"]
        assert child.forked_from_id == source


def test_missing_source_rollout_in_lineage_is_rejected(store: ThreadStore) -> None:
    service = ForkService(store)
    source = write_root(store, explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2"))
    child = service.fork(
        source, ForkOptions(boundary=ThroughTurn("t1"), persistence=ForkPersistence.REFERENCED)
    ).child
    store.path_of(source).rename(store.home / "moved-away.jsonl")
    with pytest.raises(LineageError, match=f"lineage for {source}: missing source rollout"):
        store.load(child.thread_id)
    with pytest.raises(LineageError):
        service.prepare(child.thread_id, Latest())


def _rewrite_meta(path: Path, **changes: object) -> None:
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["payload"].update(changes)
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n")


def test_metadata_thread_id_mismatch_is_rejected(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    _rewrite_meta(store.path_of(source), id="01a00000-0000-7000-8000-000000000000")
    with pytest.raises(LineageError, match="session_meta id does not match"):
        store.load(source)


def test_lineage_cycle_is_rejected(store: ThreadStore) -> None:
    service = ForkService(store)
    a = write_root(store, explicit_turn("t1", "u1", "a1"))
    b = service.fork(a, ForkOptions(persistence=ForkPersistence.REFERENCED)).child
    append(store, b.thread_id, explicit_turn("t2", "u2", "a2"))
    c = service.fork(b.thread_id, ForkOptions(persistence=ForkPersistence.REFERENCED)).child
    assert c.history_base is not None and c.history_base.thread_id == b.thread_id
    # Point b's base at c: b -> c -> b.
    lines = read_rollout(store.path_of(c.thread_id))
    _rewrite_meta(
        store.path_of(b.thread_id),
        history_base={
            "thread_id": c.thread_id,
            "end_ordinal_exclusive": lines[-1].ordinal + 1,
            "end_byte_offset": lines[-1].end_byte_offset,
        },
    )
    with pytest.raises(LineageError, match="lineage cycle"):
        store.load(c.thread_id)


def test_history_base_beyond_source_cutoff_is_rejected(store: ThreadStore) -> None:
    service = ForkService(store)
    a = write_root(store, explicit_turn("t1", "u1", "a1"))
    b = service.fork(a, ForkOptions(persistence=ForkPersistence.REFERENCED)).child
    assert b.history_base is not None
    _rewrite_meta(
        store.path_of(b.thread_id),
        history_base={**b.history_base.to_json(), "end_byte_offset": 3},
    )
    with pytest.raises(LineageError, match="byte offset"):
        store.load(b.thread_id)


def test_unknown_source_is_no_rollout_found(store: ThreadStore) -> None:
    with pytest.raises(NoRolloutFound, match="no rollout found for thread id x-1"):
        ForkService(store).prepare("x-1", Latest())
