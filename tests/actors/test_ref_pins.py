"""The pins of a Session's shared checkpoint refs (`actors.checkpoints.RefPins`): a Turn in
flight pins the tree refs its captures kept until its record lands; a capture that lands after
its Turn settled (one its bound gave up on) pins nothing, so no pin outlives its Turn."""

from __future__ import annotations

import pytest

from actors import checkpoints
from actors.checkpoints import RefPins

WHERE = "/work/folder"


def test_a_turn_in_flight_pins_its_ref_until_it_settles() -> None:
    pins = RefPins()
    pins.pin(WHERE, "s/+aa", "s", "t1", written=True)
    assert pins.pinned(WHERE, ["s/+aa", "s/+bb"]) == {"s/+aa"}
    pins.settled("s", "t1")
    assert pins.pinned(WHERE, ["s/+aa"]) == set()


def test_a_capture_landing_after_its_turn_settled_pins_nothing() -> None:
    """The bound gave the Turn up (its record says `timed_out`), the capture kept its ref
    later: that ref is pinned for no one, so the size cap may drop it when no record names
    it. Without the settled Turns remembered, this pin stayed until the daemon stopped."""
    pins = RefPins()
    pins.settled("s", "late")
    pins.pin(WHERE, "s/+cc", "s", "late", written=True)
    assert pins.pinned(WHERE, ["s/+cc"]) == set()
    assert pins.discardable("s", "late") == []


def test_the_settled_turns_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "SETTLED_KEPT", 8)
    pins = RefPins()
    for i in range(100):
        pins.settled("s", f"t{i}")
    assert len(pins._settled) == 8
    pins.pin(WHERE, "s/+dd", "s", "t0", written=True)  # forgotten long ago: pinned again
    assert pins.pinned(WHERE, ["s/+dd"]) == {"s/+dd"}
