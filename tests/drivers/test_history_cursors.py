"""The histories a worker holds between `session.history` pages (`HistoryCursors`): each is
dropped when not asked for again in time, and no more than the bounds are held: a number of
histories and their Turns' text in all (the newest held whatever its size)."""

from __future__ import annotations

import pytest

from drivers.history_cursors import HELD_MOST, HELD_MOST_CHARS, HeldHistory, HistoryCursors

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


def _big(n: int, text: str) -> HeldHistory:
    return HeldHistory(
        answer={}, turns=[{"providerTurnId": f"t{n}", "userText": text}], final=False
    )


def test_the_histories_held_are_bounded_by_their_text_too_the_oldest_dropped_first() -> None:
    """Three histories of 50 Mi characters each, fewer than `HELD_MOST`: the first is dropped
    so that what is held stays within `HELD_MOST_CHARS` (held all three, 150 Mi, before)."""
    assert HELD_MOST >= 3
    text = "x" * (50 << 20)  # one string shared by the three: the test holds it once
    cursors = HistoryCursors(hold_seconds=10.0, clock=_Clock())
    one, two, three = (cursors.hold(_big(n, text)) for n in (1, 2, 3))
    assert cursors.take(one) is None
    assert cursors.take(two) == _big(2, text) and cursors.take(three) == _big(3, text)
    assert len(cursors) == 2 and cursors.chars <= HELD_MOST_CHARS
    cursors.drop(two)
    cursors.drop(three)
    assert cursors.chars == 0


def test_a_history_past_the_text_bound_is_held_alone() -> None:
    cursors = HistoryCursors(hold_seconds=10.0, clock=_Clock(), most_chars=1000)
    small = cursors.hold(_big(1, "y" * 100))
    large = cursors.hold(_big(2, "z" * 5000))
    assert cursors.take(small) is None
    assert cursors.take(large) == _big(2, "z" * 5000) and len(cursors) == 1
