"""A worktree fork on Codex through a real daemon: Codex itself edits a file in a Turn (a tool
call the fake model asks for), the fork through that Turn gets a worktree holding the file as
it was then, and the child's Codex runs its Turn in the new tree, seeing that file and not the
source's later work."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codex_helpers import codex_bin
from tool_model import ToolModel

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

# Four Codex turns and a fork: slow for `make test`, so `make soak`.
pytestmark = [pytest.mark.codex, pytest.mark.long, pytest.mark.timeout(240)]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with ToolModel() as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.codex]\n"
            f'command = "{codex_bin()}"\n'
            'model = "mock-model"\n'
            f'model_base_url = "{model.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            yield d
        finally:
            d.stop()


def reply(turn: dict[str, object]) -> str:
    messages = turn["messages"]
    assert isinstance(messages, list)
    return str([m for m in messages if m["kind"] == "assistant"][-1]["text"])


def run_approved(c: Client, sid: str, command: str) -> dict[str, Any]:
    """A Turn whose model asks Codex to run `command` (escalated): approved when asked."""
    turn = submit(c, sid, f"/run {command}")
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"], 120)
    respond(c, sid, turn["turnId"], pending[0]["requestId"], {"decision": "approve"})
    done = settle(c, sid, turn["turnId"], timeout=120)
    assert done["outcome"] == "completed", done
    return done


def test_codex_child_runs_in_its_worktree_and_sees_the_file_codex_wrote_at_the_fork_turn(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=120)
    sid = create_session(
        c,
        provider="codex",
        title="Codex edits",
        cwd=str(repo),
        settings={"approvalPolicy": "on-request"},
    )["agentSessionId"]
    first = run_approved(c, sid, "printf 'codex wrote this' > src/app.py")
    assert (repo / "src" / "app.py").read_text() == "codex wrote this"
    second = run_approved(c, sid, "printf later > later.txt")
    assert (repo / "later.txt").is_file(), second
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
    # The fake model quotes 200 characters of the output: short answers only.
    seen = run_approved(c, child, 'cat src/app.py; echo; basename "$PWD"; ls later.txt 2>&1')
    text = reply(seen)
    assert "codex wrote this" in text, text
    assert f"\n{tree.name}\n" in text, text
    assert "No such file" in text, text
    assert repo_state(repo, except_branch_prefix="agenthost/") == before
    assert_invariants(daemon.home)
