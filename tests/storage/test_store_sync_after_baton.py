"""The WAL's fsync after a durable group's COMMIT runs after the writer baton is handed on: the
next group's writes go on while it runs, and no member of a group returns (nor is any of its
events published) before an fsync of the WAL that began after its COMMIT returned.

A real SQLite file and real threads; only `os.fdatasync` is held at a gate the test opens (it
then runs the real call), to hold one fsync in flight."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from storage.models import ChangeEvent, SessionChanged
from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions
from tests.support.invariants import SYNC_TRACE_FILE, check_store_syncs, sync_trace_env

pytestmark = pytest.mark.timeout(60)


class HeldSync:
    """`os.fdatasync` with its next call held until `release()`; every call's start and end
    times are kept (the real call runs after the gate)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._real: Callable[[int], None] = os.fdatasync
        self.armed = False
        self.entered = threading.Event()
        self._gate = threading.Event()
        self.starts: list[float] = []
        self.ends: list[float] = []
        monkeypatch.setattr(os, "fdatasync", self)

    def __call__(self, fd: int) -> None:
        self.starts.append(time.monotonic())
        if self.armed:
            self.armed = False
            self.entered.set()
            self._gate.wait(30)
        self._real(fd)
        self.ends.append(time.monotonic())

    def release(self) -> None:
        self._gate.set()


def _title(path: Path, sid: str) -> str:
    conn = apsw.Connection(str(path))
    try:
        row = conn.execute(
            "SELECT title FROM sessions WHERE workspace_id = ? AND session_id = ?", (WS, sid)
        ).fetchone()
        return str(row[0])
    finally:
        conn.close()


def test_the_next_group_commits_while_a_groups_fsync_runs_and_waits_for_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's fsync is held: B still takes the baton, runs and COMMITs (another connection reads
    it), and returns only after an fsync of its own that began after that COMMIT was seen,
    while A's is still held; A returns once its own is let go. The store's sync trace keeps
    the law (a group woken only by a sync begun after its COMMIT, in order)."""
    path = tmp_path / "store.sqlite3"
    for key, value in sync_trace_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    store = Store.open(path)
    heard: list[ChangeEvent] = []
    try:
        a_sid, b_sid = _sessions(store, 2)
        store.sessions.update_title(WS, a_sid, "warm")  # the WAL's descriptor is open
        store.db.subscribe(heard.append)
        sync = HeldSync(monkeypatch)
        sync.armed = True
        returned: dict[str, float] = {}

        def rename(sid: str, title: str, name: str) -> None:
            store.sessions.update_title(WS, sid, title)
            returned[name] = time.monotonic()

        a = threading.Thread(target=rename, args=(a_sid, "a", "a"))
        a.start()
        assert sync.entered.wait(20), "A's fsync never began"
        b = threading.Thread(target=rename, args=(b_sid, "b", "b"))
        b_started = time.monotonic()
        b.start()
        deadline = time.monotonic() + 5
        while _title(path, b_sid) != "b":
            assert time.monotonic() < deadline, "B's write waited for A's fsync"
            time.sleep(0.005)
        # B's own sync begins after its COMMIT, beside A's held one, and covers both: B
        # returns while A's, the only sync begun before B's write, is still held.
        b.join(20)
        assert "b" in returned and "a" not in returned
        assert len(sync.starts) == 2 and len(sync.ends) == 1
        assert b_started < sync.starts[1] and sync.ends[0] <= returned["b"]
        sync.release()
        a.join(20)
        assert set(returned) == {"a", "b"}
        assert {e.session_id for e in heard if isinstance(e, SessionChanged)} >= {a_sid, b_sid}
    finally:
        store.close()
    assert check_store_syncs((tmp_path / SYNC_TRACE_FILE).read_text().splitlines()) == []
