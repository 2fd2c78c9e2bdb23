"""The worker's ledger of the `turn.start`s it received (`drivers/turn_starts.py`): a start
keeps its Session open until it has ended — answered and its provider turn over, in either
order, or refused — and one whose fate the worker cannot know keeps it open for good."""

from __future__ import annotations

import pytest

from domain.errors import ProviderNotCalled, RuntimeChanged, SessionBusy
from drivers.errors import DriverError
from drivers.turn_starts import TurnStarts

pytestmark = pytest.mark.timeout(30)

S = "ws/s"


def _start(starts: TurnStarts, req_id: object, turn_id: str, session: str = S) -> None:
    starts.received(req_id, {"agentSessionId": session, "turnId": turn_id})


def test_a_start_ends_once_answered_and_its_provider_turn_is_over_in_either_order() -> None:
    starts = TurnStarts()
    _start(starts, 1, "T1")
    _start(starts, 2, "T2")
    assert starts.open(S) and not starts.open("ws/other")
    starts.handed(1)
    starts.answered(1, None)
    assert starts.open(S)  # answered, its provider turn still runs
    starts.ended(S, "T1")
    starts.handed(2)
    starts.ended(S, "T2")  # the Turn's end sent before its answer
    assert starts.open(S)
    starts.answered(2, None)
    assert not starts.open(S)


def test_a_start_refused_before_its_provider_ends_with_its_answer() -> None:
    starts = TurnStarts()
    _start(starts, 1, "T1")
    starts.answered(1, RuntimeChanged("another runtime is live"))  # never handed
    _start(starts, 2, "T2")
    starts.handed(2)
    starts.answered(2, ProviderNotCalled("the CLI ended before the prompt"))
    _start(starts, 3, "T3")
    starts.handed(3)
    starts.answered(3, SessionBusy("a Turn is active"))
    assert not starts.open(S)


def test_a_start_the_driver_had_and_failed_stays_open_until_its_provider_turn_ends() -> None:
    starts = TurnStarts()
    _start(starts, 1, "T1")
    starts.handed(1)
    starts.answered(1, DriverError("turn/start timed out"))
    assert starts.open(S)  # the provider may run it still
    starts.ended(S, "T1")
    assert not starts.open(S)


def test_a_start_declined_by_the_link_thread_is_refused_only_if_the_lane_fails_it_first() -> None:
    starts = TurnStarts()
    _start(starts, 1, "T1")
    starts.handed(1)
    starts.handed(1, False)  # `begin_turn` sent nothing: the lane runs it
    starts.answered(1, RuntimeChanged("refused on the lane"))
    assert not starts.open(S)


def test_two_open_starts_of_one_turn_are_not_told_apart_by_its_end() -> None:
    starts = TurnStarts()
    _start(starts, 1, "T1")
    _start(starts, 2, "T1")
    starts.handed(1)
    starts.handed(2)
    starts.ended(S, "T1")
    starts.answered(1, None)
    starts.answered(2, None)
    assert starts.open(S)


def test_a_start_with_no_request_id_keeps_its_session_open_for_good() -> None:
    starts = TurnStarts()
    _start(starts, None, "T1")
    assert starts.open(S)
    _start(starts, 1, "T2")
    starts.handed(1)
    starts.answered(1, None)
    starts.ended(S, "T2")
    assert starts.open(S)
