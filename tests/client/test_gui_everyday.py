"""The GUI walked as a person's day, by keyboard against a real daemon: F7 pins the open
session (the daemon's `pinned`, ★ in the list) and unpins it, and Ctrl+R with the daemon
stopped keeps the Turns in view with a toast in words instead of an empty transcript."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.session_list import SessionTree
from tests.client.test_client_gui import open_and_wait, turn_views, until
from tests.client.test_client_gui_keyboard import run_app
from tests.support.daemon import DaemonProcess, create_session, run_turn
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def pinned(client: Client, ws: str, sid: str) -> bool:
    session = client.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"]
    return bool(session["pinned"])


def row_of(app: AgentHostApp, sid: str) -> str:
    node = app.query_one(SessionTree).node_for(sid)
    assert node is not None
    return str(node.label)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_f7_pins_the_open_session_marks_it_in_the_list_and_unpins_it(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Keep me")["agentSessionId"]
    other = create_session(client, ws, title="Other")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        assert not row_of(app, sid).startswith("★")
        await pilot.press("f7")
        await until(pilot, lambda: pinned(client, ws, sid))
        await until(pilot, lambda: row_of(app, sid).startswith("★ "))
        assert not pinned(client, ws, other)
        assert not row_of(app, other).startswith("★")
        await pilot.press("f7")
        await until(pilot, lambda: not pinned(client, ws, sid))
        await until(pilot, lambda: not row_of(app, sid).startswith("★"))

    run_app(daemon, ws, size, scenario)


def test_f1_lists_the_pin_key(daemon: DaemonProcess, client: Client, ws: str) -> None:
    from client.gui.keyboard import HelpScreen

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert any(line.startswith("F7 ") and "Pin" in line for line in app.screen.lines)

    run_app(daemon, ws, (80, 24), scenario)


def test_reload_with_the_daemon_stopped_keeps_the_turns_in_view_and_says_so(
    tmp_path: Path,
) -> None:
    ws = "down"
    daemon = DaemonProcess(tmp_path / "home").start()
    notes: list[str] = []
    try:
        c = daemon.client()
        sid = create_session(c, ws, title="Stays")["agentSessionId"]
        run_turn(c, sid, "hello there", ws)

        async def main() -> None:
            # Its requests' limit at 3 s (30 s by default): the reload's request waits it out
            # on a daemon that is gone; the live local daemon before answers in milliseconds.
            engine = Engine.connect(daemon.api, daemon.events, ws, request_timeout=3.0)
            app = AgentHostApp(engine, own_engine=True)
            original = app.notify

            def notify(message: str, **kw: Any) -> None:
                notes.append(message)
                original(message, **kw)

            app.notify = notify  # type: ignore[method-assign]
            async with app.run_test(size=(80, 24)) as pilot:
                await until(pilot, lambda: app.sessions_loaded)
                await open_and_wait(app, pilot, sid, 1)
                daemon.stop()
                await pilot.press("ctrl+r")
                # The request waits out its limit on a daemon that is gone.
                await until(pilot, lambda: any("load turns" in n for n in notes), timeout=60)
                assert any("did not answer" in n for n in notes)
                assert len(app.turns) == 1
                assert len(turn_views(app)) == 1

        asyncio.run(main())
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
