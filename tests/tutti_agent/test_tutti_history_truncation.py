"""Seed 004 §4-§5, §12.1: Nth-real-user-message truncation and the snapshot turn state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tutti_agent.items import (
    assistant_msg,
    env_context,
    error_event,
    explicit_turn,
    function_call,
    function_output,
    instructions,
    reasoning,
    task_complete,
    task_started,
    turn_aborted,
    user_msg,
)
from tutti_agent.history import (
    InterruptedMarker,
    SnapshotTurnState,
    TruncateBeforeNthUserMessage,
    fork_history_from_snapshot,
    is_real_user_message,
    snapshot_turn_state,
    truncate_before_nth_user_message,
    user_message_positions,
)
from tutti_agent.rollout import RolloutItem

pytestmark = pytest.mark.timeout(60)

STABLE = SnapshotTurnState()
U1_A4 = [
    user_msg("u1"),
    assistant_msg("a1"),
    assistant_msg("a2"),
    user_msg("u2"),
    assistant_msg("a3"),
    reasoning(),
    function_call(),
    assistant_msg("a4"),
]


def test_truncates_before_requested_user_message() -> None:
    # n=1 stops strictly before u2: reasoning/tool items are not new user turns.
    assert truncate_before_nth_user_message(U1_A4, 1, STABLE) == U1_A4[:3]


def test_n_equal_to_user_count_at_stable_boundary_keeps_full_history() -> None:
    assert truncate_before_nth_user_message(U1_A4, 2, STABLE) == U1_A4


def test_n_zero_cuts_before_first_user_message_keeping_contextual_prefix() -> None:
    items = [env_context(), instructions(), user_msg("u1"), assistant_msg("a1")]
    assert truncate_before_nth_user_message(items, 0, STABLE) == items[:2]


def test_contextual_wrappers_are_not_counted_as_user_turns() -> None:
    items = [env_context(), user_msg("u1"), instructions(), user_msg("u2"), assistant_msg("a")]
    assert user_message_positions(items) == [1, 3]
    assert truncate_before_nth_user_message(items, 1, STABLE) == items[:3]


def test_out_of_range_truncation_at_stable_boundary_keeps_everything() -> None:
    items = explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2")
    state = snapshot_turn_state(items)
    assert not state.ends_mid_turn
    assert truncate_before_nth_user_message(items, 7, state) == items


def test_out_of_range_truncation_drops_only_unfinished_suffix_mid_turn() -> None:
    # Explicit lifecycle: cut at the active turn's task_started, not at its user message.
    items = explicit_turn("t1", "u1", "a1") + [task_started("t2"), env_context(), user_msg("u2")]
    state = snapshot_turn_state(items)
    assert state.ends_mid_turn and state.active_turn_start_index == 4
    assert truncate_before_nth_user_message(items, 2, state) == items[:4]
    assert truncate_before_nth_user_message(items, 99, state) == items[:4]


def test_in_range_truncation_mid_turn_still_cuts_before_nth_user_message() -> None:
    items = explicit_turn("t1", "u1", "a1") + [task_started("t2"), user_msg("u2")]
    state = snapshot_turn_state(items)
    assert truncate_before_nth_user_message(items, 1, state) == items[:5]
    assert truncate_before_nth_user_message(items, 0, state) == items[:1]


def test_legacy_mid_turn_out_of_range_cuts_at_last_user_message() -> None:
    items = [user_msg("u1"), assistant_msg("a1"), task_complete(None), user_msg("u2"), reasoning()]
    state = snapshot_turn_state(items)
    assert state == SnapshotTurnState(ends_mid_turn=True)
    assert truncate_before_nth_user_message(items, 5, state) == items[:3]


def test_no_user_messages_and_no_active_boundary_keeps_non_user_history() -> None:
    items = [env_context(), instructions()]
    state = snapshot_turn_state(items)
    assert not state.ends_mid_turn
    assert truncate_before_nth_user_message(items, 0, state) == items
    assert truncate_before_nth_user_message(items, 3, state) == items


def test_empty_result_is_a_new_empty_history() -> None:
    items = [user_msg("u1"), assistant_msg("a1")]
    forked = fork_history_from_snapshot(
        TruncateBeforeNthUserMessage(0), items, InterruptedMarker.CONTEXTUAL_USER
    )
    assert forked == []


def test_snapshot_state_uses_explicit_lifecycle_before_legacy_fallback() -> None:
    # The active explicit turn has a user message followed by a terminal event of an
    # *earlier* legacy shape; the explicit reducer decides, not the fallback scan.
    items = [task_started("t1"), user_msg("u1"), assistant_msg("a1")]
    state = snapshot_turn_state(items)
    assert state == SnapshotTurnState(True, "t1", 1, 0)


def test_snapshot_state_terminal_reducer_status_is_not_mid_turn() -> None:
    # An error already settled the active turn as failed: not mid-turn despite no complete.
    items = [task_started("t1"), user_msg("u1"), error_event("boom")]
    assert snapshot_turn_state(items) == SnapshotTurnState()


def test_legacy_fallback_never_invents_a_turn_id() -> None:
    state = snapshot_turn_state([user_msg("u1"), assistant_msg("a1")])
    assert state.ends_mid_turn and state.active_turn_id is None
    assert state.active_turn_start_index is None


def test_legacy_history_closed_by_turn_aborted_is_stable() -> None:
    assert not snapshot_turn_state([user_msg("u1"), turn_aborted(None)]).ends_mid_turn


# -- properties ------------------------------------------------------------------------

_filler = st.sampled_from(
    [
        assistant_msg("a"),
        reasoning(),
        function_call(),
        function_output(),
        env_context(),
        instructions(),
    ]
)


@st.composite
def legacy_histories(draw: st.DrawFn) -> list[RolloutItem]:
    """Histories without lifecycle events: user turns, fillers, optional terminal events."""
    items: list[RolloutItem] = draw(st.lists(_filler, max_size=3))
    for i in range(draw(st.integers(0, 5))):
        items.append(user_msg(f"u{i}"))
        items.extend(draw(st.lists(_filler, max_size=4)))
        if draw(st.booleans()):
            items.append(task_complete(None))
    return items


@st.composite
def explicit_histories(draw: st.DrawFn) -> list[RolloutItem]:
    """Histories with explicit lifecycle; the last turn may be unfinished."""
    items: list[RolloutItem] = []
    count = draw(st.integers(0, 5))
    for i in range(count):
        items.append(task_started(f"t{i}"))
        items.extend(draw(st.lists(_filler, max_size=2)))
        items.append(user_msg(f"u{i}"))
        items.extend(draw(st.lists(_filler, max_size=3)))
        last = i == count - 1
        if not (last and draw(st.booleans())):
            items.append(draw(st.sampled_from([task_complete(f"t{i}"), turn_aborted(f"t{i}")])))
    return items


def _documented(items: list[RolloutItem], n: int) -> list[RolloutItem]:
    """The Codex-documented result, restated independently of the implementation."""
    users = [i for i, it in enumerate(items) if is_real_user_message(it)]
    starts = [i for i, it in enumerate(items) if it.event_type == "task_started"]
    terminals = [
        i for i, it in enumerate(items) if it.event_type in ("task_complete", "turn_aborted")
    ]
    if starts:
        mid = len(terminals) < len(starts)
        active_start = starts[-1] if mid else None
    else:
        mid = bool(users) and not any(t > users[-1] for t in terminals)
        active_start = None
    if mid and n >= len(users):
        cut = active_start if active_start is not None else (users[-1] if users else None)
        return items[:cut] if cut is not None else items
    return items[: users[n]] if n < len(users) else items


@settings(max_examples=150, deadline=None)
@given(items=st.one_of(legacy_histories(), explicit_histories()), n=st.integers(0, 7))
def test_truncation_is_a_prefix_without_the_nth_user_message(
    items: list[RolloutItem], n: int
) -> None:
    state = snapshot_turn_state(items)
    out = truncate_before_nth_user_message(items, n, state)
    assert out == items[: len(out)]
    users = user_message_positions(items)
    if n < len(users):
        assert sum(1 for it in out if is_real_user_message(it)) <= n
        assert len(out) <= users[n]


@settings(max_examples=150, deadline=None)
@given(items=legacy_histories(), n=st.integers(0, 7))
def test_truncation_matches_documented_result_on_legacy_histories(
    items: list[RolloutItem], n: int
) -> None:
    assert truncate_before_nth_user_message(items, n, snapshot_turn_state(items)) == _documented(
        items, n
    )


@settings(max_examples=150, deadline=None)
@given(items=explicit_histories(), n=st.integers(0, 7))
def test_truncation_matches_documented_result_on_explicit_lifecycle_histories(
    items: list[RolloutItem], n: int
) -> None:
    assert truncate_before_nth_user_message(items, n, snapshot_turn_state(items)) == _documented(
        items, n
    )


@settings(max_examples=100, deadline=None)
@given(items=explicit_histories(), n=st.integers(0, 7))
def test_out_of_range_cut_of_explicit_mid_turn_history_ends_at_a_stable_boundary(
    items: list[RolloutItem], n: int
) -> None:
    state = snapshot_turn_state(items)
    if state.ends_mid_turn and n >= len(user_message_positions(items)):
        out = truncate_before_nth_user_message(items, n, state)
        assert not snapshot_turn_state(out).ends_mid_turn
