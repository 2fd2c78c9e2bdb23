"""The crash matrix's `host.workspace.*` column: a real daemon SIGKILLed at each step of a
`worktree` fork (tree whole in its temporary directory, renamed into place, recorded on the
operation), restarted, recovered. After each: the operation is `failed` (nothing was
dispatched), no tree, half-made tree, branch or worktree registration is left, the person's
repository is as before, and every invariant holds. A last fork with no failpoint makes one
whole tree recorded on its committed operation, and a restart keeps it."""

from __future__ import annotations

import shutil
import signal
import uuid
from pathlib import Path

import pytest

from tests.reliability.reliability_harness import host_fired
from tests.support.daemon import DaemonProcess
from tests.support.invariants import Law, assert_invariants, check_invariants
from tests.support.worktree_forks import (
    kill_after_a_failed_forks_tree_removed,
    source_in,
    trees_beside,
    worktree_fork_params,
)
from tests.support.worktree_repos import git, make_repo, repo_state, tree_files

pytestmark = pytest.mark.timeout(240)

POINTS = (
    "host.workspace.after_materialize",
    "host.workspace.after_rename",
    "host.workspace.after_record",
)


def test_a_kill_at_each_workspace_step_leaves_no_tree_or_one_whole_recorded_tree(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "project")
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid, turn = source_in(c, repo)
        expected = tree_files(repo)
        before = repo_state(repo)
        for point in POINTS:
            c.call("debug.failpoints", {"points": {point: "once:kill"}})
            params = worktree_fork_params(
                sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
            )
            c.submit("fork.create", params)  # the reply never comes: the daemon dies
            assert d.wait_exit(60) == -signal.SIGKILL, d.tail_log()
            assert host_fired(d, point)
            d = DaemonProcess(home).start()
            c = d.client(timeout=60)
            op = c.call("fork.create", params)["operation"]  # the replay: the original
            assert op["status"] == "failed", (point, op)
            assert op["workspace"]["state"] == "removed", (point, op)
            assert trees_beside(repo) == [], point
            assert git(repo, "branch", "--list", "agenthost/*") == "", point
            assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1
            assert repo_state(repo) == before, point
            assert_invariants(home)
        op = c.call(
            "fork.create",
            worktree_fork_params(
                sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
            ),
        )["operation"]
        assert op["status"] == "committed" and op["workspace"]["state"] == "made"
        tree = Path(op["workspace"]["path"])
        d.kill()
        d = DaemonProcess(home).start()
        assert trees_beside(repo) == [tree]
        ignored = ("ignored/", "node_modules/", "run.log", ".env", "big.dat")
        assert {k: v for k, v in tree_files(tree).items() if not k.startswith(ignored)} == {
            k: v for k, v in expected.items() if not k.startswith(ignored)
        }
        assert_invariants(home)
    finally:
        d.stop()


def test_the_checker_reports_each_broken_worktree_law(tmp_path: Path) -> None:
    """A real worktree fork's home, tampered the way a bug would leave it: a half-made tree
    beside the whole one, a second branch of the operation, the recorded tree gone."""
    repo = make_repo(tmp_path / "project")
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid, turn = source_in(c, repo)
        op = c.call(
            "fork.create",
            worktree_fork_params(
                sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
            ),
        )["operation"]
    finally:
        d.stop()
    tree = Path(op["workspace"]["path"])
    assert check_invariants(home).ok

    def broken() -> list[str]:
        return [v.detail for v in check_invariants(home).violations if v.law is Law.WORKTREE]

    partial = tree.parent / f".partial-{tree.name}"
    partial.mkdir()
    assert any("half-made" in v for v in broken())
    partial.rmdir()
    git(repo, "branch", f"agenthost/another-{tree.name}")
    assert any("two trees or two branches" in v for v in broken())
    git(repo, "branch", "-D", f"agenthost/another-{tree.name}")
    shutil.rmtree(tree)
    assert any("recorded a tree that is gone" in v for v in broken())


def test_a_kill_after_a_failed_forks_tree_is_removed_and_before_its_record(
    tmp_path: Path,
) -> None:
    """`host.workspace.after_remove`: a fork failed before dispatch, its tree removed, the daemon
    SIGKILLed before the tree is recorded `removed`. The restart records it (the removal is
    idempotent): no tree, branch or registration is left and every invariant holds."""
    repo = make_repo(tmp_path / "project")
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        sid, turn = source_in(d.client(timeout=60), repo)
        before = repo_state(repo)
        params = kill_after_a_failed_forks_tree_removed(d, sid, turn)
        d = DaemonProcess(home).start()
        c = d.client(timeout=60)
        op = c.call("fork.create", params)["operation"]  # the replay: the original
        assert op["status"] == "failed", op
        assert op["workspace"]["state"] == "removed", op
        assert trees_beside(repo) == []
        assert git(repo, "branch", "--list", "agenthost/*") == ""
        assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1
        assert repo_state(repo) == before
        assert_invariants(home)
    finally:
        d.stop()


def test_a_kill_after_a_deleted_childs_tree_is_removed_and_before_its_record(
    tmp_path: Path,
) -> None:
    """`host.session.delete.after_tree_removed`: a `worktree: "remove"` delete of a fork's
    child, SIGKILLed once the Session is deleted and its tree removed, before the tree is
    recorded `removed`. The restart finishes it (`finish_removals`): recorded `removed`, no tree
    or branch left, the Session stays deleted, every invariant holds."""
    from tests.daemon.test_worktree_delete import fork_child
    from tests.support.daemon import WS
    from tests.support.worktree_forks import tree_state

    repo = make_repo(tmp_path / "project")
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        child, where = fork_child(c, repo)
        point = "host.session.delete.after_tree_removed"
        c.call("debug.failpoints", {"points": {point: "once:kill"}})
        c.submit(
            "session.delete",
            {"workspaceId": WS, "agentSessionId": child, "worktree": "remove"},
        )
        assert d.wait_exit(60) == -signal.SIGKILL, d.tail_log()
        assert host_fired(d, point)
        d = DaemonProcess(home).start()
        c = d.client(timeout=60)
        status, _ = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": child})
        assert status == 404
        assert tree_state(d, child) == "removed"
        assert not Path(where["path"]).exists()
        assert git(repo, "branch", "--list", "agenthost/*") == ""
        assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1
        assert_invariants(home)
    finally:
        d.stop()
