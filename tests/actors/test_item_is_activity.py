"""What lets a driver drop the `TurnActivity` (kind `item`) ahead of an item that follows at
once (tutti-agent's `completedNext`): the Session actor's model backstops take any non-user
`TurnItem` as that note — the model answered (the first-byte timer is cancelled), it is not
mid-stream (the stream-idle clock stops) — so [note, item] and [item] leave the same state."""

from __future__ import annotations

import pytest

from actors.session_base import TurnState
from actors.session_turns import TurnRunner
from domain.turn_events import TurnActivity, TurnEvent, TurnItem


class _Timer:
    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def _after(events: list[TurnEvent], streamed_at: float | None) -> tuple[bool, bool, float | None]:
    runner = object.__new__(TurnRunner)  # `_follow_model` reads only the Turn's state here
    state = TurnState("T1")
    timer = _Timer()
    state.first_byte = timer  # type: ignore[assignment]
    state.streamed_at = streamed_at
    for event in events:
        runner._follow_model(state, event)
    return (
        state.model_answered,
        timer.cancelled == 1 and state.first_byte is None,
        state.streamed_at,
    )


@pytest.mark.parametrize("kind", ["assistant", "reasoning", "tool_call", "someFutureItem"])
@pytest.mark.parametrize("streamed_at", [None, 12.5])
def test_an_item_is_the_note_its_started_would_have_sent(
    kind: str, streamed_at: float | None
) -> None:
    item = TurnItem("T1", {"kind": kind, "text": "x", "payload": {}})
    both = _after([TurnActivity("T1"), item], streamed_at)
    alone = _after([item], streamed_at)
    assert alone == both == (True, True, None)
