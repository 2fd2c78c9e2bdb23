"""A daemon SIGKILLed while a checkpoint's git stalls (a slow disk) holding the shadow index's
lock: that git runs in a session of its own, so it lives on, lock held, still able to write.
The next daemon on the home kills it (and what it started) before it works on any folder; only
then are the lock files removed, and the folder's next Turn records both checkpoints, its
`after` naming the folder's tree. The real daemon, real git behind a PATH wrapper that stalls
one `git add` with a child of its own. And a left git that outlives its kill at start (kept
alive by a cgroup-v1 freezer: a SIGKILL to a frozen process lands only once it is thawed, as
one in the kernel on a stalled disk): its lock files stay while it lives, `host.status` names
it, and once it is gone they are removed and the folder's checkpoints resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, create_session, run_turn, submit, wait_for
from tests.support.freezer import freeze, freezer_group, thaw
from tests.support.stalling_git_home import StallingGitHome, stalling_git_home
from tests.workspace.stalling_git import path_with, running
from workspace.git import gits_of
from workspace.shadow import Checkpoint, ShadowStore

pytestmark = pytest.mark.timeout(120)


def _kill_the_daemon_while_a_git_stalls(at: StallingGitHome) -> tuple[str, list[int]]:
    """A Session of the folder with one Turn recorded, then a Turn whose `git add` stalls (and
    its child): the daemon SIGKILLed under it. Returns the Session and the stalled pids."""
    folder, stall = at.folder, at.stall
    client = at.daemon.client()
    sid = create_session(client, cwd=str(folder))["agentSessionId"]
    assert run_turn(client, sid, "hello")["workspace"]["after"]

    (folder / "a.txt").write_text("a, changed\n")
    stall.arm()
    submit(client, sid, "stalled")
    wait_for(lambda: len(stall.pids()) == 2, 30)
    at.daemon.kill()
    return sid, stall.pids()


def test_a_restarted_daemon_kills_the_git_its_killed_predecessor_left_before_any_capture(
    tmp_path: Path,
) -> None:
    # A bound far past the test: only the restart can end the stalled git.
    with stalling_git_home(tmp_path, "add", timeout_s=300.0) as at:
        folder, stall = at.folder, at.stall
        shadow_home = at.home / "checkpoints"
        sid, stalled = _kill_the_daemon_while_a_git_stalls(at)
        # What the killed daemon left: its git and the git's child, still running.
        assert all(running(pid) for pid in stalled), stalled
        assert set(stalled) <= set(gits_of(shadow_home))
        locks = list(shadow_home.glob("*/index.lock"))
        assert locks, "the stalled git holds the shadow index's lock"

        again = DaemonProcess(at.home, env={"PATH": path_with(stall.bin)}).start()
        try:
            assert not [pid for pid in stalled if running(pid)], "a left git outlived the start"
            assert gits_of(shadow_home) == []
            client = again.client()
            (folder / "b.txt").write_text("b\n")
            nxt = run_turn(client, sid, "after the restart")
            ws = nxt["workspace"]
            assert ws.get("before") and ws.get("after"), ws
            fresh = ShadowStore(tmp_path / "fresh" / "checkpoints").capture(folder)
            assert isinstance(fresh, Checkpoint) and ws["after"] == fresh.tree
            assert not [lock for lock in locks if lock.exists()]
        finally:
            again.stop()


def test_a_left_git_that_outlives_its_kill_at_start_keeps_its_lock_files_until_it_is_gone(
    tmp_path: Path,
) -> None:
    with stalling_git_home(tmp_path, "add", timeout_s=300.0) as at, freezer_group() as group:
        folder, stall = at.folder, at.stall
        shadow_home = at.home / "checkpoints"
        sid, stalled = _kill_the_daemon_while_a_git_stalls(at)
        (lock,) = shadow_home.glob("*/index.lock")
        freeze(group, stalled)  # the start's SIGKILL lands only once thawed
        # The start waits this long for the killed gits, then goes on.
        (at.home / "agenthost.toml").write_text(
            "[workspace]\ntimeout_s = 300\nlong_timeout_s = 0.5\n"
        )
        again = DaemonProcess(at.home, env={"PATH": path_with(stall.bin)}).start()
        try:
            assert all(running(pid) for pid in stalled), stalled
            client = again.client()
            left = client.call("host.status")["leftGits"]
            assert left["alive"] == 2 and sorted(left["pids"]) == sorted(stalled), left
            assert left["repositories"] == [str(lock.parent)], left
            # Its lock file is its own while it lives: kept, the folder's checkpoint refused.
            ws = run_turn(client, sid, "while it lives")["workspace"]
            assert not ws.get("after"), ws
            assert lock.exists(), "a living left git's lock file was removed"

            thaw(group)  # the SIGKILL lands
            wait_for(lambda: client.call("host.status")["leftGits"]["alive"] == 0, 30)
            assert not [pid for pid in stalled if running(pid)]
            (folder / "b.txt").write_text("b\n")
            ws = run_turn(client, sid, "once it is gone")["workspace"]
            assert ws.get("before") and ws.get("after"), ws
            fresh = ShadowStore(tmp_path / "fresh" / "checkpoints").capture(folder)
            assert isinstance(fresh, Checkpoint) and ws["after"] == fresh.tree
            assert not lock.exists()
        finally:
            again.stop()
