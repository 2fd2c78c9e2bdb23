"""A Turn leaves no timer armed behind it: each backstop the Session actor arms for a Turn (the
inactivity watchdog, the model's first-byte and stream-idle checks, the writes' lingers) is
cancelled once it can no longer act — the first-byte check as soon as the model answered — so
no timer fires ~30 s after a Turn settled into an actor message that does nothing, holding the
Turn's state until then (issue 36 targets 4 and 2; turnfixed's count, docs/performance.md)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.pool import TimerHandle, Timers
from agenthost.daemon import Daemon
from domain.model_limits import ModelLimits
from tests.support.daemon import create_session, run_turn
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

WS = "ws-turn-timers"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def test_a_settled_turn_leaves_none_of_its_timers_armed(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """tutti-agent watched by the model backstops (as with a model endpoint): three streamed
    Turns arm the first-byte and stream-idle checks, the watchdog and the lingers; once each
    has settled, every timer the Session actor armed for it is cancelled. Before, the
    first-byte check stayed armed for its whole budget (30 s + grace) after every Turn."""
    daemon, client = running
    limits = daemon.ctx.timeouts.model_limits
    assert isinstance(limits, dict)
    monkeypatch.setitem(limits, "tutti-agent", ModelLimits())
    monkeypatch.setattr(daemon, "_backstopped", frozenset({"tutti-agent"}))
    armed: list[tuple[str, TimerHandle]] = []
    call_later = Timers.call_later

    def recording(self: Timers, seconds: float, fn: Any) -> TimerHandle:
        handle = call_later(self, seconds, fn)
        frame = sys._getframe(1)
        while frame is not None and "session_turns" not in frame.f_code.co_filename:
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None:
            armed.append((frame.f_code.co_name, handle))
        return handle

    monkeypatch.setattr(Timers, "call_later", recording)
    sid = create_session(client, WS)["agentSessionId"]
    turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(3)]
    assert all(t["outcome"] == "completed" for t in turns), turns
    kinds = {name for name, _ in armed}
    assert {"_arm_first_byte", "_arm_watchdog"} <= kinds, kinds  # not vacuous
    left = [name for name, handle in armed if not handle.cancelled]
    assert left == [], left
