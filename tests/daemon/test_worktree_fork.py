"""`fork.create {workspace: "worktree"}` through a real daemon and Tutti Agent: the agent itself
edits a file in a Turn, the fork through that Turn gets a worktree holding the files as they
were then, and the child's agent runs its Turn there; the person's repository gains only the
worktree and its branch; a Turn without a checkpoint is refused with a typed reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.invariants import assert_invariants
from tests.support.worktree_forks import trees_beside, worktree_fork_params
from tests.support.worktree_repos import git, make_repo, repo_state
from transport.client import ApiError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        yield d
    finally:
        d.stop()


def reply(turn: dict[str, object]) -> str:
    messages = turn["messages"]
    assert isinstance(messages, list)
    return str([m for m in messages if m["kind"] == "assistant"][-1]["text"])


def test_the_child_agent_runs_in_its_worktree_and_sees_the_file_as_at_the_fork_turn(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    sid = create_session(c, title="Fix the parser", cwd=str(repo))["agentSessionId"]
    first = run_turn(c, sid, "/write src/app.py print('the agent wrote this')")
    assert reply(first) == "wrote: src/app.py"
    assert (repo / "src" / "app.py").read_text() == "print('the agent wrote this')"
    second = run_turn(c, sid, "/write later.txt after the fork Turn")
    assert reply(second) == "wrote: later.txt"
    before = repo_state(repo)

    params = worktree_fork_params(
        sid, first["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
    )
    op = c.call("fork.create", params)["operation"]
    assert op["status"] == "committed", op
    where = op["workspace"]
    assert where["mode"] == "worktree" and where["state"] == "made"
    tree = Path(where["path"])
    assert trees_beside(repo) == [tree]
    assert where["cwd"] == str(tree) and op["session"]["cwd"] == str(tree)
    assert where["branch"].startswith("agenthost/fix-the-parser-")
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD") == where["branch"]
    assert (tree / "src" / "app.py").read_text() == "print('the agent wrote this')"
    assert not (tree / "later.txt").exists()
    assert repo_state(repo, except_branch_prefix="agenthost/") == before

    child = op["targetAgentSessionId"]
    seen = run_turn(c, child, "/read src/app.py")
    assert reply(seen) == "read: print('the agent wrote this')"
    assert reply(run_turn(c, child, "/read later.txt")) == "read: later.txt is missing"
    run_turn(c, child, "/write child.txt only in the child")
    assert (tree / "child.txt").is_file() and not (repo / "child.txt").exists()
    # fork.get and a replay say the same; the replay makes no second tree.
    got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
    assert got["operation"]["workspace"] == where
    assert c.call("fork.create", params)["operation"]["workspace"] == where
    assert trees_beside(repo) == [tree]
    assert_invariants(daemon.home)


def test_a_worktree_fork_through_a_turn_without_a_checkpoint_is_refused(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"  # the Turn's checkpoint: unavailable, cwd_missing
    c = daemon.client(timeout=60)
    sid = create_session(c, cwd=str(gone))["agentSessionId"]
    turn = run_turn(c, sid, "hello")
    assert turn["workspace"]["state"] == "unavailable", turn["workspace"]
    params = worktree_fork_params(
        sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
    )
    with pytest.raises(ApiError) as refused:
        c.call("fork.create", params)
    assert refused.value.status == 409
    assert refused.value.reason == "workspace_checkpoint_missing"
    assert refused.value.params == {"turnId": turn["turnId"], "workspaceReason": "cwd_missing"}
    assert "does not exist" in refused.value.message
    assert not (tmp_path / "gone.agenthost").exists()
    # The same request id asking for a shared fork is a new request, and forks as before.
    shared = {**params, "workspace": "shared"}
    assert c.call("fork.create", shared)["operation"]["workspace"] == {"mode": "shared"}
    with pytest.raises(ApiError) as bad:
        c.call("fork.create", {**params, "workspace": "elsewhere"})
    assert bad.value.status == 400
