"""The GUI's fork dialog offers "same folder" / "new worktree" by keyboard (F5, pick the Turn,
`w`): the fork gets a worktree holding the Turn's files, the GUI opens the child and says where
its files are, and the details pane names the child's folder. `AGENTHOST_SCREENSHOT_DIR` saves
the dialog and the details pane as SVGs to look at."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from client.gui.app import AgentHostApp
from client.gui.controls import ForkScreen
from client.gui.keyboard import DetailsScreen, TurnPickerScreen
from client.gui.session_list import SessionTree
from tests.client.test_client_gui import open_and_wait, until
from tests.client.test_client_gui_keyboard import run_app
from tests.support.daemon import DaemonProcess, create_session, run_turn
from tests.support.worktree_repos import make_repo
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def test_the_fork_dialog_offers_a_new_worktree_by_keyboard_and_the_child_says_where_its_files_are(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Parser", cwd=str(repo))["agentSessionId"]
    turn = run_turn(client, sid, "/write src/app.py print('turn one')", ws)
    notes: list[str] = []

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        original = app.notify

        def notify(message: str, **kw: Any) -> None:
            notes.append(message)
            original(message, **kw)

        app.notify = notify  # type: ignore[method-assign]
        await open_and_wait(app, pilot, sid, 1)
        app.query_one(SessionTree).focus()
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ForkScreen))
        assert "Turn 1" in app.screen.question
        shots = os.environ.get("AGENTHOST_SCREENSHOT_DIR")
        if shots:
            app.save_screenshot("gui-fork-worktree-dialog.svg", shots)
        await pilot.press("w")
        await until(pilot, lambda: not isinstance(app.screen, ForkScreen))
        record = await until(
            pilot,
            lambda: (
                (r := app.engine.mutation(sid, turn["turnId"])) is not None
                and r.child_session_id
                and app.current == r.child_session_id
                and r
            ),
            timeout=60,
        )
        assert record.workspace == "worktree"
        child = app.engine.session(record.child_session_id)
        assert child is not None
        tree = Path(child["cwd"])
        assert tree.parent == repo.parent / "project.agenthost"
        assert (tree / "src" / "app.py").read_text() == "print('turn one')"
        # The toast names the worktree by its last parts (a whole path wraps mid-name in a
        # toast); the details pane has it whole.
        where = f"…/project.agenthost/{tree.name}"
        await until(pilot, lambda: any(where in n for n in notes))
        assert not any(str(tree) in n for n in notes), notes
        app.action_details()
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen))
        await pilot.pause(0.3)
        shown = "\n".join(str(w.render()) for w in app.screen.query(Static))
        assert f"cwd {tree}" in shown, shown
        if shots:
            app.save_screenshot("gui-fork-worktree-details.svg", shots)

    run_app(daemon, ws, (120, 36), scenario)


def test_same_folder_is_the_s_key_and_escape_forks_nothing(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Plain")["agentSessionId"]
    turn = run_turn(client, sid, "hello", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        app.query_one(SessionTree).focus()
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ForkScreen))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ForkScreen))
        assert app.engine.mutation(sid, turn["turnId"]) is None
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ForkScreen))
        await pilot.press("s")
        record = await until(pilot, lambda: app.engine.mutation(sid, turn["turnId"]), timeout=30)
        assert record.workspace == "shared"

    run_app(daemon, ws, (80, 24), scenario)
