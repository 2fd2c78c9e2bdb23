"""The GUI grows a streamed reply in place (issue 17): headless through Textual's pilot against a
real daemon whose fake model sends the first piece of its reply and holds the rest — the open
Turn already shows that piece while it is active, and once the model finishes, the settled
Turn shows the reply exactly once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from client.gui.app import AgentHostApp
from client.gui.transcript import TurnView
from model_fakes.responses import ResponsesServer
from tests.client.test_client_gui import run_app, until
from tests.support.daemon import DaemonProcess, create_session, submit

pytestmark = pytest.mark.timeout(90)

WS = "ws-test"


def assistant_texts(app: AgentHostApp, turn_id: str) -> list[str]:
    for view in app.query(TurnView):
        if view.turn["turnId"] == turn_id:
            return [m["text"] for m in view.turn["messages"] if m["kind"] == "assistant"]
    return []


def test_the_gui_grows_a_streamed_reply_in_place(tmp_path: Path) -> None:
    gate = threading.Event()
    with ResponsesServer(gate=gate) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, WS, title="stream")["agentSessionId"]

            async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
                await until(pilot, lambda: app.engine.session(sid) is not None)
                app.open_session(sid)
                await pilot.pause(0.3)
                turn_id = submit(c, sid, "hello there", WS)["turnId"]
                # Only the first delta ("echo") exists yet: it is on screen, the Turn active.
                await until(pilot, lambda: assistant_texts(app, turn_id) == ["echo"])
                view = next(v for v in app.query(TurnView) if v.turn["turnId"] == turn_id)
                assert view.turn["phase"] == "active"
                gate.set()
                await until(
                    pilot,
                    lambda: (
                        next(
                            (v.turn for v in app.query(TurnView) if v.turn["turnId"] == turn_id), {}
                        ).get("phase")
                        == "settled"
                    ),
                )
                assert assistant_texts(app, turn_id) == ["echo: hello there"]
                # The same widget grew and settled: the reply was updated in place.
                assert next(v for v in app.query(TurnView) if v.turn["turnId"] == turn_id) is view

            run_app(d, WS, scenario)
        finally:
            gate.set()
            d.stop()
