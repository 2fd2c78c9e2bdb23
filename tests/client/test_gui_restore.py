"""Restore by keyboard in the GUI: from the F6 diff window `b` / `a` put the Session's folder
back as the Turn found / left it (`workspace.restore` on a real daemon over a real git
repository), each asked first; the toast says what was written and removed, and F9 undoes it.
A folder another live session works in is restored only after a second confirmation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from client.gui.app import AgentHostApp
from client.gui.controls import ConfirmScreen
from client.gui.diff_view import DiffScreen
from client.gui.keyboard import HelpScreen, TurnPickerScreen
from client.gui.session_list import SessionTree
from tests.client.test_client_gui import open_and_wait, until
from tests.client.test_client_gui_keyboard import run_app
from tests.client.test_gui_turn_diff import shown
from tests.support.daemon import DaemonProcess, create_session, run_turn
from tests.support.git_repos import make_repo
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def toasts(app: AgentHostApp) -> str:
    return "\n".join(str(n.message) for n in app._notifications)


async def diff_of_newest(app: AgentHostApp, pilot: Pilot[Any]) -> None:
    app.query_one(SessionTree).focus()
    await pilot.press("f6")
    await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, DiffScreen))


def test_b_in_the_diff_window_restores_the_turns_before_and_f9_undoes_it(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Restore", cwd=str(repo))["agentSessionId"]
    run_turn(client, sid, "/write a.txt changed by turn one", ws)
    assert (repo / "a.txt").read_text() == "changed by turn one"

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        await diff_of_newest(app, pilot)
        assert "a: restore the files as this turn left them" in shown(app)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Restore the folder as Turn 1 found it?" in shown(app), shown(app)
        await pilot.press("escape")  # asked first: cancelling writes nothing
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert (repo / "a.txt").read_text() == "changed by turn one"
        await diff_of_newest(app, pilot)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: "restored" in toasts(app))
        assert (repo / "a.txt").read_text() == "one\n"
        assert "as Turn 1 found it: 1 file(s) written: M a.txt. F9 undoes it" in toasts(app)
        # F9: the undo, asked first too, puts the turn's file back.
        await pilot.press("f9")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "as it was before the last restore" in shown(app)
        await pilot.press("y")
        await until(pilot, lambda: (repo / "a.txt").read_text() == "changed by turn one")
        # Both keys are listed on F1.
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        lines = app.screen.lines
        assert any(line.startswith("F9 ") and "Undo the last restore" in line for line in lines)
        assert any(line.startswith("F6 ") and "restore its files" in line for line in lines)

    run_app(daemon, ws, (80, 24), scenario)


def test_a_shared_folder_is_restored_only_after_a_second_confirmation(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Mine", cwd=str(repo))["agentSessionId"]
    other = create_session(client, ws, title="Theirs", cwd=str(repo))["agentSessionId"]
    run_turn(client, other, "hello", ws)  # a live session in the same folder
    run_turn(client, sid, "/write b.txt changed", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        await diff_of_newest(app, pilot)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        # Refused (workspace_shared): a second question naming the other session.
        await until(pilot, lambda: "Restore it as Turn 1 found it anyway?" in shown(app))
        assert "Nothing was restored" in shown(app) and other[:8] in shown(app)
        assert (repo / "b.txt").read_text() == "changed"
        await pilot.press("y")
        await until(pilot, lambda: (repo / "b.txt").read_text() == "two\n")
        await until(pilot, lambda: "1 file(s) written: M b.txt" in toasts(app))

    run_app(daemon, ws, (80, 24), scenario)
