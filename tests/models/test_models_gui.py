"""The GUI grows a streamed reply in place: headless through Textual's pilot against a
real daemon whose fake model sends the first piece of its reply and holds the rest — the open
Turn already shows that piece while it is active, and once the model finishes, the settled
Turn shows the reply exactly once; a retry of the model request shows as a dim line until
the Turn streams again or settles."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rich.segment import Segment
from textual.pilot import Pilot

from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.transcript import TranscriptView
from model_fakes.responses import ResponsesServer, default_reply
from model_fakes.silent import SilentServer
from tests.client.make_screenshot import screen_segments
from tests.client.test_client_gui import run_app, turn_views, until
from tests.support.daemon import DaemonProcess, create_session, run_turn, submit

pytestmark = pytest.mark.timeout(90)

WS = "ws-test"


def assistant_texts(app: AgentHostApp, turn_id: str) -> list[str]:
    for view in turn_views(app):
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
                view = next(v for v in turn_views(app) if v.turn["turnId"] == turn_id)
                assert view.turn["phase"] == "active"
                gate.set()
                await until(
                    pilot,
                    lambda: (
                        next(
                            (v.turn for v in turn_views(app) if v.turn["turnId"] == turn_id), {}
                        ).get("phase")
                        == "settled"
                    ),
                )
                assert assistant_texts(app, turn_id) == ["echo: hello there"]
                # The same widget grew and settled: the reply was updated in place.
                assert next(v for v in turn_views(app) if v.turn["turnId"] == turn_id) is view

            run_app(d, WS, scenario)
        finally:
            gate.set()
            d.stop()


def transcript_words(app: AgentHostApp) -> str:
    """The words on screen inside the transcript pane (line wraps and borders removed)."""
    region = app.query_one(TranscriptView).region
    rows = [
        "".join(segment.text for segment in line if not segment.control)
        for line in screen_segments(app)
    ]
    cells = [row[region.x : region.x + region.width] for row in rows[region.y : region.bottom]]
    return " ".join(" ".join(c.replace("▊", " ").replace("▎", " ").split()) for c in cells)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_the_gui_shows_a_model_timeout_in_words(tmp_path: Path, size: tuple[int, int]) -> None:
    with SilentServer() as silent:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.tutti-agent]\n"
            f'model_base_url = "{silent.base_url}"\n'
            "model_first_byte_seconds = 1\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, WS, title="silent")["agentSessionId"]
            turn_id = run_turn(c, sid, "hello", WS)["turnId"]

            async def main() -> None:
                engine = Engine.connect(d.api, d.events, WS)
                app = AgentHostApp(engine, own_engine=True)
                async with app.run_test(size=size) as pilot:
                    await until(pilot, lambda: app.engine.session(sid) is not None)
                    app.open_session(sid)
                    await until(
                        pilot,
                        lambda: any(v.turn["turnId"] == turn_id for v in turn_views(app)),
                    )
                    await pilot.pause(0.2)
                    words = transcript_words(app)
                    assert (
                        "failed: model_timeout: tutti-agent model endpoint "
                        f"{silent.base_url}/responses sent nothing within 1 s of the request "
                        "(model_first_byte_seconds)"
                    ) in words, words

            asyncio.run(main())
        finally:
            d.stop()


def progress_segments(app: AgentHostApp) -> list[Segment]:
    """The on-screen pieces of the transcript's retry note (the `progress` status line)."""
    return [
        segment
        for line in screen_segments(app)
        for segment in line
        if "retries the model request" in segment.text
    ]


def is_dim(segment: Segment, app: AgentHostApp) -> bool:
    """Drawn fainter than the Turn's header (Textual draws `dim` as a blended colour)."""
    header = next(s for line in screen_segments(app) for s in line if s.text.startswith("Turn "))
    assert segment.style is not None and header.style is not None
    assert segment.style.color is not None and header.style.color is not None
    faint = sum(segment.style.color.get_truecolor())
    return bool(segment.style.italic) and faint < sum(header.style.color.get_truecolor())


def test_a_retry_shows_as_a_dim_line_until_the_turn_streams_again(tmp_path: Path) -> None:
    calls: list[int] = []
    gate = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(3)  # silent past the first-byte limit: the provider retries
        return default_reply(body)

    # The retried request answers, sends its first event and holds; released, it drips a piece
    # every half second (its first piece well within the host's first-byte backstop).
    with ResponsesServer(reply, gate=gate, hold_after=1, drip_s=0.5) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.tutti-agent]\n"
            f'model_base_url = "{model.base_url}"\n'
            "model_first_byte_seconds = 2\n"
            "model_retries = 1\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, WS, title="retry")["agentSessionId"]

            async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
                await until(pilot, lambda: app.engine.session(sid) is not None)
                app.open_session(sid)
                await pilot.pause(0.3)
                turn_id = submit(c, sid, "hello there", WS)["turnId"]
                await until(pilot, lambda: progress_segments(app), timeout=30)
                words = transcript_words(app)
                assert (
                    "progress tutti-agent retries the model request: "
                    f"{model.base_url}/responses sent nothing within 2 s (attempt 1 of 2)"
                ) in words, words
                assert all(is_dim(s, app) for s in progress_segments(app))
                assert app.turns[-1]["phase"] == "active"
                gate.set()
                # The reply streams again: the note goes while the Turn is still running.
                await until(
                    pilot,
                    lambda: (
                        app.turns[-1]["phase"] == "active"
                        and any(t.startswith("echo") for t in assistant_texts(app, turn_id))
                    ),
                    timeout=30,
                )
                assert not progress_segments(app), transcript_words(app)
                await until(
                    pilot,
                    lambda: assistant_texts(app, turn_id) == ["echo: hello there"],
                    timeout=30,
                )
                assert not progress_segments(app)

            run_app(d, WS, scenario)
        finally:
            gate.set()
            d.stop()


def test_a_retry_note_goes_when_the_turn_settles(tmp_path: Path) -> None:
    with SilentServer() as silent:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.tutti-agent]\n"
            f'model_base_url = "{silent.base_url}"\n'
            "model_first_byte_seconds = 1\n"
            "model_retries = 1\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, WS, title="silent retry")["agentSessionId"]

            async def main() -> None:
                engine = Engine.connect(d.api, d.events, WS)
                app = AgentHostApp(engine, own_engine=True)
                async with app.run_test(size=(80, 24)) as pilot:
                    await until(pilot, lambda: app.engine.session(sid) is not None)
                    app.open_session(sid)
                    await pilot.pause(0.3)
                    submit(c, sid, "hello", WS)
                    await until(pilot, lambda: progress_segments(app), timeout=30)
                    assert app.turns[-1]["phase"] == "active"
                    await until(
                        pilot,
                        lambda: app.turns and app.turns[-1]["phase"] == "settled",
                        timeout=30,
                    )
                    await pilot.pause(0.2)
                    words = transcript_words(app)
                    assert "model_timeout" in words and "2 attempts" in words, words
                    assert not progress_segments(app), words

            asyncio.run(main())
        finally:
            d.stop()
