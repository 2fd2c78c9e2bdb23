"""The histories a worker holds between `session.history` pages (`HistoryCursors`): each is
dropped when not asked for again in time, and no more than the bound are held."""

from __future__ import annotations

import pytest

from drivers.history_cursors import HeldHistory, HistoryCursors

pytestmark = pytest.mark.timeout(30)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _held(n: int) -> HeldHistory:
    return HeldHistory(answer={}, turns=[{"providerTurnId": f"t{n}"}], final=False)


def test_a_cursor_not_asked_for_again_in_time_is_dropped() -> None:
    clock = _Clock()
    cursors = HistoryCursors(hold_seconds=10.0, most=4, clock=clock)
    first = cursors.hold(_held(1))
    clock.now = 9.0
    assert cursors.take(first) == _held(1)  # asked again: held 10 s more
    clock.now = 18.0
    assert cursors.take(first) == _held(1)
    clock.now = 28.5
    assert cursors.take(first) is None
    assert len(cursors) == 0


def test_at_most_the_bound_are_held_the_oldest_dropped_first() -> None:
    cursors = HistoryCursors(hold_seconds=10.0, most=2, clock=_Clock())
    one, two, three = (cursors.hold(_held(n)) for n in (1, 2, 3))
    assert len(cursors) == 2
    assert cursors.take(one) is None
    assert cursors.take(two) == _held(2)
    assert cursors.take(three) == _held(3)
    cursors.drop(two)
    assert cursors.take(two) is None and len(cursors) == 1
