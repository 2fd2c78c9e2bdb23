"""Seed 004 §1, §7-§9: new identity and lineage, Copied vs Referenced persistence, cold
resume equivalence, and the frozen boundary of a prepared fork."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.tutti_agent.items import explicit_turn, task_started, user_msg
from tests.tutti_agent.storeutil import append, write_root
from tutti_agent.fork import (
    BeforeTurn,
    ForkBoundary,
    ForkOptions,
    ForkPersistence,
    ForkService,
    Latest,
    ThroughTurn,
)
from tutti_agent.history import (
    ForkSnapshot,
    InterruptedMarker,
    TruncateBeforeNthUserMessage,
    build_turns,
    message_text,
    model_context,
)
from tutti_agent.rollout import LineType, RolloutItem, read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "tutti-home")


def _three_turns_then_mid_turn(store: ThreadStore) -> str:
    return write_root(
        store,
        explicit_turn("t1", "u1", "a1")
        + explicit_turn("t2", "u2", "a2")
        + explicit_turn("t3", "u3", "a3")
        + [task_started("t4", 7), user_msg("u4")],
    )


def test_fork_allocates_new_uuidv7_and_records_direct_source(store: ThreadStore) -> None:
    service = ForkService(store)
    root = write_root(store, explicit_turn("t1", "u1", "a1"))
    child = service.fork(root, ForkOptions()).child
    grandchild = service.fork(child.thread_id, ForkOptions()).child
    assert child.thread_id != root and uuid.UUID(child.thread_id).version == 7
    assert child.forked_from_id == root
    # The direct source, not the root of the chain.
    assert grandchild.forked_from_id == child.thread_id


def test_copied_fork_writes_prefix_then_child_settings(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2"))
    child = (
        ForkService(store)
        .fork(source, ForkOptions(boundary=ThroughTurn("t1"), cwd="/child-cwd"))
        .child
    )
    lines = read_rollout(child.path)
    assert lines[0].item.type == LineType.SESSION_META
    assert lines[0].item.payload["forked_from_id"] == source
    assert lines[0].item.payload.get("history_base") is None
    assert [line.ordinal for line in lines] == list(range(len(lines)))
    # The copied prefix (no second session_meta), then the settings event last.
    assert [line.item for line in lines[1:-1]] == explicit_turn("t1", "u1", "a1")
    assert lines[-1].item.event_type == "thread_settings_applied"
    assert child.effective_settings()["cwd"] == "/child-cwd"
    assert child.history_base is None


def test_referenced_fork_writes_only_child_items_and_history_base(store: ThreadStore) -> None:
    source = _three_turns_then_mid_turn(store)
    child = (
        ForkService(store)
        .fork(source, ForkOptions(boundary=Latest(), persistence=ForkPersistence.REFERENCED))
        .child
    )
    own = read_rollout(child.path)
    meta = own[0].item.payload
    source_lines = read_rollout(store.path_of(source))
    assert meta["forked_from_id"] == source
    assert meta["forked_from_ordinal_exclusive"] == len(source_lines) == own[0].ordinal
    assert meta["history_base"] == {
        "thread_id": source,
        "end_ordinal_exclusive": len(source_lines),
        "end_byte_offset": source_lines[-1].end_byte_offset,
    }
    # Own lines only: settings, then the Interrupted boundary of the unfinished t4.
    assert [line.item.event_type for line in own[1:]] == [
        "thread_settings_applied",
        None,
        "turn_aborted",
    ]
    assert own[-1].item.payload["turn_id"] == "t4"


CASES: list[tuple[ForkBoundary, ForkSnapshot | None]] = [
    (Latest(), None),
    (ThroughTurn("t2"), None),
    (BeforeTurn("t3"), None),
    (BeforeTurn("t1"), None),
    (Latest(), TruncateBeforeNthUserMessage(1)),
    (Latest(), TruncateBeforeNthUserMessage(9)),
]


@pytest.mark.parametrize(("boundary", "snapshot"), CASES)
def test_cold_resume_of_copied_and_referenced_children_yields_same_model_context(
    tmp_path: Path, boundary: ForkBoundary, snapshot: ForkSnapshot | None
) -> None:
    store = ThreadStore(tmp_path / "tutti-home")
    source = _three_turns_then_mid_turn(store)
    service = ForkService(store)
    ids = {
        p: service.fork(
            source, ForkOptions(boundary=boundary, snapshot=snapshot, persistence=p)
        ).child.thread_id
        for p in ForkPersistence
    }
    cold = ThreadStore(tmp_path / "tutti-home")  # a fresh process's view of the same home
    copied = cold.load(ids[ForkPersistence.COPIED])
    referenced = cold.load(ids[ForkPersistence.REFERENCED])
    assert model_context(copied.items) == model_context(referenced.items)
    summary = [(t.id, t.status) for t in build_turns(copied.items)]
    assert summary == [(t.id, t.status) for t in build_turns(referenced.items)]


def test_out_of_range_truncation_of_mid_turn_source_drops_only_unfinished_turn(
    store: ThreadStore,
) -> None:
    source = _three_turns_then_mid_turn(store)
    child = (
        ForkService(store).fork(source, ForkOptions(snapshot=TruncateBeforeNthUserMessage(9))).child
    )
    assert [(t.id, str(t.status)) for t in build_turns(child.items)] == [
        ("t1", "completed"),
        ("t2", "completed"),
        ("t3", "completed"),
    ]


def test_latest_fork_of_mid_turn_source_closes_turn_as_interrupted(store: ThreadStore) -> None:
    source = _three_turns_then_mid_turn(store)
    child = ForkService(store).fork(source, ForkOptions()).child
    turns = build_turns(child.items)
    assert (turns[-1].id, str(turns[-1].status)) == ("t4", "interrupted")
    refork = ForkService(store).fork(child.thread_id, ForkOptions()).child
    aborts = [it for it in refork.items if it.event_type == "turn_aborted"]
    assert len(aborts) == 1


def test_disabled_marker_fork_appends_only_turn_aborted(store: ThreadStore) -> None:
    source = _three_turns_then_mid_turn(store)
    child = ForkService(store).fork(source, ForkOptions(marker=InterruptedMarker.DISABLED)).child
    texts = [message_text(p) for p in model_context(child.items)]
    assert not any(t.startswith("<turn_aborted>") for t in texts)
    assert child.items[-2].event_type == "turn_aborted"


def test_fork_never_writes_to_the_source(store: ThreadStore) -> None:
    source = _three_turns_then_mid_turn(store)
    before = store.path_of(source).read_bytes()
    service = ForkService(store)
    for p in ForkPersistence:
        service.fork(source, ForkOptions(persistence=p))
        service.fork(source, ForkOptions(boundary=ThroughTurn("t2"), persistence=p))
    assert store.path_of(source).read_bytes() == before


def test_prepared_fork_sees_frozen_boundary_not_later_source_appends(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    service = ForkService(store)
    for persistence in ForkPersistence:
        prepared = service.prepare(source, Latest())
        late = f"late message {persistence}"
        append(store, source, explicit_turn(f"late-{persistence}", late, "x"))
        try:
            child = service.materialize(prepared, ForkOptions(persistence=persistence)).child
        finally:
            prepared.reservation.release()
        texts = [message_text(p) for p in model_context(child.items)]
        assert late not in texts and "u1" in texts


def test_copied_child_survives_source_deletion(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    child = ForkService(store).fork(source, ForkOptions()).child
    store.delete(source)
    assert [t.id for t in build_turns(store.load(child.thread_id).items)] == ["t1"]


def test_in_range_truncation_leaves_no_phantom_turn_in_the_child(store: ThreadStore) -> None:
    source = _three_turns_then_mid_turn(store)
    for n, expected in [(1, ["t1"]), (2, ["t1", "t2"]), (3, ["t1", "t2", "t3"])]:
        for persistence in ForkPersistence:
            child = (
                ForkService(store)
                .fork(
                    source,
                    ForkOptions(snapshot=TruncateBeforeNthUserMessage(n), persistence=persistence),
                )
                .child
            )
            turns = build_turns(child.items)
            assert [t.id for t in turns] == expected
            assert all(str(t.status) == "completed" for t in turns)


def _settings(cwd: str, model: str) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {"type": "thread_settings_applied", "thread_settings": {"cwd": cwd, "model": model}},
    )


@pytest.mark.parametrize("persistence", list(ForkPersistence))
@pytest.mark.parametrize(
    "snapshot", [None, TruncateBeforeNthUserMessage(1), TruncateBeforeNthUserMessage(9)]
)
@pytest.mark.parametrize("own", [{}, {"cwd": "/elsewhere", "model": "other"}])
def test_the_fork_knows_the_childs_settings_as_a_pass_over_its_lines_finds_them(
    store: ThreadStore,
    persistence: ForkPersistence,
    snapshot: ForkSnapshot | None,
    own: dict[str, str],
) -> None:
    """The reply's settings come from the fork, not from a pass over the child's lines (a
    10,000-Turn child's 60,000): they are what that pass returns, mid-turn or settled,
    Copied or Referenced, with or without the caller's own cwd and model."""
    root = write_root(
        store,
        [_settings("/first", "m1"), *explicit_turn("t1", "u1", "a1"), _settings("/second", "m2")]
        + explicit_turn("t2", "u2", "a2")
        + [task_started("t3", 7), user_msg("u3")],
    )
    result = ForkService(store).fork(
        root, ForkOptions(persistence=persistence, snapshot=snapshot, **own)
    )
    assert result.settings == result.child.effective_settings()
    assert result.settings == store.load(result.child.thread_id).effective_settings()
    assert result.settings is not None and result.settings["cwd"] == own.get("cwd", "/second")
