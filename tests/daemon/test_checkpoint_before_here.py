"""A Turn's `before` taken on the Session actor's thread ahead of its claim when its folder is
unchanged and the Session's ref of its tree is there (`TurnCheckpoints.capture_before_here`):
no checkpoint-pool job on a quiet Turn (a thread woken beside the claim's COMMIT), the same
record and ref; a folder changed between two Turns is captured by git on the pool, the change
in the next Turn's `before`.

An in-process daemon (real store, worker and tutti-agent app-server); the home's
`TurnCheckpoints._run` (the pool's capture job) is wrapped to count its jobs."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import actors.checkpoints as checkpoints_module
from actors.checkpoints import Capture
from agenthost.daemon import Daemon
from tests.support.daemon import create_session, run_turn
from tests.support.git_repos import make_repo
from tests.support.in_process import in_process_daemon
from transport.client import Client
from workspace.shadow import ShadowStore

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, Client]]:
    # A loaded test host must not send the folder to the pool for a slow capture on the actor.
    monkeypatch.setattr(checkpoints_module, "HERE_BUDGET_S", 60.0)
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def test_a_quiet_turn_takes_no_pool_job_and_a_changed_folders_before_is_captured_by_git(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    daemon, c = running
    repo = make_repo(tmp_path / "repo")
    time.sleep(2.5)  # past the 2 s racy margin: the captures keep a stat snapshot
    checkpoints = daemon.ctx.turn_checkpoints
    assert checkpoints is not None
    jobs: list[str] = []
    run = checkpoints._run

    def counted(*args: Any) -> Capture:
        jobs.append(str(args[3]))
        return run(*args)

    checkpoints._run = counted  # type: ignore[method-assign]
    sid = create_session(c, cwd=str(repo))["agentSessionId"]
    first = run_turn(c, sid, "hello")
    assert jobs[:1] == ["before"], jobs  # no snapshot yet: git on the pool
    jobs.clear()
    quiet = [run_turn(c, sid, "again") for _ in range(3)]
    assert jobs == [], jobs  # both captures of every quiet Turn on the actor
    tree = first["workspace"]["after"]
    shadow = ShadowStore(tmp_path / "home" / "checkpoints")
    for t in quiet:
        ws = t["workspace"]
        assert ws["before"] == ws["after"] == tree and ws["changedFiles"] == [], ws
    assert shadow.refs(repo) == [f"{sid}/+{tree}"]

    (repo / "a.txt").write_text("one, changed between the Turns\n")
    changed = run_turn(c, sid, "and now?")
    assert jobs[:1] == ["before"], jobs
    ws = changed["workspace"]
    assert ws["before"] != tree and ws["changedFiles"] == [], ws
    text, _ = shadow.diff(repo, tree, ws["before"])
    assert "+one, changed between the Turns" in text
    assert f"{sid}/+{ws['before']}" in shadow.refs(repo)


def test_a_changed_folders_captures_resolve_it_once_each_on_the_actor(
    running: tuple[Daemon, Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture the actor's thread refuses (the folder changed) goes to the pool with the
    real path the refusal resolved: one `realpath` (an `lstat` a path component) a capture on
    the Session actor's thread, not one to ask here and another to queue the job."""
    daemon, c = running
    repo = make_repo(tmp_path / "repo")
    time.sleep(2.5)  # past the 2 s racy margin: the captures keep a stat snapshot
    sid = create_session(c, cwd=str(repo))["agentSessionId"]
    run_turn(c, sid, "hello")
    run_turn(c, sid, "again")  # both captures on the actor: the snapshot is warm
    calls: list[str] = []
    real = os.path.realpath

    def counted(path: Any, *args: Any, **kwargs: Any) -> str:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("actors.") and not threading.current_thread().name.startswith(
            "agenthost-checkpoint"
        ):
            calls.append(caller)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counted)
    (repo / "a.txt").write_text("one, changed between the Turns\n")
    changed = run_turn(c, sid, "and now?")
    assert changed["workspace"]["before"] is not None, changed["workspace"]
    # The `before` (refused here, then queued) and the `after` (here, the tree unchanged since
    # the `before`): one resolution each on the actor's thread.
    assert calls == ["actors.checkpoints", "actors.checkpoints"], calls
