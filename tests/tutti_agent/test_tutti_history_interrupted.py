"""Seed 004 §6, §12.2: the Interrupted snapshot and its marker variants."""

from __future__ import annotations

import pytest

from tests.tutti_agent.items import (
    assistant_msg,
    explicit_turn,
    task_started,
    user_msg,
)
from tutti_agent.history import (
    TURN_ABORTED_MARKER_TEXT,
    Interrupted,
    InterruptedMarker,
    append_interrupted_boundary,
    fork_history_from_snapshot,
    message_text,
    snapshot_turn_state,
    turn_aborted_item,
)
from tutti_agent.rollout import RolloutItem

pytestmark = pytest.mark.timeout(60)


def _markers(items: list[RolloutItem]) -> int:
    return sum(
        1
        for it in items
        if it.payload.get("type") == "message"
        and message_text(it.payload) == TURN_ABORTED_MARKER_TEXT
    )


def _aborts(items: list[RolloutItem]) -> int:
    return sum(1 for it in items if it.event_type == "turn_aborted")


def test_interrupted_fork_snapshot_appends_interrupt_boundary() -> None:
    out = append_interrupted_boundary(
        [user_msg("hello")], None, None, InterruptedMarker.CONTEXTUAL_USER
    )
    assert out[0] == user_msg("hello")
    # The model-visible marker precedes the protocol terminal event.
    assert out[1].payload["role"] == "user"
    assert message_text(out[1].payload) == TURN_ABORTED_MARKER_TEXT
    assert out[2] == turn_aborted_item(None, None)
    assert out[2].payload["reason"] == "interrupted"
    assert len(out) == 3


def test_interrupted_boundary_on_empty_history_starts_a_new_vector() -> None:
    out = append_interrupted_boundary([], "t9", 5, InterruptedMarker.CONTEXTUAL_USER)
    assert [it.event_type for it in out] == [None, "turn_aborted"]
    assert out[1].payload["turn_id"] == "t9" and out[1].payload["started_at"] == 5


def test_disabled_marker_appends_only_turn_aborted() -> None:
    out = append_interrupted_boundary([user_msg("hello")], "t1", 1, InterruptedMarker.DISABLED)
    assert out == [user_msg("hello"), turn_aborted_item("t1", 1)]


def test_developer_marker_uses_developer_role() -> None:
    out = append_interrupted_boundary([user_msg("hello")], "t1", 1, InterruptedMarker.DEVELOPER)
    assert out[1].payload["role"] == "developer"
    assert out[2].event_type == "turn_aborted"


def test_interrupted_snapshot_keeps_explicit_turn_id_and_start() -> None:
    items = explicit_turn("t1", "u1", "a1") + [task_started("t2", 42), user_msg("u2")]
    out = fork_history_from_snapshot(Interrupted(), items, InterruptedMarker.CONTEXTUAL_USER)
    assert out[: len(items)] == items
    assert out[-1].payload["turn_id"] == "t2"
    assert out[-1].payload["started_at"] == 42


def test_interrupted_snapshot_of_legacy_history_does_not_invent_turn_id() -> None:
    items = [user_msg("u1"), assistant_msg("partial")]
    out = fork_history_from_snapshot(Interrupted(), items, InterruptedMarker.CONTEXTUAL_USER)
    assert out[-1].event_type == "turn_aborted"
    assert out[-1].payload["turn_id"] is None


def test_interrupted_snapshot_at_terminal_boundary_adds_nothing() -> None:
    items = explicit_turn("t1", "u1", "a1")
    assert (
        fork_history_from_snapshot(Interrupted(), items, InterruptedMarker.CONTEXTUAL_USER) == items
    )


def test_refork_of_interrupted_snapshot_does_not_duplicate_marker_or_abort() -> None:
    items = explicit_turn("t1", "u1", "a1") + [task_started("t2"), user_msg("u2")]
    first = fork_history_from_snapshot(Interrupted(), items, InterruptedMarker.CONTEXTUAL_USER)
    assert not snapshot_turn_state(first).ends_mid_turn
    second = fork_history_from_snapshot(Interrupted(), first, InterruptedMarker.CONTEXTUAL_USER)
    assert second == first
    assert _markers(second) == 1 and _aborts(second) == 1


def test_interrupted_snapshot_never_mutates_the_source_sequence() -> None:
    items = [task_started("t1"), user_msg("u1")]
    before = list(items)
    fork_history_from_snapshot(Interrupted(), items, InterruptedMarker.CONTEXTUAL_USER)
    assert items == before
