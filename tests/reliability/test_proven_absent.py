"""`proven_absent`: a candidate Session whose Turn after the chaos does not complete is a
finding (its unbound Turns would go unproven), never a tally with no assertion."""

from __future__ import annotations

from pathlib import Path

from tests.reliability.proven_absent import prove_by_next_turn
from tests.support.daemon import DaemonProcess, create_session, run_turn


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
