"""A worktree fork on Claude Code through a real daemon: Claude itself edits a file in a Turn
(a Bash tool call the fake model asks for, approved as a person would), the fork through that
Turn gets a worktree holding the file as it was then, and the child's Claude Code runs its Turn
in the new tree (its transcript filed under the tree's project directory), seeing that file and
not the source's later work."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_fakes.messages import MessagesServer
from tests.claude.test_claude_interactions import BASH, tool_reply
from tests.support.daemon import (
    DaemonProcess,
    create_session,
    respond,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.invariants import assert_invariants
from tests.support.worktree_forks import trees_beside, worktree_fork_params
from tests.support.worktree_repos import make_repo, repo_state
from transport.client import Client

# Four Claude Code turns and a fork: tens of seconds, so `make soak`, not `make test`.
pytestmark = [pytest.mark.claude, pytest.mark.long, pytest.mark.timeout(240)]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with MessagesServer(reply=tool_reply) as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            yield d
        finally:
            d.stop()


def run_bash(c: Client, sid: str, command: str) -> dict[str, Any]:
    """A Turn whose model asks Claude Code to run `command` with Bash, approved when asked."""
    turn = submit(c, sid, BASH + command)
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"], 120)
    respond(c, sid, turn["turnId"], pending[0]["requestId"], {"decision": "approve"})
    done = settle(c, sid, turn["turnId"], timeout=120)
    assert done["outcome"] == "completed", done
    return done


def reply(turn: dict[str, Any]) -> str:
    return str([m for m in turn["messages"] if m["kind"] == "assistant"][-1]["text"])


def test_claude_child_runs_in_its_worktree_and_sees_the_file_claude_wrote_at_the_fork_turn(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=120)
    sid = create_session(c, provider="claude-code", title="Claude edits", cwd=str(repo))[
        "agentSessionId"
    ]
    first = run_bash(c, sid, "printf 'claude wrote this' > src/app.py")
    assert (repo / "src" / "app.py").read_text() == "claude wrote this"
    run_bash(c, sid, "printf later > later.txt")
    assert (repo / "later.txt").is_file()
    before = repo_state(repo)

    op = c.call(
        "fork.create",
        worktree_fork_params(
            sid, first["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
        ),
    )["operation"]
    assert op["status"] == "committed", op
    tree = Path(op["workspace"]["path"])
    assert trees_beside(repo) == [tree] and op["session"]["cwd"] == str(tree)
    child = op["targetAgentSessionId"]
    seen = run_bash(c, child, 'cat src/app.py; echo; basename "$PWD"; ls later.txt 2>&1')
    text = reply(seen)
    assert "claude wrote this" in text, text
    assert f"\n{tree.name}\n" in text, text
    assert "No such file" in text, text
    assert repo_state(repo, except_branch_prefix="agenthost/") == before
    assert_invariants(daemon.home)
