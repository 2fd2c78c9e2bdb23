"""A Turn's capture whose git stalled (a slow disk) and was killed at the bound is recorded
`timed_out` (the record's `beforeUnavailable`); the folder's later Turns get their checkpoints
again from the same daemon, with no restart: the lock file the killed git held is gone with
it. The real daemon, real git
behind a PATH wrapper that stalls one `git add` holding the shadow index's lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.daemon import create_session, run_turn
from tests.support.stalling_git_home import stalling_git_home
from workspace.shadow import Checkpoint, ShadowStore

pytestmark = pytest.mark.timeout(120)


def test_a_turn_after_one_whose_capture_git_was_killed_gets_its_checkpoints(
    tmp_path: Path,
) -> None:
    with stalling_git_home(tmp_path, "add", timeout_s=3.0) as at:
        folder, stall = at.folder, at.stall
        client = at.daemon.client()
        sid = create_session(client, cwd=str(folder))["agentSessionId"]
        first = run_turn(client, sid, "hello")
        assert first["workspace"]["after"], first["workspace"]

        (folder / "a.txt").write_text("a, changed\n")
        stall.arm()
        timed = run_turn(client, sid, "stalled")
        assert stall.taken()
        assert timed["outcome"] == "completed", timed
        assert timed["workspace"].get("before") is None, timed["workspace"]
        # The `after` is usable: the record keeps why there is no `before`.
        assert timed["workspace"]["after"], timed["workspace"]
        assert timed["workspace"]["beforeUnavailable"]["reason"] == "timed_out", timed

        (folder / "b.txt").write_text("b\n")
        nxt = run_turn(client, sid, "again")
        ws = nxt["workspace"]
        assert ws.get("before") and ws.get("after"), ws
        fresh = ShadowStore(tmp_path / "fresh" / "checkpoints").capture(folder)
        assert isinstance(fresh, Checkpoint) and ws["after"] == fresh.tree
        assert ws["cwd"] == os.path.realpath(folder)
