"""A failed `worktree` fork's tree git cannot remove (a file in it made immutable), through the
real daemon, its worker, a real git repository and tutti-agent: the live daemon tries it again
(`RemovalRetries`, `[workspace] tree_retry_s`) as it does a deleted child's tree, listed in
`host.status` → `worktreeRemovals` meanwhile (`git_failed`, git's error); a Session started in
the tree keeps it (`in_use`) until that Session is deleted; then the tree, its registration
and its branch go and the operation is recorded `removed`, with no restart. Before, such a tree
waited for the next start (and the worktree law reported it kept)."""

from __future__ import annotations

import uuid
from pathlib import Path

import apsw
import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, wait_for
from tests.support.invariants import assert_invariants
from tests.support.worktree_forks import (
    removal_counts,
    source_in,
    trees_beside,
    worktree_fork_params,
)
from tests.support.worktree_repos import git, make_repo, make_unremovable

pytestmark = pytest.mark.timeout(120)


def fork_state(d: DaemonProcess, op_id: str) -> tuple[str, str]:
    """The operation's status and `workspace_state`, read beside the daemon (WAL)."""
    conn = apsw.Connection(str(d.home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute(
            "SELECT status, workspace_state FROM fork_operations WHERE operation_id = ?",
            (op_id,),
        ).fetchone()
    finally:
        conn.close()
    return str(row[0]), str(row[1])


def test_a_failed_forks_tree_git_cannot_remove_is_retried_live_and_kept_while_in_use(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ntree_retry_s = 0.2\n")
    d = DaemonProcess(home).start()
    try:
        repo = make_repo(tmp_path / "project")
        c = d.client(timeout=60)
        sid, turn = source_in(c, repo)
        # The tree whole at its path for a while, then the fork fails before its dispatch.
        c.call(
            "debug.failpoints",
            {
                "points": {
                    "host.workspace.after_rename": "once:sleep:3000",
                    "host.workspace.after_record": "once:error",
                }
            },
        )
        params = worktree_fork_params(
            sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
        )
        reply = c.submit("fork.create", params)

        def whole() -> Path | None:
            tops = [p for p in trees_beside(repo) if not p.name.startswith(".partial-")]
            return tops[0] if tops and (tops[0] / "src" / "app.py").is_file() else None

        assert wait_for(lambda: whole() is not None, 30)
        tree = whole()
        assert tree is not None
        undo = make_unremovable(tree / "src" / "app.py")
        try:
            reply.result(60)  # answered at once (202) or once failed
            op_id = _op_id(d, params["requestId"])
            assert wait_for(lambda: fork_state(d, op_id)[0] == "failed", 30)
            # Retried while git still cannot remove it: still there, listed, not `removed`.
            assert wait_for(lambda: "is still not removable" in d.tail_log(100_000), 30)
            assert tree.is_dir() and fork_state(d, op_id) == ("failed", "made")
            removals = c.call("host.status")["worktreeRemovals"]
            assert removals["paths"] == [str(tree)], removals
            (why,) = removals["trees"]
            assert why["reason"] == "git_failed" and "app.py" in why["error"], why
            # A person starts a Session in it meanwhile (nothing refuses a failed fork's tree).
            user = create_session(c, title="in the tree", cwd=str(tree / "src"))["agentSessionId"]
        finally:
            undo()

        def reason() -> str:
            trees = c.call("host.status")["worktreeRemovals"]["trees"]
            return str(trees[0]["reason"]) if trees else ""

        # Removable now, but someone works in it: kept, and said so.
        assert wait_for(lambda: reason() == "in_use", 30)
        assert tree.is_dir() and fork_state(d, op_id) == ("failed", "made")
        (why,) = c.call("host.status")["worktreeRemovals"]["trees"]
        assert why["inUseBy"] == [user], why
        # That Session deleted: the tree, its registration and its branch go, recorded.
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": user})
        assert wait_for(lambda: fork_state(d, op_id) == ("failed", "removed"), 60)
        assert not tree.exists()
        assert tree.name not in git(repo, "worktree", "list")
        assert not [b for b in git(repo, "branch", "--list").split() if tree.name in b]
        assert wait_for(lambda: removal_counts(c) == (0, 1), 10), removal_counts(c)
        assert_invariants(home)
    finally:
        d.stop()


def _op_id(d: DaemonProcess, request_id: str) -> str:
    conn = apsw.Connection(str(d.home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute(
            "SELECT operation_id FROM fork_operations WHERE request_id = ?", (request_id,)
        ).fetchone()
    finally:
        conn.close()
    assert row is not None
    return str(row[0])


def test_a_failed_forks_half_made_tree_git_cannot_remove_is_retried_live(tmp_path: Path) -> None:
    """The half-made case: the tree made under `.partial-<short>/` (its `worktree add` done),
    its directory then made immutable, so its rename to the tree's path fails (the fork fails
    before dispatch) and git cannot remove it either. The live daemon retries it, listed in
    `worktreeRemovals` under the tree's path; once the flag is cleared the next round removes
    the half-made tree, its registration in the repository and its branch, and records it
    `removed`, with no restart."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ntree_retry_s = 0.2\n")
    d = DaemonProcess(home).start()
    try:
        repo = make_repo(tmp_path / "project")
        c = d.client(timeout=60)
        sid, turn = source_in(c, repo)
        c.call(
            "debug.failpoints", {"points": {"host.workspace.after_materialize": "once:sleep:3000"}}
        )
        params = worktree_fork_params(
            sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
        )
        reply = c.submit("fork.create", params)

        def half_made() -> Path | None:
            partials = [p for p in trees_beside(repo) if p.name.startswith(".partial-")]
            if not partials:
                return None
            work = partials[0] / partials[0].name[len(".partial-") :]
            return work if (work / "src" / "app.py").is_file() else None

        assert wait_for(lambda: half_made() is not None, 30)
        work = half_made()
        assert work is not None
        undo = make_unremovable(work)
        try:
            reply.result(60)
            op_id = _op_id(d, params["requestId"])
            assert wait_for(lambda: fork_state(d, op_id)[0] == "failed", 30)
            assert wait_for(lambda: "is still not removable" in d.tail_log(100_000), 30)
            assert work.is_dir() and fork_state(d, op_id)[1] in ("planned", "made")
            (why,) = c.call("host.status")["worktreeRemovals"]["trees"]
            tree = work.parent.parent / work.name  # the tree's own path, never made
            assert (why["path"], why["reason"]) == (str(tree), "git_failed"), why
        finally:
            undo()
        assert wait_for(lambda: fork_state(d, op_id)[1] == "removed", 60)
        assert not work.parent.exists() and not tree.exists()
        assert work.name not in git(repo, "worktree", "list")
        assert not [b for b in git(repo, "branch", "--list").split() if work.name in b]
        assert wait_for(lambda: removal_counts(c) == (0, 1), 10), removal_counts(c)
        assert_invariants(home)
    finally:
        d.stop()
