"""Event topics, in every client entry point through the real daemon.

The topic frame is the bare workspace id (PROTOCOL.md, binding) and ZeroMQ subscriptions are
prefix matches, so the SUB socket of workspace `team` also receives `team-secret`'s events.
Every client in this repository keeps only the events whose topic frame equals its workspace
exactly: `transport.client.EventSubscriber`, the Engine (so the GUI), `session_client.
stream_turn` (so `agenthost say`) and the bench harness's waiter. Each test below runs
activity in `team-secret` — on a Session with the *same* id as the one in `team`, the worst
case, since Session ids are only unique within a workspace — and checks that the `team`
client never surfaces it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.loadgen import Waiter
from client.engine.lifecycle import Engine
from client.engine.values import ChangeKind, EngineChange
from client.session_client import stream_turn
from tests.support.daemon import DaemonProcess, create_session, run_turn, submit, turn_of
from transport.client import EventSubscriber

pytestmark = pytest.mark.timeout(120)

TEAM, SECRET = "team", "team-secret"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("topics") / "home").start()
    try:
        yield d
    finally:
        d.stop()


def _twins(d: DaemonProcess) -> str:
    """A Session id that exists in both `team` and `team-secret`."""
    c = d.client()
    sid = create_session(c, ws=TEAM)["agentSessionId"]
    create_session(c, ws=SECRET, agentSessionId=sid)
    return str(sid)


def _secret_turns(d: DaemonProcess, sid: str, stop: threading.Event) -> threading.Thread:
    """Turns in `team-secret` (same Session id) until `stop`: a stream of its events."""
    c = d.client()

    def run() -> None:
        while not stop.is_set():
            run_turn(c, sid, "/slow 200 secret", ws=SECRET)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _secret_turn_ids(d: DaemonProcess, sid: str) -> set[str]:
    turns = d.client().call("session.timeline", {"workspaceId": SECRET, "agentSessionId": sid})
    return {str(t["turnId"]) for t in turns["turns"]}


def test_event_subscriber_keeps_only_its_workspace(daemon: DaemonProcess) -> None:
    sid = _twins(daemon)
    team = EventSubscriber(daemon.events, (TEAM,))
    everything = EventSubscriber(daemon.events, ("",))
    try:
        time.sleep(0.5)  # ZeroMQ's slow joiner
        run_turn(daemon.client(), sid, "secret", ws=SECRET)
        topics: set[str] = set()
        while (got := everything.next_message(1.0)) is not None:
            topics.add(got[0])
        assert SECRET in topics  # the "" subscriber sees every workspace, by design
        assert team.next_message(1.0) is None
    finally:
        team.close()
        everything.close()


def test_engine_and_gui_of_team_never_show_team_secret(daemon: DaemonProcess) -> None:
    import textual  # noqa: F401  (the GUI extra; make test installs it: fail, never skip)

    from client.gui.app import AgentHostApp

    sid = _twins(daemon)
    c = daemon.client()
    events: list[dict[str, Any]] = []

    def spy(change: EngineChange) -> None:
        if change.kind is ChangeKind.EVENT and change.event is not None:
            events.append(dict(change.event))

    async def main() -> None:
        engine = Engine.connect(daemon.api, daemon.events, TEAM)
        engine.subscribe(spy)
        app = AgentHostApp(engine, own_engine=True)
        async with app.run_test(size=(140, 48)) as pilot:
            deadline = time.monotonic() + 30
            while not (app.sessions_loaded and app.engine.session(sid) is not None):
                assert time.monotonic() < deadline
                await pilot.pause(0.1)
            app.open_session(sid)
            await pilot.pause(0.5)
            stop = threading.Event()
            secret = _secret_turns(daemon, sid, stop)
            try:
                mine = await asyncio.to_thread(run_turn, c, sid, "mine", TEAM)
            finally:
                stop.set()
                await asyncio.to_thread(secret.join, 30)
            deadline = time.monotonic() + 30
            while [t["turnId"] for t in app.turns] != [mine["turnId"]]:
                assert time.monotonic() < deadline, app.turns
                await pilot.pause(0.1)
            await pilot.pause(1.0)  # let any stray event arrive
            assert [t["turnId"] for t in app.turns] == [mine["turnId"]]
            assert app.turns[0] == turn_of(c, sid, mine["turnId"], TEAM)

    asyncio.run(main())
    secret_ids = _secret_turn_ids(daemon, sid)
    assert secret_ids, "team-secret ran turns"
    turn_ids = {e["turn"]["turnId"] for e in events if e.get("type") == "turn.updated"}
    assert turn_ids and not turn_ids & secret_ids
    sessions = [e["session"] for e in events if e.get("type") == "session.upserted"]
    assert sessions and all(s["workspaceId"] == TEAM for s in sessions)


def test_stream_turn_and_say_of_team_never_surface_team_secret(daemon: DaemonProcess) -> None:
    sid = _twins(daemon)
    c = daemon.client()
    stop = threading.Event()
    secret = _secret_turns(daemon, sid, stop)
    updates: list[dict[str, Any]] = []
    deltas: list[dict[str, Any]] = []
    try:
        final = stream_turn(
            c,
            TEAM,
            sid,
            "/slow 1500 mine",
            events_endpoint=daemon.events,
            on_update=updates.append,
            on_delta=deltas.append,
        )
        said = subprocess.run(
            [
                sys.executable,
                "-m",
                "agenthost.cli",
                "--home",
                str(daemon.home),
                "--workspace",
                TEAM,
                "say",
                sid,
                "/slow 1500 said",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stop.set()
        secret.join(30)
    assert said.returncode == 0, said.stderr
    secret_ids = _secret_turn_ids(daemon, sid)
    assert len(secret_ids) >= 2, "team-secret ran turns meanwhile"
    assert {u["turnId"] for u in updates} == {final["turnId"]}
    assert all(d["turnId"] == final["turnId"] for d in deltas)
    lines = [json.loads(line) for line in said.stdout.splitlines() if line.strip()]
    said_turns = {
        str(obj.get("message", obj.get("turn", {})).get("turnId"))
        for obj in lines
        if obj.get("type") in ("message", "turn")
    }
    assert said_turns and not said_turns & secret_ids, lines


def test_bench_waiter_keeps_only_its_workspace(daemon: DaemonProcess) -> None:
    sid = _twins(daemon)
    c = daemon.client()
    waiter = Waiter(c, daemon.events)  # subscribed to every workspace ("")
    try:
        time.sleep(0.5)
        submit(c, sid, "/slow 500 secret", ws=SECRET)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert waiter._next_event(TEAM, 0.1) is None
        submit(c, sid, "mine", ws=TEAM)
        deadline = time.monotonic() + 10
        event = None
        while event is None and time.monotonic() < deadline:
            event = waiter._next_event(TEAM, 0.1)
        assert event is not None and event.get("agentSessionId") == sid
    finally:
        waiter.close()
