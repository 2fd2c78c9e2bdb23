"""One folder's stalled git never stalls another folder's checkpoints: a job for a folder whose
lock another job holds waits parked on that folder (`FolderLock`), never on one of the pool's
few threads, so a capture of another folder still gets a thread. The real `TurnCheckpoints`
and `CheckpointJanitor` on the real pool and git, the `git gc` stalled by a PATH wrapper
that holds its lock file until it is killed."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.checkpoints import (
    CheckpointJanitor,
    CheckpointPool,
    DirectoryLocks,
    DroppableCheckpoints,
    TurnCheckpoints,
)
from actors.store_ports import DeletedSessions
from tests.support.daemon import wait_for
from tests.workspace.stalling_git import StallingGit, path_with, running, stalling_git
from workspace.shadow import Checkpoint, ShadowStore

pytestmark = pytest.mark.timeout(90)

GC_BOUND_S = 40.0
"""The stalled `git gc`'s bound here: the other folder's capture is asked to land well
inside it (it ends the test early: the stall is killed once that is seen)."""


class _NoStore:
    @property
    def sessions(self) -> DeletedSessions:
        raise AssertionError("not read: no sweep of deleted Sessions here")

    @property
    def turns(self) -> DroppableCheckpoints:
        raise AssertionError("not read: no size cap here")


def _folder(path: Path, text: str) -> str:
    path.mkdir()
    (path / "a.txt").write_text(text)
    return os.path.realpath(path)


@pytest.fixture
def stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StallingGit]:
    made = stalling_git(tmp_path / "stall", "gc")
    monkeypatch.setenv("PATH", path_with(made.bin))
    yield made
    made.kill_left()


def test_a_stalled_collection_of_one_folder_leaves_the_pool_to_another_folders_capture(
    tmp_path: Path, stall: StallingGit
) -> None:
    x = _folder(tmp_path / "x", "x\n")
    y = _folder(tmp_path / "y", "y\n")
    shadow = ShadowStore(
        tmp_path / "home" / "checkpoints", timeout_s=5.0, long_timeout_s=GC_BOUND_S
    )
    pool = CheckpointPool()
    locks = DirectoryLocks()
    turns = TurnCheckpoints(shadow, pool, locks)
    janitor = CheckpointJanitor(shadow, _NoStore(), pool, locks, interval_s=3600.0)
    try:
        for where in (x, y):
            first = turns.capture(where, "s-kept", f"t-{where}", "before").result(30)
            assert isinstance(first.checkpoint, Checkpoint), first
        doomed = turns.capture(x, "s-doomed", "t-doomed", "after").result(30)
        assert isinstance(doomed.checkpoint, Checkpoint), doomed
        assert janitor.drop_session(x, "s-doomed").result(30) == 1  # x is to be collected

        stall.arm()
        collecting = pool.submit(janitor._collect)
        wait_for(stall.taken, 30, interval=0.05)
        # A Turn in x waits for its capture: on the pool's second thread it would wait for
        # x's lock, and every other folder's capture behind it.
        of_x = turns.capture(x, "s-kept", "t-x2", "after")
        of_y = turns.capture(y, "s-kept", "t-y2", "after")
        landed = of_y.result(GC_BOUND_S / 2)
        assert isinstance(landed.checkpoint, Checkpoint), landed
        assert [p for p in stall.pids() if running(p)], "the gc still stalls"
        assert not collecting.done() and not of_x.done()

        stall.kill_left()  # as its bound would: x's capture runs next
        assert collecting.result(30) == 0
        after = of_x.result(30)
        assert isinstance(after.checkpoint, Checkpoint), after
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def test_a_job_parked_on_a_busy_folder_and_cancelled_never_runs(tmp_path: Path) -> None:
    x = _folder(tmp_path / "x", "x\n")
    shadow = ShadowStore(
        tmp_path / "home" / "checkpoints", timeout_s=5.0, long_timeout_s=GC_BOUND_S
    )
    pool = CheckpointPool()
    locks = DirectoryLocks()
    turns = TurnCheckpoints(shadow, pool, locks)
    ran: list[str] = []
    run = turns._run

    def counted(real: str, sid: str, turn_id: str, which: str, before: str | None) -> object:
        ran.append(turn_id)
        return run(real, sid, turn_id, which, before)

    turns._run = counted  # type: ignore[assignment,method-assign]
    try:
        with locks(x):
            given_up = [turns.capture(x, "s", f"t{i}", "before") for i in range(3)]
            kept = turns.capture(x, "s", "t-kept", "before")
            assert all(f.cancel() for f in given_up)  # parked: no thread holds them
        assert isinstance(kept.result(30).checkpoint, Checkpoint)
        assert ran == ["t-kept"]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def test_a_pool_shut_down_cancels_a_folders_queued_and_parked_jobs(tmp_path: Path) -> None:
    """The daemon closing (`shutdown(cancel_futures=True)`): a folder's job queued on the pool
    is cancelled and lets the folder go, so the job parked behind it is cancelled too: no
    reader waits on a future nothing will answer."""
    pool = CheckpointPool(threads=1)
    locks = DirectoryLocks()
    x = _folder(tmp_path / "x", "x\n")
    busy = threading.Event()
    hold = pool.submit(busy.wait, 30)
    queued = locks.submit(pool, x, lambda: "queued")
    parked = locks.submit(pool, x, lambda: "parked")
    pool.shutdown(wait=False, cancel_futures=True)
    busy.set()
    assert hold.result(30) is True
    assert queued.cancelled() and parked.cancelled()
    assert locks(x).acquire(blocking=False)  # the folder was let go
