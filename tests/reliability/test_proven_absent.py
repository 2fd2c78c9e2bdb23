"""`proven_absent`: a candidate Session whose Turn after the chaos does not complete is a
finding (its unbound Turns would go unproven), never a tally with no assertion; and a Turn the
first cold start could not prove for want of an anchor is proven by the next."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.test_rebind import _unbind
from tests.reliability.proven_absent import (
    prove_after_restarts,
    prove_by_next_turn,
    unanswered_unmarked,
)
from tests.support.daemon import DaemonProcess, create_session, run_turn
from transport.client import Client


def test_a_candidates_next_turn_that_fails_is_a_violation(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        first = run_turn(c, sid, "one")
        candidates = {sid: [first["turnId"]]}
        # The fake model fails the Turn (`/fail`): nothing can be proven by it.
        tally, violations = prove_by_next_turn(d.home, c, candidates, text="/fail no")
        assert len(violations) == 1 and "ended failed" in violations[0], (tally, violations)
        assert first["turnId"] in violations[0] and not tally, tally
        # A Turn that completes proves (the first Turn is bound: `re-bound`).
        tally, violations = prove_by_next_turn(d.home, c, candidates)
        assert violations == [] and tally == {"re-bound": 1}, (tally, violations)
    finally:
        d.stop()


def test_a_turn_proven_only_once_its_sessions_first_anchor_is_bound_is_proven_at_the_next_pass(
    tmp_path: Path,
) -> None:
    """A Session with no bound Turn: its first Turn never reached the provider (its worker
    killed before the start), its second ran but its binding was lost. The first cold start
    after a restart binds the second by content but has no anchor (a Turn bound before it) to
    prove the first absent with; the next cold start has, and marks it host-only."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        c.call("debug.failpoints", {"points": {"worker.turn.before_start": "once:kill"}})
        lost = run_turn(c, sid, "never sent")
        assert lost["outcome"] != "completed" and not lost.get("rootProviderTurnId"), lost
        unbound = run_turn(c, sid, "ran, its binding lost")
        assert unbound["outcome"] == "completed", unbound
    finally:
        d.stop()
    _unbind(home, [unbound["turnId"]])
    assert unanswered_unmarked(home, [sid]) == {sid: [lost["turnId"]]}
    running: list[DaemonProcess] = []

    def restart() -> Client:
        if running:
            running[-1].stop()
        running.append(DaemonProcess(home).start())
        return running[-1].client(timeout=60)

    try:
        tally, violations = prove_after_restarts(home, [sid], restart)
    finally:
        running[-1].stop()
    assert violations == [], violations
    assert len(running) == 2, "the first pass had no anchor: a second cold start was needed"
    assert tally == {"host-only": 1}, tally
    assert unanswered_unmarked(home, [sid]) == {}
