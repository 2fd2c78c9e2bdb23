"""`session.delete` of a worktree fork's child through a real daemon, Tutti Agent and a real git
repository: `worktree: "keep"` (the default) leaves the tree and its branch; `"remove"` removes
them, but a tree holding files its newest checkpoint does not, or a branch with commits no other
branch has, is refused (`workspace_worktree_dirty`) unless `force` — and a forced removal keeps
a branch that has commits of its own."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from actors.checkpoints import DirectoryLocks
from agenthost.worktree_delete import RemovalRetries, finish_removals
from storage.store import Store
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from tests.support.invariants import Law, assert_invariants, check_invariants
from tests.support.store_lock import ReleaseWhenLogged, WriteLockHolder
from tests.support.worktree_forks import (
    removal_counts,
    tree_state,
    trees_beside,
    worktree_fork_params,
)
from tests.support.worktree_repos import git, make_repo, make_unremovable
from transport.client import ApiError, Client
from workspace.shadow import ShadowStore
from workspace.worktree import Worktrees

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        yield d
    finally:
        d.stop()


def fork_child(c: Client, repo: Path) -> tuple[str, dict[str, Any]]:
    """A worktree fork of a Session in `repo` through a Turn that wrote a file: the child's id
    and the fork's `workspace`."""
    sid = create_session(c, title="Try it", cwd=str(repo))["agentSessionId"]
    turn = run_turn(c, sid, "/write src/app.py print('fork me')")
    params = worktree_fork_params(
        sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
    )
    op = c.call("fork.create", params)["operation"]
    assert op["status"] == "committed", op
    return str(op["targetAgentSessionId"]), dict(op["workspace"])


def delete(c: Client, sid: str, **extra: Any) -> dict[str, Any]:
    return dict(c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid, **extra}))


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()


