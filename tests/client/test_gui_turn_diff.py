"""A Turn's diff on demand in the GUI, by keyboard: F6, pick the Turn, and a modal screen shows
what that Turn changed in its folder (`session.workspaceDiff` from a real daemon over a real git
repository); Esc closes it. A Turn without a checkpoint says why in words.
`AGENTHOST_SCREENSHOT_DIR` saves the diff screen as an SVG and a PNG to look at."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Label, Static

from client.gui.app import AgentHostApp
from client.gui.diff_view import DiffScreen
from client.gui.keyboard import HelpScreen, TurnPickerScreen
from client.gui.session_list import SessionTree
from tests.client.make_screenshot import screen_segments, to_png
from tests.client.test_client_gui import open_and_wait, until
from tests.client.test_client_gui_keyboard import run_app
from tests.support.daemon import DaemonProcess, create_session, run_turn
from tests.support.git_repos import make_repo
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def shown(app: AgentHostApp) -> str:
    screen = app.screen
    return "\n".join(str(w.render()) for w in (*screen.query(Label), *screen.query(Static)))


def test_f6_shows_the_picked_turns_diff_and_escape_closes_it(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Parser", cwd=str(repo))["agentSessionId"]
    run_turn(client, sid, "/write a.txt changed by turn one", ws)
    run_turn(client, sid, "/write notes/new.txt written by turn two", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        app.query_one(SessionTree).focus()
        await pilot.press("f6")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        assert "diff" in shown(app)
        # Newest first: down once picks Turn 1.
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, DiffScreen))
        text = shown(app)
        assert f"Turn 1 in {repo}: 1 file changed: M a.txt" in text, text
        assert "-one" in text and "+changed by turn one" in text, text
        assert "new.txt" not in text  # Turn 2's change is not Turn 1's
        # The keys scroll it: the scroll area has the focus.
        assert app.screen.query_one("#diff-scroll").has_focus
        shots = os.environ.get("AGENTHOST_SCREENSHOT_DIR")
        if shots:
            app.save_screenshot("gui-turn-diff.svg", shots)
            to_png(screen_segments(app), Path(shots) / "gui-turn-diff.png")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, (DiffScreen, TurnPickerScreen)))
        # The newest Turn is highlighted first.
        await pilot.press("f6")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DiffScreen))
        text = shown(app)
        assert "Turn 2" in text and "A notes/new.txt" in text and "+written by turn two" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DiffScreen))
        # The key is listed on the F1 screen.
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "F6" in shown(app) and "see its diff" in shown(app)

    run_app(daemon, ws, (120, 36), scenario)


def test_a_turn_without_a_checkpoint_says_why_in_words(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    sid = create_session(client, ws, title="Lost", cwd=str(gone))["agentSessionId"]
    shutil.rmtree(gone)  # the folder went away: the Turn's checkpoint is unavailable
    run_turn(client, sid, "hello", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        app.query_one(SessionTree).focus()
        await pilot.press("f6")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DiffScreen))
        text = shown(app)
        assert "Turn 1: no diff" in text, text
        assert (
            f"Turn 1 has no workspace checkpoint: the working directory {gone} does not exist "
            "(workspace_checkpoint_missing)"
        ) in text, text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DiffScreen))

    run_app(daemon, ws, (80, 24), scenario)
