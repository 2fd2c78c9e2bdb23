"""What a tiny Turn leaves behind in the daemon is bounded, through the real daemon: each
Turn arms a `turn_inactivity_seconds` watchdog (30 min) on the shared timer thread and
cancels it when it settles; a cancelled entry (holding its Turn's state) must not stay until
its due time, or the daemon would grow with every Turn for half an hour. After 48 Turns on
12 Sessions, the timers pending (`host.status` `timers`) are bounded by the live ones, not by
the Turns run. The RSS plateau over 10,000 Turns is `bench/tiny_turns.py`'s to show."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from actors.pool import COMPACT_MIN
from tests.support.daemon import DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(180)

SESSIONS = 12
TURNS_EACH = 4
CLIENTS = 4


def test_settled_turns_leave_no_timer_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sids = [create_session(c)["agentSessionId"] for _ in range(SESSIONS)]
        outcomes: list[str] = []

        def drive(part: list[str]) -> None:
            own = d.client(timeout=60)
            for i in range(TURNS_EACH):
                for sid in part:
                    outcomes.append(run_turn(own, sid, f"tiny {i}")["outcome"])

        threads = [threading.Thread(target=drive, args=(sids[i::CLIENTS],)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        assert outcomes == ["completed"] * SESSIONS * TURNS_EACH
        status = c.call("host.status")
        # No Turn is live: what is left is at most the cancelled entries below the compaction
        # threshold (and a store retry or two), never one per Turn run.
        assert status["timers"] <= COMPACT_MIN + 2, status["timers"]
        assert SESSIONS * TURNS_EACH > COMPACT_MIN + 2
    finally:
        d.stop()
