"""The turn reduction (`build_turns`) with and without the turns' items."""

from __future__ import annotations

import pytest

from tests.tutti_agent.items import (
    error_event,
    session_meta,
    task_complete,
    task_started,
    turn_aborted,
    user_msg,
)
from tutti_agent.history import TurnStatus, build_turns
from tutti_agent.rollout import LineType, RolloutItem

pytestmark = pytest.mark.timeout(60)


def _item_completed(text: str) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {"type": "item_completed", "item": {"type": "agentMessage", "id": text, "text": text}},
    )


def test_turns_reduced_without_items_are_the_turns_with_items_left_out() -> None:
    """`build_turns(..., with_items=False)` (a `turnItems: false` read, the host's proof): the
    same turns field by field — explicit, legacy, crashed, failed, interrupted, in progress —
    with no items; the full reduction keeps them."""
    items = [
        session_meta(),
        user_msg("legacy"),  # no lifecycle: an implicit turn
        _item_completed("a0"),
        task_complete(None),
        task_started("t1"),
        user_msg("one"),
        _item_completed("a1"),
        task_complete("t1"),
        task_started("t2"),  # dies: the next start closes it interrupted
        _item_completed("a2"),
        task_started("t3"),
        error_event("boom"),
        task_complete("t3"),
        task_started("t4"),
        _item_completed("a4"),
        turn_aborted("t4"),
        task_started("t5"),  # still in progress
        _item_completed("a5"),
    ]
    full = build_turns(items)
    lean = build_turns(items, with_items=False)
    assert [t.status for t in full] == [
        TurnStatus.COMPLETED,
        TurnStatus.COMPLETED,
        TurnStatus.INTERRUPTED,
        TurnStatus.FAILED,
        TurnStatus.INTERRUPTED,
        TurnStatus.IN_PROGRESS,
    ]
    assert [len(t.items) for t in full] == [1, 1, 1, 0, 1, 1]
    assert all(t.items == () for t in lean)
    assert lean == [t._replace(items=()) for t in full]
