"""Crash matrix of `fork.resolve` on every provider (tutti-agent, the real Codex
app-server, the real Claude Agent SDK + CLI): SIGKILL the daemon at each `host.resolve.*`
failpoint, restart, and check the end state recovery leaves (a half-done resolution is finished
or rolled back), the invariants (0 violations, quarantine included), and that a new resolve then
settles the operation and, when adopted, the child runs a turn.

One cell per provider (`adopt` killed after the binder ran: recovery rolls the resolution back
and a second adopt must re-verify a child that is already half or wholly in the target's home)
runs in `make test`; the whole matrix is marked `long` (`make soak`)."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_resolve import resolve, unknown_fork
from tests.reliability.reliability_harness import PROVIDERS, provider_env, unwired_reason
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.invariants import assert_invariants, quarantined_files
from transport.client import Client

pytestmark = pytest.mark.timeout(300)

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
QUICK = ("adopt", "host.resolve.after_bind")
PROVIDER_MARKS = {"codex": [pytest.mark.codex], "claude-code": [pytest.mark.claude]}


def _cells() -> list[Any]:
    out = []
    for provider in PROVIDERS:
        for action, point in sorted(CELLS):
            marks = list(PROVIDER_MARKS.get(provider, []))
            if (action, point) != QUICK:
                marks.append(pytest.mark.long)
            out.append(
                pytest.param(
                    provider, action, point, marks=marks, id=f"{provider}-{action}-{point}"
                )
            )
    return out


def source_session(c: Client, provider: str, cwd: Path) -> tuple[str, list[dict[str, Any]]]:
    sid = create_session(c, provider=provider, title=provider, cwd=str(cwd))["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("one", "two", "three")]
    assert [t["outcome"] for t in turns] == ["completed"] * 3, turns
    return sid, turns


@pytest.mark.parametrize(("provider", "action", "point"), _cells())
def test_daemon_killed_at_resolve_failpoint_recovers(
    tmp_path: Path, provider: str, action: str, point: str
) -> None:
    # A missing provider is a failure, never a skip.
    assert unwired_reason(provider) is None, unwired_reason(provider)
    home = tmp_path / "home"
    with provider_env(provider, home) as cwd:
        d = DaemonProcess(home).start()
        try:
            c = d.client(timeout=10)
            sid, turns = source_session(c, provider, cwd)
            op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
            op_id = op["operationId"]
            c.call("debug.failpoints", {"points": {point: "once:kill"}})
            c.submit(
                "fork.resolve",
                {
                    "workspaceId": WS,
                    "operationId": op_id,
                    "requestId": str(uuid.uuid4()),
                    "action": action,
                },
            )
            assert d.wait_exit(120) == -signal.SIGKILL
        finally:
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
                    (child,) = inspected["children"]
                    if point == "host.resolve.after_bind":
                        # The binder finished before the crash: the child is in its own home.
                        assert "target" in child["locations"], child
                        assert child["readsFromOwnHome"] is True, child
                done = resolve(c2, op_id, action)["operation"]
                assert done["status"] == FINAL[action], done
            final = c2.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            assert final["status"] == FINAL[action]
            if action == "adopt":
                target = final["targetAgentSessionId"]
                assert run_turn(c2, target, "adopted after a crash")["outcome"] == "completed"
            else:
                assert [q for q, _ in quarantined_files(home)] == [op_id]
            assert run_turn(c2, sid, "source still works")["outcome"] == "completed"
            assert_invariants(home)
        finally:
            d2.stop()
