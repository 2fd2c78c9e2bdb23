"""What a streamed reply tells the Session actor: its watchdogs live there, so the daemon's
sink sends it a `TurnActivity` at most once a second per Turn. For a provider the model
backstops watch (`model_limits`: a model endpoint's first-byte and stream-idle limits) the first
delta of a stretch is told at once — it ends the first-byte wait and arms the stream-idle one;
for one they do not watch (tutti-agent on its built-in model) only the inactivity watchdog
reads it — nor the driver's note that the reply's item started — so a reply that streams for
less than a second sends the actor nothing of either."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agenthost.daemon as daemon_module
from actors.context import runtime_key
from actors.messages import DriverEvent
from agenthost.daemon import Daemon
from domain.turn_events import ACTIVITY_ITEM, ACTIVITY_STREAM, TurnActivity
from tests.support.daemon import create_session, run_turn
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

WS = "ws-stream-activity"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list[TurnActivity]:
    """Every `TurnActivity` the daemon's sink routes to a Session actor (then routed on)."""
    out: list[TurnActivity] = []
    route = daemon_module.route

    def counting(routes: Any, host: Any, ws: str, sid: str, msg: Any) -> None:
        if isinstance(msg, DriverEvent) and isinstance(msg.event, TurnActivity):
            out.append(msg.event)
        route(routes, host, ws, sid, msg)

    monkeypatch.setattr(daemon_module, "route", counting)
    return out


def test_a_short_reply_without_a_model_backstop_sends_the_actor_nothing(
    running: tuple[Daemon, Client], told: list[TurnActivity]
) -> None:
    daemon, client = running
    assert "tutti-agent" not in daemon.ctx.timeouts.model_limits
    sid = create_session(client, WS)["agentSessionId"]
    turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(3)]
    assert all(t["outcome"] == "completed" for t in turns)
    assert told == []


def test_a_backstopped_providers_first_delta_is_told_at_once(
    running: tuple[Daemon, Client], told: list[TurnActivity]
) -> None:
    daemon, client = running
    daemon._backstopped = frozenset({"tutti-agent"})  # as if it had a model endpoint
    sid = create_session(client, WS)["agentSessionId"]
    turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(3)]
    streamed = [a.turn_id for a in told if a.kind == ACTIVITY_STREAM]
    # Each Turn's first delta is told; a Turn a loaded machine streams for over a second is told
    # again a second later (the once-a-second clock), so a Turn may appear more than once.
    assert list(dict.fromkeys(streamed)) == [t["turnId"] for t in turns]
    # The reply's item is emitted complete (tutti-agent's `completedNext`): its start sends no
    # note of its own, the item that follows at once is that note.
    assert {a.kind for a in told} == {ACTIVITY_STREAM}


def test_a_stream_without_a_backstop_is_told_once_a_second(
    running: tuple[Daemon, Client], told: list[TurnActivity], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inactivity watchdog still hears of a long reply: a delta a second after the clock
    started is told, the next one within the second is not."""
    daemon, _ = running
    clock = [1000.0]
    monkeypatch.setattr(daemon_module.time, "monotonic", lambda: clock[0])
    key = runtime_key(WS, str(uuid.uuid4()))
    delta = {"type": "message.delta", "turnId": "t-1", "itemId": "i", "delta": "x"}
    daemon._on_worker_event("tutti-agent", key, delta)
    assert told == []
    clock[0] += daemon_module.STREAM_ACTIVITY_EVERY_S
    daemon._on_worker_event("tutti-agent", key, delta)
    assert [(a.turn_id, a.kind) for a in told] == [("t-1", ACTIVITY_STREAM)]
    clock[0] += 0.5
    daemon._on_worker_event("tutti-agent", key, delta)
    daemon._on_worker_event("tutti-agent", key, {"type": "turn.activity", "turnId": "t-1"})
    assert len(told) == 1
    clock[0] += daemon_module.STREAM_ACTIVITY_EVERY_S
    daemon._on_worker_event("tutti-agent", key, {"type": "turn.activity", "turnId": "t-1"})
    assert [(a.turn_id, a.kind) for a in told][1:] == [("t-1", ACTIVITY_ITEM)]
