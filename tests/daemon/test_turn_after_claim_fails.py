"""A Turn whose start fails on the host after its claim (the submit already answered 202 with
the active Turn), through the real daemon, its worker and a real tutti-agent app-server: the
failure (here `host.turn.before_warm_start` armed `error`, a typed `FailpointError` between the
claim and the warm `turn.start`) settles the Turn `failed`, host-only (nothing was sent), with
the failure's words — never left `active` with nothing running it (the inactivity watchdog
waits for a Turn not yet at its provider, so nothing else would ever end it) — and the
Session's next Turn runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, create_session, run_turn, settle, submit

pytestmark = pytest.mark.timeout(120)


def test_a_turn_whose_start_fails_after_its_claim_settles_failed(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "warm")["outcome"] == "completed"  # the next starts warm
        c.call("debug.failpoints", {"points": {"host.turn.before_warm_start": "once:error"}})
        turn = submit(c, sid, "second")
        assert turn["phase"] == "active"
        done = settle(c, sid, turn["turnId"], timeout=30)
        assert done["outcome"] == "failed", done
        assert "host.turn.before_warm_start" in (done["error"] or ""), done
        assert done.get("hostOnly") is True, done
        assert run_turn(c, sid, "third")["outcome"] == "completed"
    finally:
        d.stop()
