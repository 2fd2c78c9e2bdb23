"""A Tutti Agent Session's rollout removed behind the daemon's back while Turns of it are
bound: its next Turn fails typed, `provider_history_missing`, before the app-server gets it —
while the Session's app-server runs (which holds the thread in memory and would append the Turn
to the removed file, lost at the next restart) and after a daemon restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.homes import rollouts, runtime_home

pytestmark = pytest.mark.timeout(120)


def test_a_turn_after_the_sessions_rollout_vanished_fails_typed_live_and_after_a_restart(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "one")["outcome"] == "completed"
        thread = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
            "providerSessionId"
        ]
        provider_home = runtime_home(home, WS, sid)
        (rollout,) = rollouts(provider_home)
        rollout.unlink()
        second = run_turn(c, sid, "two")
        assert second["outcome"] == "failed", second
        assert second["errorReason"] == "provider_history_missing", second
        assert thread in second["error"], second
        assert second["hostOnly"] is True, second  # nothing recorded as run at the provider
        assert rollouts(provider_home) == []
    finally:
        d.stop()
    d.start()
    try:
        c = d.client()
        third = run_turn(c, sid, "three")
        assert third["outcome"] == "failed", third
        assert third["errorReason"] == "provider_history_missing", third
        assert thread in third["error"], third
        assert rollouts(provider_home) == []
    finally:
        d.stop()
