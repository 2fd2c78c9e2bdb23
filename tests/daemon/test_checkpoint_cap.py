"""The checkpoint store's size cap (`[workspace] max_store_bytes`, docs/design/workspace.md)
through the real daemon: over it, the gc sweep drops the oldest Turns' checkpoints, says so
on each Turn (`unavailable: dropped`), and a worktree fork or a diff through such a Turn is
refused in words."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    respond,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.git_repos import GIT_ENV, make_repo, pending_request
from tests.support.invariants import assert_invariants
from tests.support.worktree_forks import worktree_fork_params
from transport.client import ApiError
from workspace.shadow import ShadowStore, Unavailable


def _refs(home: Path, cwd: Path) -> list[str]:
    return subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)"],
        env={**GIT_ENV, "GIT_DIR": str(ShadowStore(home / "checkpoints").repo_dir(cwd))},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()


def _error(fn: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn()
    return info.value


def test_over_the_cap_a_sweep_drops_the_oldest_checkpoints_and_says_so_on_each_turn(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # One byte: no store is ever under it, so every settled Turn's checkpoint goes.
    (home / "agenthost.toml").write_text("[workspace]\nmax_store_bytes = 1\ngc_interval_s = 0.3\n")
    repo = make_repo(tmp_path / "repo")
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client(timeout=60)
        status = client.call("host.status")["checkpoints"]
        assert status["maxBytes"] == 1
        sid = create_session(client, cwd=str(repo))["agentSessionId"]
        first = run_turn(client, sid, "hello")["turnId"]
        (repo / "a.txt").write_text("changed by the second turn\n")
        second = run_turn(client, sid, "again")["turnId"]

        def dropped(turn_id: str) -> bool:
            return turn_of(client, sid, turn_id)["workspace"].get("reason") == "dropped"

        wait_for(lambda: dropped(first) and dropped(second), 30)
        record = turn_of(client, sid, first)["workspace"]
        assert record["state"] == "unavailable"
        assert "max_store_bytes" in record["message"]
        # The refs went after the record said so.
        wait_for(lambda: not any(f"/{sid}/" in r for r in _refs(home, repo)), 30)
        assert client.call("host.status")["checkpoints"]["droppedForCap"] >= 2

        # A worktree fork through a dropped Turn is refused before anything is made.
        params = worktree_fork_params(
            sid, first, request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
        )
        refused = _error(lambda: client.call("fork.create", params))
        assert (refused.status, refused.reason) == (409, "workspace_checkpoint_missing")
        assert refused.params == {"turnId": first, "workspaceReason": "dropped"}
        assert "max_store_bytes" in refused.message
        assert not (tmp_path / "repo.agenthost").exists()
        # The diff says why too.
        diff = _error(
            lambda: client.call(
                "session.workspaceDiff",
                {"workspaceId": WS, "agentSessionId": sid, "turnId": second},
            )
        )
        assert (diff.status, diff.reason) == (409, "workspace_checkpoint_missing")
        assert diff.params["workspaceReason"] == "dropped"
        assert "max_store_bytes" in diff.message
        # A shared fork through it needs no checkpoint, and forks as ever.
        shared = {**params, "requestId": str(uuid.uuid4()), "workspace": "shared"}
        assert client.call("fork.create", shared)["operation"]["status"] == "committed"
        assert_invariants(home)
    finally:
        daemon.stop()


def test_under_the_cap_no_checkpoint_is_dropped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(
        "[workspace]\nmax_store_bytes = 1000000000\ngc_interval_s = 0.3\n"
    )
    repo = make_repo(tmp_path / "repo")
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client(timeout=60)
        sid = create_session(client, cwd=str(repo))["agentSessionId"]
        turn = run_turn(client, sid, "hello")
        sweeps = client.call("host.status")["checkpoints"]["sweeps"]
        wait_for(lambda: client.call("host.status")["checkpoints"]["sweeps"] > sweeps + 1, 30)
        assert turn_of(client, sid, turn["turnId"])["workspace"] == turn["workspace"]
        assert f"refs/agenthost/{sid}/+{turn['workspace']['after']}" in _refs(home, repo)
        assert client.call("host.status")["checkpoints"]["droppedForCap"] == 0
    finally:
        daemon.stop()


def test_the_cap_leaves_the_tree_ref_a_running_turns_before_shares_with_a_dropped_turn(
    tmp_path: Path,
) -> None:
    """A Session's Turns share one ref a tree: dropping a settled Turn's checkpoint leaves the
    ref while a Turn still running names that tree (its record is not written yet: the ref is
    pinned in memory), and once that Turn settles its record's trees are kept.

    The store is put over the cap only once the running Turn's `before` is taken (a filler
    file in the checkpoint store: `size_bytes` counts it, `workdirs` skips it), so the cap
    meets the shared ref while it is pinned, whatever the host's load; and the captures are
    given a bound no load reaches (a `timed_out` `before` would name no tree)."""
    home = tmp_path / "home"
    home.mkdir()
    cap = 10_000_000
    (home / "agenthost.toml").write_text(
        f"[workspace]\nmax_store_bytes = {cap}\ngc_interval_s = 0.3\ntimeout_s = 120\n"
    )
    repo = make_repo(tmp_path / "repo")
    # The folder's tree as any shadow store captures it (a scratch one beside the daemon's).
    scratch = ShadowStore(tmp_path / "scratch").capture(repo)
    assert not isinstance(scratch, Unavailable), scratch
    tree = scratch.tree
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client(timeout=60)
        sid = create_session(client, cwd=str(repo))["agentSessionId"]
        first = run_turn(client, sid, "hello")
        assert first["workspace"].get("after") == tree, first["workspace"]
        running = submit(client, sid, "/ask go on?")["turnId"]
        # The model asks only once the Turn began, after its `before` capture answered.
        request_id = pending_request(client, sid, running)
        assert client.call("host.status")["checkpoints"]["droppedForCap"] == 0
        (home / "checkpoints" / ".over-the-cap").write_bytes(bytes(cap + 1))

        def dropped(turn_id: str) -> bool:
            return turn_of(client, sid, turn_id)["workspace"].get("reason") == "dropped"

        wait_for(lambda: dropped(first["turnId"]), 30)
        sweeps = client.call("host.status")["checkpoints"]["sweeps"]
        wait_for(lambda: client.call("host.status")["checkpoints"]["sweeps"] > sweeps + 1, 30)
        assert f"refs/agenthost/{sid}/+{tree}" in _refs(home, repo)

        respond(client, sid, running, request_id, {"text": "yes"})
        ws = settle(client, sid, running)["workspace"]
        assert ws.get("before") == tree or ws.get("reason") == "dropped", ws
        assert_invariants(home)
    finally:
        daemon.stop()