def test_delete_keeps_a_fork_tree_by_default_and_says_so(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    tree = Path(where["path"])

    done = delete(c, child)
    assert done == {
        "deleted": True,
        "worktree": {
            "path": str(tree),
            "cwd": where["cwd"],
            "branch": where["branch"],
            "state": "kept",
        },
    }
    assert tree.is_dir() and where["branch"] in branches(repo)
    assert_invariants(daemon.home)


def test_remove_refuses_uncaptured_changes_and_removes_once_a_turn_captured_them(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    tree = Path(where["path"])
    (tree / "scratch.txt").write_text("written by hand after the fork\n")

    with pytest.raises(ApiError) as refused:
        delete(c, child, worktree="remove")
    assert refused.value.status == 409
    assert refused.value.reason == "workspace_worktree_dirty"
    assert refused.value.params["uncaptured"] is True
    assert refused.value.params["commits"] == 0
    assert refused.value.params["path"] == str(tree)
    assert "force" in refused.value.message
    # Nothing happened: the Session lives on, its tree and branch too.
    assert c.call("session.get", {"workspaceId": WS, "agentSessionId": child})
    assert (tree / "scratch.txt").is_file() and where["branch"] in branches(repo)

    # A Turn of the child checkpoints the tree: nothing is uncaptured any more.
    run_turn(c, child, "/write child.txt from the child's agent")
    done = delete(c, child, worktree="remove")
    assert done["worktree"] == {
        "path": str(tree),
        "cwd": where["cwd"],
        "branch": where["branch"],
        "state": "removed",
        "branchKept": False,
    }
    assert not tree.exists() and trees_beside(repo) == []
    assert where["branch"] not in branches(repo)
    assert str(tree) not in git(repo, "worktree", "list", "--porcelain")
    with pytest.raises(ApiError) as gone:
        c.call("session.get", {"workspaceId": WS, "agentSessionId": child})
    assert gone.value.status == 404
    assert_invariants(daemon.home)


def test_remove_refuses_a_branch_with_its_own_commits_and_force_keeps_the_branch(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    tree, branch = Path(where["path"]), str(where["branch"])
    run_turn(c, child, "/write feature.txt the child's work")
    git(tree, "add", "feature.txt")
    git(tree, "commit", "-q", "-m", "the child's work")
    tip = git(tree, "rev-parse", "HEAD")

    with pytest.raises(ApiError) as refused:
        delete(c, child, worktree="remove")
    assert refused.value.reason == "workspace_worktree_dirty"
    assert refused.value.params["commits"] == 1
    assert refused.value.params["uncaptured"] is False
    assert branch in refused.value.message
    with pytest.raises(ApiError) as bad:
        delete(c, child, worktree="discard")
    assert bad.value.status == 400

    done = delete(c, child, worktree="remove", force=True)
    assert done["worktree"]["state"] == "removed" and done["worktree"]["branchKept"] is True
    assert not tree.exists()
    # The commit is never lost by a delete: its branch stays for the person.
    assert git(repo, "rev-parse", f"refs/heads/{branch}") == tip
    assert_invariants(daemon.home)


def test_a_session_without_a_fork_tree_deletes_as_before(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    sid = create_session(c, cwd=str(repo))["agentSessionId"]
    assert delete(c, sid, worktree="remove") == {"deleted": True}
    assert repo.is_dir()


def test_a_removal_a_stop_interrupted_is_finished_at_the_next_start(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The state a kill between the delete's commit and the tree's removal leaves (the Session
    deleted, its tree marked `removing` and still on disk): the next start removes it."""
    repo, child, where = left_removing(daemon, tmp_path)
    daemon.start()
    assert not Path(where["path"]).exists() and where["branch"] not in branches(repo)
    assert tree_state(daemon, child) == "removed"
    assert_invariants(daemon.home)


def left_removing(
    daemon: DaemonProcess, tmp_path: Path, before_kill: Callable[[Client, str], None] | None = None
) -> tuple[Path, str, dict[str, Any]]:
    """A worktree fork's child deleted, its tree marked `removing` and still on disk (what a
    kill between the delete's commit and the removal leaves), the daemon killed: the repo,
    the child and the fork's `workspace`. `before_kill(client, child's cwd)`: more done before
    the kill."""
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    delete(c, child)  # kept: the tree stays, recorded `made`
    if before_kill is not None:
        before_kill(c, where["cwd"])
    daemon.kill()
    conn = apsw.Connection(str(daemon.home / "store.sqlite3"))
    conn.execute(
        "UPDATE fork_operations SET workspace_state = 'removing',"
        " deleted_tree_path = json_extract(workspace_json, '$.path') WHERE target_session_id = ?",
        (child,),
    )
    conn.close()
    assert Path(where["path"]).is_dir()
    return repo, child, where


def test_a_removal_left_by_a_stop_is_not_finished_under_a_session_working_in_the_tree(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A Session started in the tree after its child's delete (a person's, in any workspace):
    start-up's `finish_removals` keeps the tree, still `removing`, and that Session's next
    Turn runs in it. Before, the start removed the tree under it."""
    users: list[str] = []

    def start_one(c: Client, cwd: str) -> None:
        users.append(create_session(c, title="in the tree", cwd=cwd)["agentSessionId"])

    _, child, where = left_removing(daemon, tmp_path, start_one)
    daemon.start()
    assert Path(where["path"]).is_dir() and tree_state(daemon, child) == "removing"
    # The daemon's log lines reach its file from a queue (agenthost/log_queue.py): waited for.
    assert wait_for(lambda: "in use by" in daemon.tail_log(100_000), 30), daemon.tail_log()
    c = daemon.client(timeout=60)
    assert run_turn(c, users[0], "still here?")["outcome"] == "completed"


def test_a_removal_finished_at_start_waits_for_a_store_another_process_holds(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Start-up's `finish_removals` with the store held by another process as it runs: the
    tree is removed, its `removed` record meets the lock, backs off (`start_write`) and lands
    once the lock is let go. Without its retry the record raised StoreBusy and the start
    failed."""
    repo, child, where = left_removing(daemon, tmp_path)
    store = Store.open(daemon.home / "store.sqlite3", busy_timeout_ms=100)
    try:
        holder = WriteLockHolder(daemon.home / "store.sqlite3").acquire()
        with ReleaseWhenLogged(holder, "deferred") as seen:
            done = finish_removals(store, Worktrees(ShadowStore(daemon.home / "checkpoints")))
        assert seen.seen >= 1  # the record met the lock (not vacuous)
        assert done == 1
    finally:
        store.close()
    assert not Path(where["path"]).exists() and where["branch"] not in branches(repo)
    assert tree_state(daemon, child) == "removed"
    assert_invariants(daemon.home)


def test_remove_keeps_a_tree_another_live_session_works_in(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A shared-workspace fork of the child works in the child's tree: deleting the child with
    `remove` (even forced) deletes the Session and keeps the tree, naming who works there, and
    that fork's next Turn runs in it. Removing it took the fork's folder: its next Turn failed
    "cwd is not a directory" (the crash soak's seed 1548273082)."""
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    tree = Path(where["path"])
    turn = run_turn(c, child, "/write child.txt from the child's agent")
    shared = c.call(
        "fork.create",
        {
            "workspaceId": WS,
            "agentSessionId": child,
            "requestId": str(uuid.uuid4()),
            "targetAgentSessionId": str(uuid.uuid4()),
            "point": {"type": "throughTurn", "turnId": turn["turnId"]},
        },
    )["operation"]
    assert shared["status"] == "committed", shared
    grandchild = str(shared["targetAgentSessionId"])
    got = c.call("session.get", {"workspaceId": WS, "agentSessionId": grandchild})
    assert got["session"]["cwd"] == where["cwd"]

    done = delete(c, child, worktree="remove", force=True)
    assert done["deleted"] is True
    assert done["worktree"]["state"] == "kept"
    assert done["worktree"]["inUseBy"] == [grandchild]
    assert tree.is_dir() and where["branch"] in branches(repo)
    with pytest.raises(ApiError) as gone:
        c.call("session.get", {"workspaceId": WS, "agentSessionId": child})
    assert gone.value.status == 404
    assert run_turn(c, grandchild, "still here?")["outcome"] == "completed"
    assert_invariants(daemon.home)

    # The law the checker keeps: the same tree recorded removed (and gone) while the
    # grandchild works in it is reported.
    daemon.stop()
    shutil.rmtree(tree)
    with apsw.Connection(str(daemon.home / "store.sqlite3")) as conn:
        conn.execute(
            "UPDATE fork_operations SET workspace_state = 'removed'"
            " WHERE workspace_mode = 'worktree'"
        )
    report = check_invariants(daemon.home)
    assert any(
        v.law is Law.WORKTREE and f"{grandchild} works in it" in v.detail for v in report.violations
    ), report.violations


def test_a_tree_git_cannot_remove_still_ends_the_delete_and_says_so(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """`remove` of a tree that git cannot remove (a file in it made immutable: `git worktree
    remove` and the fallback's unlink both fail). The Session was deleted before the removal
    began: a raise there skipped the rest of the delete — the deleted Session's provider
    runtime kept running and its runtime dir stayed — and answered an error for a delete that
    had happened, since the reply could say only `kept` or `removed`. Now the delete ends as
    any other and says `state: "removing"` with git's `error`; the tree stays recorded
    `removing`, and the next start finishes the removal once it can."""
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    tree = Path(where["path"])
    run_turn(c, child, "/write child.txt from the child's agent")  # its runtime is live
    runtime_dir = daemon.home / "runtimes" / WS / child
    assert runtime_dir.is_dir()
    live = c.call("host.status")["runtimes"]["tutti-agent"]["live"]
    pinned = tree / "child.txt"
    undo = make_unremovable(pinned)
    try:
        done = delete(c, child, worktree="remove")
        assert done["deleted"] is True
        worktree = done["worktree"]
        assert {k: worktree[k] for k in ("path", "cwd", "branch", "state")} == {
            "path": str(tree),
            "cwd": where["cwd"],
            "branch": where["branch"],
            "state": "removing",
        }, worktree
        assert worktree["error"], worktree
        assert pinned.is_file()
        # The rest of the delete happened: its runtime stopped, its runtime dir removed.
        assert wait_for(lambda: not runtime_dir.exists(), 30)
        assert wait_for(
            lambda: c.call("host.status")["runtimes"]["tutti-agent"]["live"] == live - 1, 30
        )
        with pytest.raises(ApiError) as gone:
            c.call("session.get", {"workspaceId": WS, "agentSessionId": child})
        assert gone.value.status == 404
        assert_invariants(daemon.home)
    finally:
        undo()
    daemon.stop()
    daemon.start()  # the file removable again: the next start finishes the removal
    assert not tree.exists() and where["branch"] not in branches(repo)
    assert tree_state(daemon, child) == "removed"
    assert_invariants(daemon.home)


def test_a_tree_git_cannot_remove_is_retried_live_and_recorded_once_it_goes(
    tmp_path: Path,
) -> None:
    """A tree left `removing` (git could not remove it: a file in it made immutable) is tried
    again by the live daemon (`RemovalRetries`, `[workspace] tree_retry_s`); the failure
    lifted, the tree goes and is recorded `removed` with no restart (`host.status` →
    `worktreeRemovals` names it meanwhile). Before, it stayed `removing`, on disk, until the
    next start. No Session may start in it meanwhile, nor where it was once removed: 409
    `workspace_worktree_deleted` (before, one was created there and the worktree law broke)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ntree_retry_s = 0.2\n")
    d = DaemonProcess(home).start()
    try:
        repo = make_repo(tmp_path / "project")
        c = d.client(timeout=60)
        child, where = fork_child(c, repo)
        tree = Path(where["path"])
        pinned = tree / "src" / "app.py"
        undo = make_unremovable(pinned)
        try:
            done = delete(c, child, worktree="remove")
            assert done["worktree"]["state"] == "removing", done
            # Retried while git still cannot remove it: still there, still `removing`.
            assert wait_for(lambda: "is still not removable" in d.tail_log(100_000), 30)
            assert pinned.is_file() and tree_state(d, child) == "removing"
            removals = c.call("host.status")["worktreeRemovals"]
            assert (removals["pending"], removals["paths"]) == (1, [str(tree)]), removals
            (why,) = removals["trees"]
            assert (why["path"], why["reason"]) == (str(tree), "git_failed"), why
            assert "app.py" in why["error"], why
            refused_in(c, where["cwd"], tree, "removing")
        finally:
            undo()
        # No restart: the next retry removes it and records it.
        assert wait_for(lambda: tree_state(d, child) == "removed", 60)
        assert not tree.exists() and where["branch"] not in branches(repo)
        assert wait_for(lambda: removal_counts(c) == (0, 1), 10), removal_counts(c)
        refused_in(c, str(tree), tree, "removed")
        assert_invariants(home)
    finally:
        d.stop()


def refused_in(c: Client, cwd: str, tree: Path, state: str) -> None:
    """`session.create` in `cwd`, within the deleted child's `tree` (`state`): refused, no
    Session made."""
    before = len(c.call("session.list", {"workspaceId": WS})["sessions"])
    with pytest.raises(ApiError) as refused:
        create_session(c, title="in the tree", cwd=cwd)
    error = refused.value
    assert (error.status, error.reason) == (409, "workspace_worktree_deleted"), error
    assert (error.params["path"], error.params["state"]) == (str(tree), state), error.params
    assert len(c.call("session.list", {"workspaceId": WS})["sessions"]) == before


def test_the_live_retry_never_removes_a_tree_a_session_works_in(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """`RemovalRetries` with a tree left `removing` that a Session works in (one started there
    while the tree was kept, the tree then marked `removing` as a kill mid-delete leaves it):
    each round keeps it, `removing`; once that Session is deleted the next round removes it
    and records it `removed`."""
    users: list[str] = []

    def start_one(c: Client, cwd: str) -> None:
        users.append(create_session(c, title="in the tree", cwd=cwd)["agentSessionId"])

    repo, child, where = left_removing(daemon, tmp_path, start_one)
    store = Store.open(daemon.home / "store.sqlite3")
    shadow = ShadowStore(daemon.home / "checkpoints")
    retries = RemovalRetries(store, Worktrees(shadow), shadow, DirectoryLocks(), first_s=0.05)
    try:
        assert retries.retry_left() == 1
        assert wait_for(lambda: retries.rounds >= 2, 30)
        assert Path(where["path"]).is_dir() and tree_state(daemon, child) == "removing"
        assert retries.status()["trees"] == [
            {"path": where["path"], "reason": "in_use", "inUseBy": users}
        ]
        store.sessions.delete_session(WS, users[0])
        retries.retry_left()
        assert wait_for(lambda: tree_state(daemon, child) == "removed", 30)
        assert not Path(where["path"]).exists() and where["branch"] not in branches(repo)
        assert (retries.status()["pending"], retries.removed) == (0, 1)
    finally:
        retries.close()
        store.close()


def symlinked_trees_home(tmp_path: Path) -> tuple[Path, Path]:
    """A home whose `[workspace] worktrees_dir` is a symlink (a person's `~/trees` pointing at
    another disk), retried fast; the home and the directory the link points at."""
    real = tmp_path / "trees-real"
    real.mkdir()
    link = tmp_path / "trees"
    link.symlink_to(real, target_is_directory=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(
        f'[workspace]\ntree_retry_s = 0.2\nworktrees_dir = "{link}"\n'
    )
    return home, real


def test_a_tree_under_a_symlinked_worktrees_dir_is_kept_for_a_session_in_its_real_path(
    tmp_path: Path,
) -> None:
    """`worktrees_dir` a symlink: a Session started in a fork's tree by its real path (what
    `agenthost new --cwd` sends: it resolves the folder) works in that tree, so removing the
    child's tree keeps it (`inUseBy`). Before, the tree was recorded under the link's path,
    the Session's cwd did not start with it, and the delete removed the folder under it."""
    home, real = symlinked_trees_home(tmp_path)
    d = DaemonProcess(home).start()
    try:
        repo = make_repo(tmp_path / "project")
        c = d.client(timeout=60)
        child, where = fork_child(c, repo)
        assert Path(where["cwd"]).resolve().is_relative_to(real), where
        other = create_session(c, title="by its real path", cwd=str(Path(where["cwd"]).resolve()))
        done = delete(c, child, worktree="remove")
        assert done["worktree"]["state"] == "kept", done
        assert done["worktree"]["inUseBy"] == [other["agentSessionId"]], done
        assert Path(where["cwd"]).is_dir()
        run_turn(c, other["agentSessionId"], "/write still.txt here")
        assert_invariants(home)
    finally:
        d.stop()
    # The law the checker keeps, whatever spelling the tree was recorded by: the tree recorded
    # under the link's path (as it was before) and removed while that Session works in it.
    with apsw.Connection(str(home / "store.sqlite3")) as conn:
        for op_id, raw in conn.execute(
            "SELECT operation_id, workspace_json FROM fork_operations"
            " WHERE workspace_mode = 'worktree'"
        ).fetchall():
            conn.execute(
                "UPDATE fork_operations SET workspace_state = 'removed', workspace_json = ?"
                " WHERE operation_id = ?",
                (raw.replace(str(real), str(tmp_path / "trees")), op_id),
            )
    report = check_invariants(home)
    assert any(
        v.law is Law.WORKTREE and f"{other['agentSessionId']} works in it" in v.detail
        for v in report.violations
    ), report.violations


def test_a_session_is_refused_in_a_removing_tree_by_its_real_path_or_a_link_to_it(
    tmp_path: Path,
) -> None:
    """`worktrees_dir` a symlink, a child's tree left `removing`: `session.create` in it is
    refused whether the cwd is the tree's real path (what the CLI sends), a symlink to the
    tree, or a path with `..` in it. Before, only the recorded spelling was refused: a Session
    started by any other, and the live retry then removed the tree under it."""
    home, _ = symlinked_trees_home(tmp_path)
    d = DaemonProcess(home).start()
    try:
        repo = make_repo(tmp_path / "project")
        c = d.client(timeout=60)
        child, where = fork_child(c, repo)
        tree = Path(where["path"])
        link = tmp_path / "to-the-tree"
        link.symlink_to(tree, target_is_directory=True)
        undo = make_unremovable(tree / "src" / "app.py")
        try:
            done = delete(c, child, worktree="remove")
            assert done["worktree"]["state"] == "removing", done
            for cwd in (tree.resolve(), link, tree / "src" / ".."):
                refused_in(c, str(cwd), tree, "removing")
        finally:
            undo()
        assert wait_for(lambda: tree_state(d, child) == "removed", 60)
        refused_in(c, str(link / "src"), tree, "removed")
        assert_invariants(home)
    finally:
        d.stop()


def test_a_removing_tree_whose_repository_is_gone_is_removed_not_retried_forever(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A tree left `removing` whose repository a person deleted meanwhile (the project folder
    removed by hand; the tree, beside it, stays with its `.git` file naming the gone
    repository): the start removes what is left and records it `removed`. Before, every git
    of the removal ran in the gone repository ("cannot run git"), so the start kept it
    `removing` and the live retry tried it every 10 minutes for ever."""
    repo, child, where = left_removing(daemon, tmp_path)
    shutil.rmtree(repo)
    daemon.start()
    assert tree_state(daemon, child) == "removed", daemon.tail_log(20_000)
    assert not Path(where["path"]).exists()
    c = daemon.client(timeout=60)
    assert c.call("host.status")["worktreeRemovals"]["pending"] == 0
    assert_invariants(daemon.home)


def test_new_trees_to_retry_do_not_hold_back_the_round_already_due(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """`RemovalRetries` told of trees again and again, each time sooner than its first wait
    (deletes whose removal fails, one after another): the round due for the trees it has
    still comes. Before, each `retry` started the wait again from the beginning, so while they
    kept coming no tree was ever tried (this loop's 200 calls made no round)."""
    repo, child, where = left_removing(daemon, tmp_path)
    store = Store.open(daemon.home / "store.sqlite3")
    shadow = ShadowStore(daemon.home / "checkpoints")
    retries = RemovalRetries(store, Worktrees(shadow), shadow, DirectoryLocks(), first_s=0.5)
    try:
        for _ in range(200):
            if retries.rounds:
                break
            retries.retry_left()
            time.sleep(0.05)
        assert retries.rounds >= 1
        assert wait_for(lambda: tree_state(daemon, child) == "removed", 30)
        assert not Path(where["path"]).exists() and where["branch"] not in branches(repo)
    finally:
        retries.close()
        store.close()


def test_a_session_started_in_the_tree_during_the_removing_delete_keeps_the_tree(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A `remove` delete reads who works in the tree, then captures it (a git over the whole
    tree: seconds on a big one), then deletes the Session and marks the tree `removing`. A
    Session a person started in the tree meanwhile (`session.create` still allowed: the tree
    was `made`) is seen by the deleting transaction itself: the tree stays `made`, kept, and
    that Session is named. Before, the transaction marked it `removing` regardless and the
    delete removed the folder under the new Session (the worktree law broken)."""
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    daemon.stop()
    store = Store.open(daemon.home / "store.sqlite3")
    try:
        made = store.fork_workspace.session_worktree(WS, child)
        assert made is not None
        late = str(uuid.uuid4())
        store.sessions.create_session(
            WS,
            session_id=late,
            provider="tutti-agent",
            title="started during the delete",
            cwd=where["cwd"],
            settings={},
        )
        users = store.sessions.delete_session(WS, child, removing_tree=made.operation_id)
        assert tree_state(daemon, child) == "made"
        assert users == [late]
    finally:
        store.close()
    assert_invariants(daemon.home)


def test_a_session_in_the_tree_by_another_spelling_keeps_it(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Sessions an API client started in a fork's tree by spellings other than its recorded
    real path — a symlink to the tree, a doubled slash before it, `..` through a sibling —
    and a shared-workspace fork of the one by the symlink (its cwd the same spelling) all work
    in the tree: removing the child's tree keeps it and names them. Before, the delete compared
    the cwds as given with the tree's real path, saw none of them, and removed the folder under
    all four (state 'removed')."""
    repo = make_repo(tmp_path / "project")
    c = daemon.client(timeout=60)
    child, where = fork_child(c, repo)
    tree = Path(where["path"])
    link = tmp_path / "to-the-tree"
    link.symlink_to(tree, target_is_directory=True)
    spellings = [
        str(link),
        str(tree.parent) + "//" + tree.name,
        str(repo / ".." / tree.parent.name / tree.name / "src"),
    ]
    users = [create_session(c, title="elsewhere", cwd=s)["agentSessionId"] for s in spellings]
    for sid, cwd in zip(users, spellings, strict=True):
        got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert got["cwd"] == cwd  # stored as given: only the compare resolves it
    turn = run_turn(c, users[0], "/write linked.txt through the link")
    shared = c.call(
        "fork.create",
        {
            "workspaceId": WS,
            "agentSessionId": users[0],
            "requestId": str(uuid.uuid4()),
            "targetAgentSessionId": str(uuid.uuid4()),
            "point": {"type": "throughTurn", "turnId": turn["turnId"]},
        },
    )["operation"]
    assert shared["status"] == "committed", shared
    fork = str(shared["targetAgentSessionId"])
    assert c.call("session.get", {"workspaceId": WS, "agentSessionId": fork})["session"][
        "cwd"
    ] == str(link)
    delete(c, users[0])  # the fork's source gone: the fork is found by its own row

    done = delete(c, child, worktree="remove", force=True)
    assert done["worktree"]["state"] == "kept", done
    assert sorted(done["worktree"]["inUseBy"]) == sorted([*users[1:], fork]), done
    assert tree.is_dir() and tree_state(daemon, child) == "made"
    assert run_turn(c, fork, "/write still.txt here")["outcome"] == "completed"
    assert (tree / "still.txt").is_file()
    assert_invariants(daemon.home)

    # The law the checker keeps, by real path too: the tree recorded removed and gone while
    # these Sessions work in it by their spellings is reported for each of them.
    daemon.stop()
    shutil.rmtree(tree)
    with apsw.Connection(str(daemon.home / "store.sqlite3")) as conn:
        conn.execute(
            "UPDATE fork_operations SET workspace_state = 'removed'"
            " WHERE workspace_mode = 'worktree'"
        )
    report = check_invariants(daemon.home)
    for user in [*users[1:], fork]:
        assert any(
            v.law is Law.WORKTREE and f"{user} works in it" in v.detail for v in report.violations
        ), (user, report.violations)


def test_a_tree_kept_for_a_session_is_removed_once_that_session_is_deleted(
    tmp_path: Path,
) -> None:
    """A tree left `removing` that a Session works in is kept, in use (`host.status` says so
    and names it); deleting that Session has the live daemon try the tree at once, not at
    its next doubling wait (here `tree_retry_s` = 1 hour: before, no round came)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ntree_retry_s = 3600\n")
    d = DaemonProcess(home).start()
    users: list[str] = []

    def start_one(c: Client, cwd: str) -> None:
        users.append(create_session(c, title="in the tree", cwd=cwd)["agentSessionId"])

    try:
        repo, child, where = left_removing(d, tmp_path, start_one)
        d.start()
        c = d.client(timeout=60)
        removals = c.call("host.status")["worktreeRemovals"]
        assert removals["trees"] == [
            {"path": where["path"], "reason": "in_use", "inUseBy": users}
        ], removals
        delete(c, users[0])
        assert wait_for(lambda: tree_state(d, child) == "removed", 30), d.tail_log(5000)
        assert not Path(where["path"]).exists() and where["branch"] not in branches(repo)
        # One round (the one `user_gone` asked for), counted after its removal is.
        assert wait_for(lambda: removal_counts(c) == (0, 1), 10), removal_counts(c)
        assert wait_for(lambda: c.call("host.status")["worktreeRemovals"]["rounds"] == 1, 10)
        time.sleep(0.3)  # and no second round after it
        assert c.call("host.status")["worktreeRemovals"]["rounds"] == 1
        assert_invariants(home)
    finally:
        d.stop()
