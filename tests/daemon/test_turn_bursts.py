"""A Turn's driver events that reach its Session actor together are handled in one receive:
the events queued behind a message are taken in the same receive, in order, with one pass of
the actor's bookkeeping for all of them; and a held write's linger timer is armed only when
the actor goes idle with it, so a reply whose completion is already queued behind it costs
no timer.

An in-process daemon (real store file, real worker and tutti-agent app-server); the worker's
events are intercepted on the delivery thread, and the reply's `item` and the Turn's
`turn.completed` are forwarded while the actor is held by a message of the test's own."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.host_actor import route
from actors.messages import FollowUp
from actors.pool import TimerHandle
from actors.session_actor import SessionActor
from agenthost.daemon import Daemon
from tests.support.daemon import WS, create_session, run_turn, settle, submit, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _assistant(event: dict[str, Any]) -> bool:
    item = event.get("item")
    return isinstance(item, dict) and item.get("kind") == "assistant"


def _held_reply_turn(
    daemon: Daemon, c: Client, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Run one Turn whose reply `item` and `turn.completed` are forwarded while the Session
    actor is inside a message of the test's (so both queue behind it); the settled Turn, the
    message types the actor received from then on, and who armed a timer meanwhile."""
    sid = create_session(c, title="bursts")["agentSessionId"]
    run_turn(c, sid, "spawn")
    assert daemon.supervisor is not None
    forward = daemon._on_worker_event
    received: list[str] = []
    armed: list[str] = []
    watching = threading.Event()
    inside, release = threading.Event(), threading.Event()
    held: list[tuple[str, str, dict[str, Any]]] = []

    on_receive = SessionActor.on_receive

    def counting(self: SessionActor, message: Any) -> Any:
        if watching.is_set():
            received.append(type(message).__name__)
        return on_receive(self, message)

    monkeypatch.setattr(SessionActor, "on_receive", counting)
    call_later = daemon.ctx.actor_pool.call_later

    def recording(seconds: float, fn: Callable[[], None]) -> TimerHandle:
        if watching.is_set():
            armed.append(" < ".join(f.name for f in reversed(traceback.extract_stack(limit=4))))
        return call_later(seconds, fn)

    monkeypatch.setattr(daemon.ctx.actor_pool, "call_later", recording)

    def hold() -> None:
        inside.set()
        release.wait(30)

    def sink(provider: str, key: str, event: dict[str, Any]) -> None:
        if event.get("type") == "item" and _assistant(event):
            held.append((provider, key, event))
            return
        if event.get("type") == "turn.completed" and held:
            watching.set()
            route(daemon.routes, daemon.host, WS, sid, FollowUp(hold))
            assert inside.wait(30)
            forward(*held.pop())
            forward(provider, key, event)
            release.set()
            return
        forward(provider, key, event)

    daemon.supervisor.set_event_sink(sink)
    try:
        turn_id = submit(c, sid, "one reply")["turnId"]
        turn = settle(c, sid, turn_id)
        wait_for(lambda: daemon.store is not None and not daemon.store.turns.active_turn(WS, sid))
    finally:
        daemon.supervisor.set_event_sink(forward)
        release.set()
    watching.clear()
    return turn, received, armed


def test_driver_events_queued_behind_a_message_are_handled_in_its_receive(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply's `item` and the `turn.completed` queued behind the test's message are
    taken in that message's receive: one receive for the three, and the Turn settles with
    its reply as before."""
    daemon, c = running
    turn, received, _ = _held_reply_turn(daemon, c, monkeypatch)
    assert turn["outcome"] == "completed", turn
    assert [m["text"] for m in turn["messages"]] == ["one reply", "echo: one reply"]
    assert turn["finalAssistantMessageId"] == turn["messages"][1]["messageId"], turn
    assert "DriverEvent" not in received, received
    assert received[:1] == ["FollowUp"], received


def test_a_reply_with_its_completion_queued_behind_it_arms_no_linger_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply's Message waits for the Turn's next write; with the completion already
    queued behind it, that wait ends in the same receive (checkpoints off: the settlement is
    queued there, with no `after` capture to wait for), so no linger timer is armed."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "agenthost.toml").write_text("[workspace]\ncheckpoints = false\n")
    with in_process_daemon(home, timeout=30.0) as (daemon, c):
        turn, _, armed = _held_reply_turn(daemon, c, monkeypatch)
    assert turn["outcome"] == "completed", turn
    assert not [name for name in armed if "linger" in name], armed
