"""A gone folder's lock is retired (`DirectoryLocks.retire_held`, after its refs' drop) without
ever giving the folder two locks: a capture that took the lock and has not yet parked on it
keeps it from being retired, so a second capture of the folder, begun after the retirement,
still waits for the first. The real `TurnCheckpoints`, `CheckpointJanitor`, `ShadowStore` and
pool; gates around the real `FolderLock.submit` and the capture's job."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from actors.checkpoints import (
    Capture,
    CheckpointJanitor,
    CheckpointPool,
    DirectoryLocks,
    DroppableCheckpoints,
    FolderLock,
    TurnCheckpoints,
)
from actors.store_ports import DeletedSessions
from workspace.shadow import ShadowStore

pytestmark = pytest.mark.timeout(60)

WAITING = "capture-waiting"
"""The thread whose capture is held between taking the folder's lock and parking on it."""


class _NoStore:
    @property
    def sessions(self) -> DeletedSessions:
        raise AssertionError("not read: no sweep here")

    @property
    def turns(self) -> DroppableCheckpoints:
        raise AssertionError("not read: no size cap here")


def test_two_captures_racing_a_gone_folders_retirement_still_take_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "tree"
    folder.mkdir()
    (folder / "a.txt").write_text("a file\n")
    real = os.path.realpath(folder)
    shadow = ShadowStore(tmp_path / "shadow")
    pool = CheckpointPool(4)
    locks = DirectoryLocks()
    checkpoints = TurnCheckpoints(shadow, pool, locks)
    janitor = CheckpointJanitor(shadow, _NoStore(), pool, locks, interval_s=3600.0)
    try:
        assert checkpoints.capture(real, "s", "t0", "before").result(30).checkpoint is not None

        # The capture's job: the first one in waits at a gate; how many run at once.
        inside = 0
        most = 0
        first_in = threading.Event()
        second_in = threading.Event()
        let_first_go = threading.Event()
        count = threading.Lock()
        run = checkpoints._run

        def gated_run(*args: Any) -> Capture:
            nonlocal inside, most
            with count:
                inside += 1
                most = max(most, inside)
                first = not first_in.is_set()
                (first_in if first else second_in).set()
            try:
                if first:
                    assert let_first_go.wait(30)
                return run(*args)
            finally:
                with count:
                    inside -= 1

        monkeypatch.setattr(checkpoints, "_run", gated_run)

        # A capture that took the folder's lock and is held before it parks on it.
        counted = threading.Event()
        let_it_park = threading.Event()
        submit = FolderLock.submit

        def gated_submit(
            self: FolderLock, pool: Any, fn: Callable[..., Any], *args: Any
        ) -> Future[Any]:
            if threading.current_thread().name == WAITING:
                counted.set()
                assert let_it_park.wait(30)
            return submit(self, pool, fn, *args)

        monkeypatch.setattr(FolderLock, "submit", gated_submit)
        waiting: list[Future[Capture]] = []
        thread = threading.Thread(
            target=lambda: waiting.append(checkpoints.capture(real, "s", "t1", "after")),
            name=WAITING,
        )
        thread.start()
        assert counted.wait(30)

        # The tree is removed; its Session's refs are dropped holding the folder's lock, and
        # the folder, gone, retired then: not while that capture holds a reference.
        shutil.rmtree(folder)
        janitor.drop_session(real, "s").result(30)
        assert len(locks) == 1

        # Another capture of the folder, begun after the retirement: it runs (gated) ...
        other = checkpoints.capture(real, "s", "t2", "before")
        assert first_in.wait(30)
        # ... and the held one parks behind it, on the same lock: it does not run meanwhile.
        let_it_park.set()
        thread.join(30)
        assert not second_in.wait(1.0), "two captures of one folder ran at once"
        let_first_go.set()
        other.result(30)
        assert waiting[0].result(30) is not None
        assert second_in.is_set() and most == 1, most

        # Nothing holds or waits on it now: the next drop retires the gone folder's lock.
        janitor.drop_session(real, "s").result(30)
        assert len(locks) == 0 and real not in locks._cleared
    finally:
        pool.shutdown(wait=True)


def test_folders_slow_to_capture_here_are_remembered_only_while_it_matters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Captures on the asking thread that overrun their budget pause that folder's here
    captures; a folder whose pause ended (a removed tree is never captured again) is not kept,
    nor more than `HERE_KEPT` folders slow once."""
    import actors.checkpoints as checkpoints_module

    monkeypatch.setattr(checkpoints_module, "HERE_BUDGET_S", -1.0)  # every capture here slow
    monkeypatch.setattr(checkpoints_module, "HERE_PAUSE_S", 0.0)  # each pause over at once
    monkeypatch.setattr(checkpoints_module, "HERE_KEPT", 2)
    pool = CheckpointPool(2)
    checkpoints = TurnCheckpoints(ShadowStore(tmp_path / "shadow"), pool, DirectoryLocks())
    try:
        for i in range(4):
            folder = tmp_path / f"tree-{i}"
            folder.mkdir()
            cwd = os.path.realpath(folder)
            checkpoints.capture(cwd, "s", f"t{i}", "before").result(30)
            checkpoints.capture_after_here(cwd, "s", f"t{i}", None)  # slow once
            assert checkpoints._here_slow.get(cwd) == 1
            assert len(checkpoints._here_slow) <= 2
        for i in range(4):
            cwd = os.path.realpath(tmp_path / f"tree-{i}")
            checkpoints.capture_after_here(cwd, "s", f"u{i}", None)
            checkpoints.capture_after_here(cwd, "s", f"v{i}", None)  # slow twice: paused
            assert cwd in checkpoints._here_paused
            assert len(checkpoints._here_paused) == 1, checkpoints._here_paused
    finally:
        pool.shutdown(wait=True)
