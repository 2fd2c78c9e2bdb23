"""Sessions sharing one folder share its captures (`TurnCheckpoints.capture`): one capture of
the folder answers every ask queued before it began, each kept under its own Turn's ref with
its own changed files; an ask made while a capture runs is never answered by that capture
(it may predate the ask's files), but by the next one. Real folders, real git, a real shadow
store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.checkpoints import Capture, TurnCheckpoints
from tests.workspace.test_capture_cost import GitLog, git_log, repo
from workspace.shadow import Checkpoint, ShadowStore

pytestmark = pytest.mark.timeout(60)

__all__ = ["git_log", "repo"]  # the fixtures, used by name


@pytest.fixture
def turns(tmp_path: Path) -> Iterator[TurnCheckpoints]:
    t = TurnCheckpoints(ShadowStore(tmp_path / "home" / "checkpoints"))
    try:
        yield t
    finally:
        t.pool.shutdown(wait=True)


def tree_of(capture: Capture) -> str:
    assert isinstance(capture.checkpoint, Checkpoint), capture
    return capture.checkpoint.tree


def ref(turns: TurnCheckpoints, repo: Path, session: str, turn: str, which: str) -> Path:
    return turns.shadow.repo_dir(repo) / "refs" / "agenthost" / session / turn / which


def test_one_capture_answers_every_session_queued_on_a_busy_folder_each_under_its_own_ref(
    turns: TurnCheckpoints, repo: Path, git_log: GitLog
) -> None:
    old = tree_of(turns.capture(str(repo), "s0", "t0", "before").result(30))
    (repo / "a.txt").write_text("alpha, changed\n")
    git_log.clear()
    with turns.locks(str(repo)):  # another job of the folder runs: the asks queue
        asks = [
            turns.capture(str(repo), "s1", "t1", "before"),
            turns.capture(str(repo), "s2", "t2", "before"),
            turns.capture(str(repo), "s3", "t3", "after", old),
        ]
        time.sleep(0.2)
        assert not any(a.done() for a in asks)
    got = [a.result(30) for a in asks]
    trees = {tree_of(g) for g in got}
    assert len(trees) == 1 and old not in trees
    tree = trees.pop()
    assert git_log.commands().count("ls-files") == 1  # one capture for the three
    assert got[0].changed == () and got[1].changed == ()
    assert got[2].changed == ({"path": "a.txt", "kind": "modified"},)
    for session, turn, which in (
        ("s1", "t1", "before"),
        ("s2", "t2", "before"),
        ("s3", "t3", "after"),
    ):
        assert ref(turns, repo, session, turn, which).read_text() == tree + "\n"
    # Each `before` reserved its own Turn's `after` lock.
    for session, turn in (("s1", "t1"), ("s2", "t2")):
        assert ref(turns, repo, session, turn, "after.lock").exists()


def test_an_ask_made_while_a_capture_runs_is_answered_by_the_next_capture(
    turns: TurnCheckpoints, repo: Path
) -> None:
    """The first capture has read the folder when the file changes and two more Sessions
    ask: the capture running cannot hold that change, so it answers only the ask it began
    for; one capture after it answers both later asks, with the change."""
    real_capture = turns.shadow.capture
    read = threading.Event()
    go = threading.Event()
    calls: list[str] = []

    def held_after_reading(cwd: Path, real: str | None = None) -> Checkpoint | object:
        got = real_capture(cwd, real)
        calls.append(str(cwd))
        if len(calls) == 1:
            read.set()
            go.wait(10)
        return got

    turns.shadow.capture = held_after_reading  # type: ignore[assignment,method-assign]
    first = turns.capture(str(repo), "s1", "t1", "before")
    assert read.wait(10)
    (repo / "a.txt").write_text("alpha, changed while the first capture ran\n")
    later = [
        turns.capture(str(repo), "s2", "t2", "before"),
        turns.capture(str(repo), "s3", "t3", "before"),
    ]
    time.sleep(0.2)
    go.set()
    old = tree_of(first.result(30))
    new = {tree_of(f.result(30)) for f in later}
    assert len(new) == 1 and old not in new
    assert len(calls) == 2
    changes = turns.shadow.changed_files(repo, old, new.pop())
    assert [(c.path, c.kind.value) for c in changes] == [("a.txt", "modified")]
