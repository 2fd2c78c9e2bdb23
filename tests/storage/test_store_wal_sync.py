"""Which COMMITs reach the disk before their writer returns, counted as the kernel sees them.

The writer connection runs at `synchronous=NORMAL` for good and a durable group's COMMIT is
followed by one fdatasync of the WAL file (`Database._sync_wal`); a lazy group's is followed
by none. So no `PRAGMA synchronous` is run between groups (SQLite compiles one at every use),
and the durability law is unchanged: a durable write returns only after an fsync of the WAL
that holds it (and every lazy COMMIT before it), a lazy write's COMMIT syncs nothing, and a
lazy write that fails leaves the next durable one fsync'd. A real SQLite file, the store
driven in a child process under strace."""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from domain.errors import SessionNotFound, StoreBusy, StoreSyncFailed
from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions

ROOT = Path(__file__).resolve().parents[2]

# The child: each step between two markers (a write of "M:<name>" to /dev/null).
_CHILD = textwrap.dedent(
    """
    import os, sys, threading
    from storage.store import Store
    WS = "ws"
    mark_fd = os.open("/dev/null", os.O_WRONLY)

    def mark(name):
        os.write(mark_fd, ("M:" + name).encode())

    store = Store.open(sys.argv[1])
    for i in range(4):
        store.sessions.create_session(WS, session_id=f"s{i}", provider="tutti-agent",
                                      title=f"s{i}", cwd="/", settings={})
    store.close()  # the last connection: SQLite removes the WAL file
    mark("reopen")
    store = Store.open(sys.argv[1])
    store.sessions.update_title(WS, "s3", "reopened")

    def lazy(title, fail=False, abort=False):
        try:
            with store.db.write(WS, durable=False) as tx:
                tx.execute("UPDATE sessions SET title = ? WHERE session_id = 's1'", (title,))
                if abort:  # what SQLite does on a full disk or an I/O error
                    tx.execute("ROLLBACK")
                if fail or abort:
                    raise RuntimeError("deliberate")
        except RuntimeError:
            pass

    mark("durable")
    store.sessions.update_title(WS, "s0", "durable")
    mark("lazy")
    lazy("lazy")
    mark("durable-after-lazy")
    store.sessions.update_title(WS, "s0", "after lazy")
    mark("failed-lazy")
    lazy("never", fail=True)
    mark("durable-after-failed-lazy")
    store.sessions.update_title(WS, "s0", "after failed lazy")
    mark("aborted-lazy")
    lazy("never", abort=True)
    mark("durable-after-aborted-lazy")
    store.sessions.update_title(WS, "s0", "after aborted lazy")
    mark("lazy-prepare-then-durable")
    lazy("lazy 2")
    store.sessions.update_title(WS, "s2", "durable 2")
    mark("end")
    store.close()
    """
)


def _syncs_by_step(tmp_path: Path) -> dict[str, list[str]]:
    db = tmp_path / "store.sqlite3"
    trace = tmp_path / "strace.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [
            "strace",
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,write",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            _CHILD,
            str(db),
        ],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    steps: dict[str, list[str]] = {}
    step: str | None = None
    for line in trace.read_text().splitlines():
        marker = re.search(r'write\(\d+</dev/null>, "M:([^"]+)"', line)
        if marker is not None:
            step = marker.group(1)
            steps[step] = []
            continue
        synced = re.search(r"\b(fsync|fdatasync)\(\d+<([^>]+)>", line)
        if step is not None and synced is not None:
            steps[step].append(Path(synced.group(2)).name)
    return steps


def test_only_durable_commits_fsync_the_wal_before_their_writer_returns(tmp_path: Path) -> None:
    # Fails, never skips, without strace: the syscalls are the point of this test.
    assert shutil.which("strace") is not None, "strace is not installed (the test counts syscalls)"
    steps = _syncs_by_step(tmp_path)
    wal = "store.sqlite3-wal"
    assert steps["durable"] == [wal]
    assert steps["lazy"] == []
    assert steps["durable-after-lazy"] == [wal]  # it covers the lazy COMMIT before it
    assert steps["failed-lazy"] == []
    assert steps["durable-after-failed-lazy"] == [wal]
    assert steps["aborted-lazy"] == []
    assert steps["durable-after-aborted-lazy"] == [wal]
    assert steps["lazy-prepare-then-durable"] == [wal]


def test_the_first_durable_write_makes_the_wals_name_durable_once(tmp_path: Path) -> None:
    """A store reopened (its WAL removed at the last close, made again at the open): the
    fresh WAL's directory entry is made durable before the first durable write returns, and
    by nothing later. SQLite does it at a connection's first sync of a WAL it created, which
    the writer at `synchronous=NORMAL` reaches only at a checkpoint; the store's own first
    fdatasync of the WAL is followed by an fsync of its directory (the open's own writes at
    `FULL` on another connection do it today too: this pins the law, whichever does it)."""
    assert shutil.which("strace") is not None, "strace is not installed (the test counts syscalls)"
    steps = _syncs_by_step(tmp_path)
    wal, directory = "store.sqlite3-wal", tmp_path.name
    reopened = steps["reopen"]
    assert directory in reopened, reopened
    at = reopened.index(directory)
    assert at > 0 and reopened[at - 1] == wal, reopened  # right after the WAL's fdatasync
    later = [s for name, synced in steps.items() if name != "reopen" for s in synced]
    assert directory not in later, steps


