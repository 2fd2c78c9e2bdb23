"""The GUI's delete of a worktree fork's child offers keep / remove for its worktree by keyboard
(F8, then `k` or `r`); a worktree holding changes no turn recorded is not removed: the GUI says
so and offers "Remove anyway" (Escape keeps everything). `AGENTHOST_SCREENSHOT_DIR` saves the
dialogs as SVGs to look at."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from client.gui.app import AgentHostApp
from client.gui.controls import ConfirmScreen, DeleteTreeScreen
from client.gui.session_list import SessionTree
from tests.client.test_client_gui import open_and_wait, until
from tests.client.test_client_gui_keyboard import run_app
from tests.support.daemon import DaemonProcess, create_session, run_turn
from tests.support.worktree_forks import worktree_fork_params
from tests.support.worktree_repos import make_repo
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


def fork_child(client: Client, ws: str, sid: str, turn_id: str) -> tuple[str, Path]:
    params = worktree_fork_params(
        sid, turn_id, request_id=str(uuid.uuid4()), target=str(uuid.uuid4()), ws=ws
    )
    op = client.call("fork.create", params)["operation"]
    assert op["status"] == "committed", op
    # Acknowledged, so the next fork on this boundary is a new operation.
    client.call("fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})
    return str(op["targetAgentSessionId"]), Path(op["workspace"]["path"])


async def delete_dialog(app: AgentHostApp, pilot: Pilot[Any], sid: str) -> None:
    """Open `sid` and press F8 on the session list: the keep / remove dialog shows."""
    await open_and_wait(app, pilot, sid, 1)
    app.query_one(SessionTree).focus()
    await pilot.press("f8")
    await until(pilot, lambda: isinstance(app.screen, DeleteTreeScreen))


def alive(client: Client, ws: str, sid: str) -> bool:
    try:
        client.call("session.get", {"workspaceId": ws, "agentSessionId": sid})
    except ApiError as exc:
        assert exc.status == 404
        return False
    return True


def test_delete_offers_keep_or_remove_for_a_fork_worktree_by_keyboard(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Parser", cwd=str(repo))["agentSessionId"]
    turn = run_turn(client, sid, "/write src/app.py print('turn one')", ws)
    dirty, dirty_tree = fork_child(client, ws, sid, turn["turnId"])
    (dirty_tree / "scratch.txt").write_text("by hand\n")
    clean, clean_tree = fork_child(client, ws, sid, turn["turnId"])
    assert clean_tree != dirty_tree
    shots = os.environ.get("AGENTHOST_SCREENSHOT_DIR")

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        # Remove, refused: nothing is deleted until "Remove anyway"; Escape keeps it all.
        await delete_dialog(app, pilot, dirty)
        assert app.screen.path == str(dirty_tree)
        if shots:
            app.save_screenshot("gui-delete-worktree-dialog.svg", shots)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=30)
        assert "Nothing was deleted" in app.screen.question
        assert str(dirty_tree) in app.screen.question
        if shots:
            app.save_screenshot("gui-delete-worktree-refused.svg", shots)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert alive(client, ws, dirty) and (dirty_tree / "scratch.txt").is_file()
        # Keep: the Session goes, its folder stays.
        await pilot.press("f8")
        await until(pilot, lambda: isinstance(app.screen, DeleteTreeScreen))
        await pilot.press("k")
        await until(pilot, lambda: app.engine.session(dirty) is None, timeout=30)
        assert dirty_tree.is_dir()

        # Remove, clean: the Session and its folder go.
        await delete_dialog(app, pilot, clean)
        await pilot.press("r")
        await until(pilot, lambda: app.engine.session(clean) is None, timeout=30)
        assert not clean_tree.exists()

    run_app(daemon, ws, (120, 36), scenario)
    assert not alive(client, ws, dirty) and not alive(client, ws, clean)


def test_delete_says_when_git_could_not_remove_the_worktree(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    """Remove, and git cannot (a file in the tree nothing can unlink): the Session goes and
    the GUI says its worktree could not be removed and why — never that it stays by choice."""
    from tests.support.worktree_repos import make_unremovable

    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Parser", cwd=str(repo))["agentSessionId"]
    turn = run_turn(client, sid, "/write src/app.py print('turn one')", ws)
    child, tree = fork_child(client, ws, sid, turn["turnId"])
    undo = make_unremovable(tree / "src" / "app.py")

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        def said() -> list[str]:
            return [str(n.message) for n in app._notifications]  # noqa: SLF001

        await delete_dialog(app, pilot, child)
        await pilot.press("r")
        await until(pilot, lambda: app.engine.session(child) is None, timeout=30)
        await until(pilot, lambda: any("could not be removed" in m for m in said()))
        assert not any("worktree stays" in m for m in said()), said()

    try:
        run_app(daemon, ws, (120, 36), scenario)
    finally:
        undo()
    assert not alive(client, ws, child) and tree.is_dir()
