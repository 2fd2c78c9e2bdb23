"""A Turn's `after` capture taken on the asking thread (`TurnCheckpoints.capture_after_here`):
only when it is certain and cheap — the directory's small stat snapshot unchanged and the tree
its `before`'s, no other job of the directory running, no failpoint armed at the capture — and
then the same answer and the same ref as the pool's capture (its `before`'s tree ref), with
no git process and no file written; otherwise None and nothing written."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import actors.checkpoints as checkpoints_module
from actors.checkpoints import Capture, TurnCheckpoints, commit_ref
from drivers.failpoints import Failpoints
from tests.support.worktree_repos import git
from tests.workspace.test_capture_cost import GitLog, age, aged_store, git_log, repo
from workspace.shadow import Checkpoint

pytestmark = pytest.mark.timeout(60)

__all__ = ["git_log", "repo"]  # the fixtures, used by name


@pytest.fixture
def turns(tmp_path: Path, repo: Path) -> Iterator[TurnCheckpoints]:
    """A home's checkpoints with `repo` aged and captured once on the pool (its snapshot)."""
    (repo / "sub").mkdir()
    (repo / "sub" / "c.txt").write_text("charlie\n")
    age()
    t = TurnCheckpoints(aged_store(tmp_path), failpoints=Failpoints())
    try:
        yield t
    finally:
        t.pool.shutdown(wait=True)