def test_the_writer_runs_no_pragma_between_groups(tmp_path: Path) -> None:
    """A lazy group and a durable one after it: BEGIN, the write, COMMIT each — no setting
    changed around the lazy one (a `PRAGMA synchronous` is compiled again at every use)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        (sid,) = _sessions(store, 1)
        conn = store.db._writer_connection()
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL, for good
        ran: list[str] = []

        def trace(_cursor: object, sql: str, _bindings: object) -> bool:
            ran.append(sql.split(None, 1)[0].upper())
            return True

        conn.exec_trace = trace
        try:
            with store.db.write(WS, durable=False) as tx:
                tx.execute("UPDATE sessions SET title = 'lazy' WHERE session_id = ?", (sid,))
            with pytest.raises(SessionNotFound), store.db.write(WS, durable=False) as tx:
                tx.execute("UPDATE sessions SET title = 'never' WHERE session_id = ?", (sid,))
                raise SessionNotFound("deliberate failure")
            with store.db.write(WS) as tx:
                tx.execute("UPDATE sessions SET title = 'durable' WHERE session_id = ?", (sid,))
        finally:
            conn.exec_trace = None
        assert "PRAGMA" not in ran, ran
        assert ran == ["BEGIN", "UPDATE", "COMMIT"] + ["BEGIN", "UPDATE", "ROLLBACK"] + [
            "BEGIN",
            "UPDATE",
            "COMMIT",
        ]
        stats = store.db.write_stats.snapshot()
        assert stats["lazy_commits"] >= 1
        assert store.sessions.get_session(WS, sid).title == "durable"
    finally:
        store.close()


def test_a_failed_fsync_of_the_wal_fails_the_group_and_every_later_write(
    tmp_path: Path,
) -> None:
    """The WAL's fsync after a durable COMMIT fails (here: the descriptor is a pipe, which
    cannot be synced): every member gets `store_sync_failed` and no event (the write is in the
    WAL but not known durable, as after a crash between a COMMIT and its reply), the store's
    callback is told once, and no later write commits, durable or lazy, on a fresh descriptor
    or not: after a failed fsync the kernel may have dropped the WAL's pages while a new
    descriptor's fsync succeeds (a later write "made durable" behind a hole in the WAL)."""
    store = Store.open(tmp_path / "store.sqlite3")
    heard: list[object] = []
    told: list[OSError] = []
    try:
        (sid,) = _sessions(store, 1)
        store.db.subscribe(heard.append)
        store.db.on_sync_failed(told.append)
        store.sessions.update_title(WS, sid, "first")  # the WAL's descriptor is open
        heard.clear()
        store.db._close_wal_fd()
        unsyncable, other_end = os.pipe()
        store.db._wal_fd = unsyncable
        before = store.db.write_stats.snapshot()
        with pytest.raises(StoreSyncFailed) as failed:
            store.sessions.update_title(WS, sid, "not known durable")
        assert failed.value.reason == "store_sync_failed" and not failed.value.retryable
        assert heard == []
        assert len(told) == 1 and isinstance(told[0], OSError)
        after = store.db.write_stats.snapshot()
        assert after["group_failures"] - before["group_failures"] == 1
        assert after["commits"] == before["commits"]
        assert store.db._wal_fd is None  # dropped (the pipe's end closed with it)
        os.close(other_end)
        with pytest.raises(StoreSyncFailed):
            store.sessions.update_title(WS, sid, "after the failure")
        with pytest.raises(StoreSyncFailed), store.db.write(WS, durable=False) as tx:
            tx.conn.execute("SELECT 1")
        assert store.db.write_stats.snapshot()["commits"] == after["commits"]
        assert store.db.write_stats.snapshot()["lazy_commits"] == after["lazy_commits"]
        assert heard == [] and len(told) == 1
    finally:
        store.close()
    reopened = Store.open(tmp_path / "store.sqlite3")
    try:  # a new open (the daemon started again) writes again
        before = reopened.db.write_stats.snapshot()["commits"]
        reopened.sessions.update_title(WS, sid, "after a new start")
        assert reopened.db.write_stats.snapshot()["commits"] == before + 1
    finally:
        reopened.close()


def test_a_wal_that_cannot_be_opened_for_its_fsync_fails_the_group_and_the_next_write_syncs(
    tmp_path: Path,
) -> None:
    """The WAL's descriptor cannot be opened (the process is at its fd limit): nothing was
    synced and nothing the kernel held was dropped, so the group fails retryable
    (`StoreBusy`), the store is not stopped, and the next durable write opens the WAL and
    is fsync'd."""
    store = Store.open(tmp_path / "store.sqlite3")
    told: list[OSError] = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        (sid,) = _sessions(store, 1)
        store.db.on_sync_failed(told.append)
        store.sessions.update_title(WS, sid, "first")
        store.db._close_wal_fd()
        lowest_free = os.dup(0)
        os.close(lowest_free)
        before = store.db.write_stats.snapshot()
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            with pytest.raises(StoreBusy):
                store.sessions.update_title(WS, sid, "not known durable")
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert told == [] and store.db.sync_failed is None
        store.sessions.update_title(WS, sid, "durable again")
        after = store.db.write_stats.snapshot()
        assert after["commits"] - before["commits"] == 1
        fd = store.db._wal_fd
        assert fd is not None
        assert os.fstat(fd).st_ino == (tmp_path / "store.sqlite3-wal").stat().st_ino
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        store.close()
