"""What a Session actor's receive does around the message it handles (`SessionActor.on_receive`),
counted on an actor whose parts are stand-ins: which messages empty the Session row cache
(before and after they run), and how many Python calls the receive's own bookkeeping makes —
it runs ~8 times per Turn on the actor's thread (docs/performance.md, turnprof)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import pytest

from actors import session_actor
from actors.messages import DriverEvent, FollowUp, Mutate, RuntimeLost, Submit
from actors.session_actor import SessionActor
from domain.turn_events import TurnActivity


class _Writes:
    hold = False
    lingering = False

    def __len__(self) -> int:
        return 0

    def drain_if_due(self) -> None:
        pass


class _Runtime:
    def __init__(self) -> None:
        self.forgotten = 0

    def forget_row(self) -> None:
        self.forgotten += 1

    def forget_warm_runtime(self) -> None:
        pass


class _Turns:
    def awaiting_start(self) -> bool:
        return False


class _Actor(SessionActor):
    """The receive as the actor runs it; the message's handling and the actor's busy state
    are the stand-ins'."""

    def _dispatch(self, message: Any) -> None:
        self.dispatched.append(message)

    def next_message(self) -> Any:
        return None

    def _update_busy(self) -> None:
        pass


def _actor() -> Any:
    actor: Any = object.__new__(_Actor)  # no pykka start, no store: the receive alone
    actor.writes, actor.runtime, actor.turns = _Writes(), _Runtime(), _Turns()
    actor.dispatched = []
    return actor


def _event() -> DriverEvent:
    return DriverEvent(TurnActivity(turn_id="t-1", kind="stream"))


@pytest.mark.parametrize(
    ("message", "forgotten"),
    [
        (_event(), 0),
        (FollowUp(lambda: None), 0),
        (Submit("r-1", "hi", lambda _: None), 0),
        (Mutate(lambda: None, lambda _: None), 2),
        (RuntimeLost("tutti-agent", "test"), 2),
    ],
)
def test_the_row_cache_is_emptied_around_a_message_that_may_change_the_row(
    message: Any, forgotten: int
) -> None:
    actor = _actor()
    SessionActor.on_receive(actor, message)
    assert actor.dispatched == [message]
    assert actor.runtime.forgotten == forgotten


def test_a_driver_events_receive_makes_no_call_for_its_row_cache() -> None:
    """A Turn's driver event: the receive asks its kind once and calls nothing for the row
    cache (it was a method called before and after every message: two calls per receive)."""
    actor = _actor()
    message = _event()
    calls: list[str] = []

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call" and frame.f_code.co_filename == session_actor.__file__:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        SessionActor.on_receive(actor, message)
    finally:
        sys.setprofile(None)
    assert calls == ["on_receive", "_joins_burst"], calls
