"""Crash matrix of `fork.resolve` (issue 21 §1): SIGKILL the daemon at each
`host.resolve.*` failpoint, restart, and check the end state recovery leaves (a half-done
resolution is finished or rolled back), the invariants (0 violations, quarantine included),
and that a new resolve then settles the operation."""

from __future__ import annotations

import signal
import uuid

import pytest

from tests.daemon.test_fork_resolve import resolve, unknown_fork
from tests.daemon.test_fork_saga import three_turn_source
from tests.support.daemon import WS, DaemonProcess, run_turn
from tests.support.invariants import assert_invariants, quarantined_files

pytestmark = [pytest.mark.long, pytest.mark.timeout(240)]

# (action, point) → status right after the restart's recovery
CELLS = {
    ("adopt", "host.resolve.after_begin"): "unknown",
    ("adopt", "host.resolve.after_bind"): "unknown",
    ("adopt", "host.resolve.after_accept"): "committed",
    ("adopt", "host.resolve.after_finish"): "committed",
    ("abandon", "host.resolve.after_begin"): "unknown",
    ("abandon", "host.resolve.after_quarantine"): "unknown",
    ("abandon", "host.resolve.after_finish"): "abandoned",
}
FINAL = {"adopt": "committed", "abandon": "abandoned"}


@pytest.mark.parametrize(("action", "point"), sorted(CELLS))
def test_daemon_killed_at_resolve_failpoint_recovers(tmp_path, action: str, point: str) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client(timeout=10)
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    op_id = op["operationId"]
    c.call("debug.failpoints", {"points": {point: "once:kill"}})
    c.submit(
        "fork.resolve",
        {"workspaceId": WS, "operationId": op_id, "requestId": str(uuid.uuid4()), "action": action},
    )
    assert d.wait_exit(60) == -signal.SIGKILL
    d.kill()
    d2 = DaemonProcess(home).start()
    try:
        c2 = d2.client()
        got = c2.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
        assert got["status"] == CELLS[(action, point)], got
        assert_invariants(home)
        if got["status"] == "unknown":
            inspected = resolve(c2, op_id, "inspect")["evidence"]
            if point == "host.resolve.after_quarantine":
                # The child was moved aside before the crash: nothing left to adopt.
                assert inspected["verdict"] == "absent" and inspected["quarantined"]
            else:
                assert inspected["verdict"] == "adoptable", inspected
            done = resolve(c2, op_id, action)["operation"]
            assert done["status"] == FINAL[action], done
        final = c2.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
        assert final["status"] == FINAL[action]
        if action == "adopt":
            child = final["targetAgentSessionId"]
            assert run_turn(c2, child, "adopted after a crash")["outcome"] == "completed"
        else:
            assert [q for q, _ in quarantined_files(home)] == [op_id]
        assert run_turn(c2, sid, "source still works")["outcome"] == "completed"
        assert_invariants(home)
    finally:
        d2.stop()
