"""A git the checkpoints' bound killed (a stalled disk, a huge folder) leaves the lock file it
held; git refuses every later write past it. The kill takes the git's whole process group
(nothing of it still writes), and the lock files are removed while the folder's work is
still serialised, so the folder's next capture (or collection) works: checkpoints do not
stop until the daemon restarts. Real git behind a PATH wrapper that stalls one command."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from actors.checkpoints import CheckpointJanitor, DirectoryLocks, TurnCheckpoints
from tests.support.daemon import wait_for
from tests.workspace.stalling_git import (
    StallingGit,
    holds_files,
    path_with,
    running,
    stalling_git,
)
from workspace.git import Git, GitUnavailable
from workspace.shadow import Checkpoint, ShadowStore, Unavailable

pytestmark = pytest.mark.timeout(60)

BOUND_S = 2.0
"""The stores' bound here: long enough for a real git on a loaded host, short for the test."""
STALL_ATTEMPTS = 5
"""Runs of a stalled git until the bound strikes it with its child started (a loaded host)."""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / "sub").mkdir()
    (work / "sub" / "b.txt").write_text("b\n")
    return work


@pytest.fixture
def stall_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], StallingGit]]:
    """Put a `git` on PATH that stalls `command` once armed; what it left running is killed
    at the end."""
    made: list[StallingGit] = []

    def make(command: str) -> StallingGit:
        stall = stalling_git(tmp_path / "stall", command)
        monkeypatch.setenv("PATH", path_with(stall.bin))
        made.append(stall)
        return stall

    yield make
    for stall in made:
        stall.kill_left()


def _fresh_tree(tmp_path: Path, folder: Path) -> str:
    """The folder's tree as a store that never met the stall captures it."""
    fresh = ShadowStore(tmp_path / "fresh" / "checkpoints").capture(folder)
    assert isinstance(fresh, Checkpoint)
    return fresh.tree


def test_a_capture_after_one_whose_git_was_killed_past_its_bound_names_the_folder(
    tmp_path: Path, folder: Path, stall_on: Callable[[str], StallingGit]
) -> None:
    stall = stall_on("add")
    store = ShadowStore(tmp_path / "home" / "checkpoints", timeout_s=BOUND_S)
    first = store.capture(folder)
    assert isinstance(first, Checkpoint)
    (folder / "a.txt").write_text("a, changed\n")
    stall.arm()
    timed = store.capture(folder)
    assert stall.taken()
    assert isinstance(timed, Unavailable) and timed.reason == "timed_out", timed
    assert not (store.repo_dir(folder) / "index.lock").exists()
    nxt = store.capture(folder)
    assert isinstance(nxt, Checkpoint), nxt
    assert nxt.tree != first.tree and nxt.tree == _fresh_tree(tmp_path, folder)


def test_a_git_killed_past_its_bound_leaves_no_process_of_it_behind(
    tmp_path: Path, stall_on: Callable[[str], StallingGit]
) -> None:
    stall = stall_on("gc")
    git = Git.find(tmp_path / "home", timeout_s=BOUND_S)
    # The set-up is not what is bounded here (a loaded host's `init` may take seconds).
    setup = Git.find(tmp_path / "home", timeout_s=60.0)
    pids: list[int] = []
    # On a loaded host the bound may strike before the stalled git has started its child (or
    # written its pid): that run proves nothing of the child, so it is run again until it does.
    for attempt in range(STALL_ATTEMPTS):
        repo = tmp_path / f"repo{attempt}.git"
        setup.run(["init", "-q", "--bare", str(repo)])
        stall.arm()
        with pytest.raises(GitUnavailable) as raised:
            git.run(["gc", "-q", "--prune=now"], env={"GIT_DIR": str(repo)})
        assert raised.value.reason == "timed_out" and raised.value.stale_locks
        pids = stall.pids()
        if stall.taken() and len(pids) == 2:
            break
    assert stall.taken() and len(pids) == 2, f"struck before its child {STALL_ATTEMPTS} times"
    # Once the call answers nothing of it holds a file (nothing still writes); one killed but
    # not yet through its exit still reads as running for a moment: waited for.
    assert [holds_files(pid) for pid in pids] == [False, False]
    wait_for(lambda: not any(running(pid) for pid in pids), timeout=30)


class _NoDeletedSessions:
    """The janitor's store port with nothing deleted: its sweeps only collect."""

    @property
    def sessions(self) -> _NoDeletedSessions:
        return self

    @property
    def turns(self) -> Any:
        raise AssertionError("no size cap here")

    def deleted_sessions(self) -> list[tuple[str, str]]:
        return []


class _Inline(Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def test_a_collection_killed_past_its_bound_lets_the_next_one_and_the_drops_through(
    tmp_path: Path, folder: Path, stall_on: Callable[[str], StallingGit]
) -> None:
    stall = stall_on("gc")
    store = ShadowStore(
        tmp_path / "home" / "checkpoints", timeout_s=BOUND_S, long_timeout_s=BOUND_S
    )
    locks = DirectoryLocks()
    turns = TurnCheckpoints(store, pool=_Inline(), locks=locks)
    kept = turns.capture(str(folder), "s1", "t1", "before").result()
    assert isinstance(kept.checkpoint, Checkpoint)
    janitor = CheckpointJanitor(store, _NoDeletedSessions(), _Inline(), locks, interval_s=60.0)
    assert janitor.drop_session(str(folder), "s1").result() == 1
    stall.arm()
    assert janitor.sweep()["collected"] == 0
    assert stall.taken()
    assert not (store.repo_dir(folder) / "packed-refs.lock").exists()
    # Kept dirty, collected by the next sweep; and a ref can be deleted past where it stood.
    assert janitor.sweep()["collected"] == 1
    again = turns.capture(str(folder), "s2", "t2", "before").result()
    assert isinstance(again.checkpoint, Checkpoint)
    assert janitor.drop_session(str(folder), "s2").result() == 1


def test_a_turns_capture_after_a_timed_out_one_is_kept_under_its_ref(
    tmp_path: Path, folder: Path, stall_on: Callable[[str], StallingGit]
) -> None:
    stall = stall_on("add")
    store = ShadowStore(tmp_path / "home" / "checkpoints", timeout_s=BOUND_S)
    turns = TurnCheckpoints(store, pool=_Inline())
    first = turns.capture(str(folder), "s1", "t1", "before").result()
    assert isinstance(first.checkpoint, Checkpoint)
    (folder / "new.txt").write_text("new\n")
    stall.arm()
    timed = turns.capture(str(folder), "s1", "t1", "after").result()
    assert isinstance(timed.checkpoint, Unavailable) and timed.checkpoint.reason == "timed_out"
    nxt = turns.capture(str(folder), "s1", "t2", "before").result()
    assert isinstance(nxt.checkpoint, Checkpoint), nxt.checkpoint
    assert nxt.checkpoint.tree == _fresh_tree(tmp_path, folder)
    assert f"s1/+{nxt.checkpoint.tree}" in store.refs(folder)
