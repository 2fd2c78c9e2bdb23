"""A Turn that stopped waiting for a capture (its bound fired: recorded `timed_out`) cancels
it: a capture still queued behind a busy folder never runs once the folder is free, so the
backlog of Turns that gave up never stands ahead of a fresh Turn's capture.

An in-process daemon (real store, worker and tutti-agent app-server); the folder is kept
busy by holding its real `FolderLock` from the test, and the home's `TurnCheckpoints._run`
(the pool's capture job) is wrapped to count the jobs that ran, by Turn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.checkpoints import Capture
from agenthost.daemon import Daemon
from tests.support.daemon import create_session, run_turn
from tests.support.git_repos import make_repo
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "agenthost.toml").write_text("[workspace]\ntimeout_s = 2.0\n")
    with in_process_daemon(home, timeout=30.0) as running:
        yield running


def test_captures_whose_turns_timed_out_are_skipped_once_the_folder_is_free(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    daemon, c = running
    repo = make_repo(tmp_path / "repo")
    checkpoints = daemon.ctx.turn_checkpoints
    assert checkpoints is not None
    sid = create_session(c, cwd=str(repo))["agentSessionId"]
    assert run_turn(c, sid, "hello")["workspace"]["after"]

    ran: list[str] = []
    run = checkpoints._run

    def counted(*args: Any) -> Capture:
        ran.append(str(args[2]))
        return run(*args)

    checkpoints._run = counted  # type: ignore[method-assign]
    gave_up: list[str] = []
    with checkpoints.locks(str(repo)):  # the folder busy (a stalled git's job would hold it)
        for i in range(2):
            (repo / "a.txt").write_text(f"changed {i}\n")
            turn = run_turn(c, sid, f"while busy {i}")
            ws = turn["workspace"]
            assert ws.get("state") == "unavailable" and ws["reason"] == "timed_out", ws
            gave_up.append(str(turn["turnId"]))
    (repo / "a.txt").write_text("changed once free\n")
    fresh = run_turn(c, sid, "once free")
    ws = fresh["workspace"]
    assert ws.get("before") and ws.get("after"), ws
    # The backlog was queued on the folder ahead of the fresh Turn's captures: had it run, it
    # ran before them.
    assert not set(gave_up) & set(ran), (gave_up, ran)
    assert set(ran) <= {str(fresh["turnId"])}, ran
