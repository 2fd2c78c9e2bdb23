"""`PointTally`: what a soak's summary says of its failpoints is what fired, not what it armed
(an armed point a later round turns off, or that nothing reaches, fired nothing), and a point
armed for another action than the soak's kill fires apart."""

from __future__ import annotations

from pathlib import Path

from tests.reliability.reliability_harness import PointTally
from tests.support.daemon import DaemonProcess, create_session, run_turn

START = "host.turn.before_warm_start"
UNREACHED = "host.resolve.after_finish"  # no fork is resolved here


def test_the_tally_counts_each_firing_of_a_point_and_names_one_armed_that_never_fired(
    tmp_path: Path,
) -> None:
    tally = PointTally()
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "warms the runtime")["outcome"] == "completed"
        tally.look(d.home)
        assert tally.fired == {}  # nothing armed yet
        for n in (1, 2):
            c.call("debug.failpoints", {"points": {START: "once:error", UNREACHED: "once:kill"}})
            tally.arm(START)
            tally.arm(UNREACHED)
            assert run_turn(c, sid, f"meets the point {n}")["outcome"] == "failed"
            tally.look(d.home)
            tally.look(d.home)  # a marker looked at twice is one firing
            assert tally.fired == {START: n}, tally.summary()
        assert run_turn(c, sid, "the point fired once")["outcome"] == "completed"
        # A point armed for another action than the soak's kill (a client's `once:error`, a
        # flow's helper) fires apart: the soak's point did not.
        c.call("debug.failpoints", {"points": {START: "once:error"}})
        tally.arm(START, kill=False)
        assert run_turn(c, sid, "meets the point armed apart")["outcome"] == "failed"
        tally.look(d.home)
        assert tally.fired == {START: 2} and tally.apart == {START: 1}, tally.summary()
    finally:
        d.stop()
    assert tally.armed == {START: 2, UNREACHED: 2}
    assert tally.summary().endswith(f"armed, never fired: ['{UNREACHED}']"), tally.summary()