def before(turns: TurnCheckpoints, repo: Path, turn: str = "t1") -> str:
    """The Turn's `before`, on the pool as a Turn takes it (its tree's ref kept)."""
    got = turns.capture(str(repo), "s1", turn, "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    return got.checkpoint.tree


def refs_dir(turns: TurnCheckpoints, repo: Path) -> Path:
    return turns.shadow.repo_dir(repo) / "refs" / "agenthost" / "s1"


def test_an_unchanged_folder_is_captured_here_without_git_as_the_pool_would(
    turns: TurnCheckpoints, repo: Path, git_log: GitLog
) -> None:
    tree = before(turns, repo)
    ref = refs_dir(turns, repo) / f"+{tree}"
    kept = ref.stat()
    git_log.clear()
    here = turns.capture_after_here(str(repo), "s1", "t1", tree)
    assert isinstance(here, Capture) and isinstance(here.checkpoint, Checkpoint)
    assert git_log.commands() == []
    assert here.checkpoint.tree == tree and here.changed == ()
    assert here.checkpoint.head_commit == git(repo, "rev-parse", "HEAD")
    pooled = turns.capture(str(repo), "s1", "t2", "after", tree).result(30)
    assert here == pooled
    assert ref.read_text() == tree + "\n"
    assert ref.stat().st_ino == kept.st_ino and ref.stat().st_mtime_ns == kept.st_mtime_ns
    assert turns.shadow.refs(repo) == [commit_ref("s1", tree)]  # the `before`'s, untouched


def test_a_changed_folder_is_left_to_the_pool_which_captures_the_change(
    turns: TurnCheckpoints, repo: Path
) -> None:
    tree = before(turns, repo)
    (repo / "sub" / "c.txt").write_text("charlie, changed\n")
    assert turns.capture_after_here(str(repo), "s1", "t1", tree) is None
    assert turns.shadow.refs(repo) == [commit_ref("s1", tree)]
    pooled = turns.capture(str(repo), "s1", "t1", "after", tree).result(30)
    assert pooled.changed == ({"path": "sub/c.txt", "kind": "modified"},)
    assert isinstance(pooled.checkpoint, Checkpoint)
    assert (refs_dir(turns, repo) / f"+{pooled.checkpoint.tree}").is_file()


def test_an_after_whose_tree_is_not_its_befores_is_left_to_the_pool(
    turns: TurnCheckpoints, repo: Path
) -> None:
    """Another Session's capture of the same folder moved the snapshot on: the changed files
    need git's diff, which the pool runs."""
    tree = before(turns, repo)
    assert turns.capture_after_here(str(repo), "s1", "t1", "0" * 40) is None
    assert turns.shadow.refs(repo) == [commit_ref("s1", tree)]


def test_nothing_is_captured_here_while_a_job_of_the_folder_runs_or_a_failpoint_is_armed(
    turns: TurnCheckpoints, repo: Path
) -> None:
    tree = before(turns, repo)
    with turns.locks(str(repo.resolve())):
        got: list[Capture | None] = []
        t = threading.Thread(
            target=lambda: got.append(turns.capture_after_here(str(repo), "s1", "t1", tree))
        )
        t.start()
        t.join(10)
        assert got == [None]
    assert isinstance(turns.failpoints, Failpoints)
    turns.failpoints.set({"host.checkpoint.after": "sleep:1"})
    assert turns.capture_after_here(str(repo), "s1", "t1", tree) is None
    turns.failpoints.set({"host.checkpoint.after": "off", "host.checkpoint.before": "sleep:1"})
    assert turns.capture_after_here(str(repo), "s1", "t1", tree) is not None


def test_a_first_capture_a_big_snapshot_or_two_slow_ones_in_a_row_go_to_the_pool(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    age()
    turns = TurnCheckpoints(aged_store(tmp_path))
    try:
        # Never captured: no snapshot, and its store's stale locks not cleared yet.
        assert turns.capture_after_here(str(repo), "s1", "t1", None) is None
        tree = before(turns, repo)
        monkeypatch.setattr(checkpoints_module, "HERE_MAX_ENTRIES", 2)
        # A budget no loaded machine overruns: this refusal is the snapshot's size, and a slow
        # attempt would pause the folder (the assertion after it would then see the pause).
        monkeypatch.setattr(checkpoints_module, "HERE_BUDGET_S", 60.0)
        assert turns.capture_after_here(str(repo), "s1", "t1", tree) is None
        monkeypatch.setattr(checkpoints_module, "HERE_MAX_ENTRIES", 1_000)
        monkeypatch.setattr(checkpoints_module, "HERE_BUDGET_S", 0.0)
        assert turns.capture_after_here(str(repo), "s1", "t1", tree) is not None
        time.sleep(0.01)
        # One capture slower than the budget (on a loaded host, most often a wait for a core)
        # leaves the folder's captures here; a second in a row sends them to the pool for a
        # while (a slow filesystem).
        tree = before(turns, repo, "t2")
        assert turns.capture_after_here(str(repo), "s1", "t2", tree) is not None
        tree = before(turns, repo, "t3")
        assert turns.capture_after_here(str(repo), "s1", "t3", tree) is None
        assert turns.capture_before_here(str(repo), "s1", "t4") is None
    finally:
        turns.pool.shutdown(wait=True)


def test_a_before_is_captured_here_only_when_its_sessions_ref_of_the_tree_is_there(
    turns: TurnCheckpoints, repo: Path, git_log: GitLog
) -> None:
    """`capture_before_here`: an unchanged folder whose tree this Session's ref keeps is taken
    with no git and no file written, pinned for its Turn; another Session's first `before`
    (its ref not written yet), a changed folder or an armed `host.checkpoint.before` go to
    the pool."""
    tree = before(turns, repo)
    ref = refs_dir(turns, repo) / f"+{tree}"
    kept = ref.stat()
    git_log.clear()
    here = turns.capture_before_here(str(repo), "s1", "t2")
    assert isinstance(here, Capture) and isinstance(here.checkpoint, Checkpoint)
    assert git_log.commands() == []
    assert here == turns.capture(str(repo), "s1", "t3", "before").result(30)
    assert ref.stat().st_ino == kept.st_ino and ref.stat().st_mtime_ns == kept.st_mtime_ns
    real = str(repo.resolve())
    assert turns.locks.pins.pinned(real, [commit_ref("s1", tree)]) == {commit_ref("s1", tree)}
    turns.settled("s1", "t3")
    turns.settled("s1", "t1")
    assert turns.locks.pins.pinned(real, [commit_ref("s1", tree)]) == {commit_ref("s1", tree)}
    turns.settled("s1", "t2")
    assert turns.locks.pins.pinned(real, [commit_ref("s1", tree)]) == set()

    assert turns.capture_before_here(str(repo), "s2", "u1") is None  # no ref of s2's yet
    assert turns.shadow.refs(repo) == [commit_ref("s1", tree)]
    assert isinstance(turns.failpoints, Failpoints)
    turns.failpoints.set({"host.checkpoint.before": "sleep:1"})
    assert turns.capture_before_here(str(repo), "s1", "t4") is None
    turns.failpoints.set({"host.checkpoint.before": "off"})
    (repo / "sub" / "c.txt").write_text("charlie, changed\n")
    assert turns.capture_before_here(str(repo), "s1", "t4") is None


def test_a_before_taken_here_for_a_turn_never_created_is_unpinned_and_its_ref_kept(
    turns: TurnCheckpoints, repo: Path
) -> None:
    """A submit that creates no Turn (a replay) discards its `before`: one taken here wrote
    no ref, so its pin goes and the ref, which an earlier Turn named, stays."""
    tree = before(turns, repo)
    turns.settled("s1", "t1")
    here = turns.capture_before_here(str(repo), "s1", "never")
    assert here is not None
    real, name = str(repo.resolve()), commit_ref("s1", tree)
    assert turns.locks.pins.pinned(real, [name]) == {name}
    done: Future[Capture] = Future()
    done.set_result(here)
    turns.discard(done, str(repo), "s1", "never", "before")
    deadline = time.monotonic() + 30  # the drop runs on the pool
    while turns.locks.pins.pinned(real, [name]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert turns.locks.pins.pinned(real, [name]) == set()
    turns.pool.shutdown(wait=True)
    assert turns.shadow.refs(repo) == [name]
