"""A Session actor the idle reaper looks at while it handles a submit, through the real daemon,
its worker and a real tutti-agent app-server: the submit's claim is held on the actor's
thread past `idle_actor_seconds` (`host.turn.before_claim` armed `sleep`), and the Turn's
`turn.start` is held in the worker (`worker.turn.before_start` armed `sleep`) so that an
interrupt comes while it may still reach the provider. The Turn the interrupt ends is never
marked host-only (its start may have been sent: the provider ran it), and the reaper leaves
the actor alone while it handles the submit: the actor that claimed the Turn follows it, its
start's answer comes back to it, and the interrupt reaches the provider (the Turn bound)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, settle, submit

pytestmark = pytest.mark.timeout(120)


def test_an_interrupt_of_a_turn_whose_start_may_have_left_never_marks_it_host_only(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nidle_actor_seconds = 0.1\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=30)
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "warm")["outcome"] == "completed"  # the next starts warm
        c.call(
            "debug.failpoints",
            {
                "points": {
                    "host.turn.before_claim": "once:sleep:1500",
                    "worker.turn.before_start": "once:sleep:3000",
                }
            },
        )
        turn = submit(c, sid, "/slow 30000 second")
        assert turn["phase"] == "active"
        time.sleep(0.5)  # the start is in the worker, held
        c.call(
            "turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": turn["turnId"]}
        )
        got = settle(c, sid, turn["turnId"], timeout=30)
        assert got["outcome"] == "interrupted", got
        assert got.get("hostOnly") is not True, got
        # The actor that claimed it still tracks it (the reaper waits for the message it
        # handles): the interrupt waited for the start's answer and reached the provider.
        assert got["rootProviderTurnId"], got
        assert "gone before a driver answer" not in d.tail_log(), d.tail_log()
        assert run_turn(c, sid, "third")["outcome"] == "completed"
    finally:
        d.stop()
