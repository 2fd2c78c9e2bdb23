"""A `workspace.restore` whose git stalled (a slow disk) and was killed at the bound answers
`workspace_unavailable` `timed_out` and leaves no lock file in the folder's shadow repository:
the lock its killed `read-tree` held goes before the folder's lock does, not at the daemon's
next start; the folder's next restore and its next Turn's checkpoints work from the same
daemon. The real daemon, real git behind a PATH wrapper that stalls one `read-tree` holding
the lock of the restore's own index. And a daemon SIGKILLed while its restore's
`checkout-index` stalls (a file already removed) leaves the restore's undo kept by its ref:
the next daemon puts the folder back from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import WS, create_session, run_turn, wait_for
from tests.support.stalling_git_home import stalling_git_home
from tests.workspace.stalling_git import running
from transport.client import ApiError
from workspace.shadow import ShadowStore

pytestmark = pytest.mark.timeout(120)


def _locks(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*.lock"))


def test_a_restore_whose_git_was_killed_leaves_no_lock_and_the_folder_works_on(
    tmp_path: Path,
) -> None:
    with stalling_git_home(tmp_path, "read-tree", timeout_s=2.0) as at:
        folder, stall = at.folder, at.stall
        repo = ShadowStore(at.home / "checkpoints").repo_dir(folder)
        client = at.daemon.client()
        sid = create_session(client, cwd=str(folder))["agentSessionId"]
        turn = run_turn(client, sid, "hello")
        assert turn["workspace"]["before"] and turn["workspace"]["after"], turn
        (folder / "a.txt").write_text("a, changed\n")
        params = {"workspaceId": WS, "agentSessionId": sid, "turnId": turn["turnId"]}

        stall.arm()
        with pytest.raises(ApiError) as info:
            client.call("workspace.restore", params | {"which": "before"})
        assert stall.taken()
        assert (info.value.reason, info.value.params.get("workspaceReason")) == (
            "workspace_unavailable",
            "timed_out",
        ), info.value
        # It failed once its undo was kept: the answer names it, the ref keeps it.
        undo = info.value.params.get("undo") or {}
        assert undo.get("tree") in _undo_refs(repo, sid).values(), (undo, info.value)
        assert not [p for p in stall.pids() if running(p)], "the stalled git outlived its bound"
        # The killed git's lock (its restore index's) went with the restore, not at a restart.
        assert _locks(repo) == []
        assert (folder / "a.txt").read_text() == "a, changed\n"

        done = client.call("workspace.restore", params | {"which": "before"})
        assert done["restored"] == turn["workspace"]["before"]
        assert (folder / "a.txt").read_text() == "a\n"
        back = client.call(
            "workspace.restore", {"workspaceId": WS, "agentSessionId": sid, "tree": undo["tree"]}
        )  # the failed restore's undo: the files as they were before it
        assert back["restored"] == undo["tree"]
        assert (folder / "a.txt").read_text() == "a, changed\n"
        client.call("workspace.restore", params | {"which": "before"})
        (folder / "b.txt").write_text("b\n")
        nxt = run_turn(client, sid, "again")
        assert nxt["workspace"].get("before") and nxt["workspace"].get("after"), nxt


def _undo_refs(repo: Path, sid: str) -> dict[str, str]:
    """The `restore-*/before` refs of `sid` in the shadow repository `repo` → their trees."""
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(objectname) %(refname)", f"refs/agenthost/{sid}/"],
        env={"GIT_DIR": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    refs = dict(reversed(line.split(" ", 1)) for line in out.splitlines())
    return {r: t for r, t in refs.items() if r.split("/")[-2].startswith("restore-")}


def test_a_restore_killed_while_it_writes_the_files_keeps_its_undo_which_puts_them_back(
    tmp_path: Path,
) -> None:
    # The daemon is SIGKILLed while the restore's `checkout-index` stalls: the file it
    # replaces is already unlinked. The undo (the folder as it was) is kept by its ref all
    # the same, so the restarted daemon's `workspace.restore {tree}` brings the file back.
    with stalling_git_home(tmp_path, "checkout-index", timeout_s=30.0) as at:
        folder, stall = at.folder, at.stall
        repo = ShadowStore(at.home / "checkpoints").repo_dir(folder)
        client = at.daemon.client()
        sid = create_session(client, cwd=str(folder))["agentSessionId"]
        turn = run_turn(client, sid, "hello")
        (folder / "a.txt").write_text("a, changed\n")
        params = {"workspaceId": WS, "agentSessionId": sid}

        stall.arm()
        client.submit("workspace.restore", params | {"turnId": turn["turnId"], "which": "before"})
        wait_for(stall.taken, timeout=30)
        at.daemon.kill()
        assert not (folder / "a.txt").exists()  # the restore was midway

        undo = _undo_refs(repo, sid)
        assert len(undo) == 1, undo
        at.daemon.start()
        client = at.daemon.client()
        done = client.call("workspace.restore", params | {"tree": next(iter(undo.values()))})
        assert done["restored"] == next(iter(undo.values()))
        assert (folder / "a.txt").read_text() == "a, changed\n"
