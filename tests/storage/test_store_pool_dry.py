"""A store whose connection pool runs dry names, in its log, the threads holding the
connections and where each is, so a holder that never gives one back can be found."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import pytest

import storage.base as base
from domain.errors import StoreBusy
from storage.base import Database
from storage.store import Store


def test_a_dry_pool_logs_the_threads_that_hold_its_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(base, "LEASE_TIMEOUT_S", 0.2)
    db = Database(tmp_path / "store.sqlite3", max_connections=1)
    leased = threading.Event()
    release = threading.Event()

    def hold_the_only_connection() -> None:
        with db.lease():
            leased.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_only_connection, name="the-holder")
    holder.start()
    try:
        assert leased.wait(10)
        with (
            caplog.at_level(logging.ERROR, logger="storage.base"),
            pytest.raises(StoreBusy, match="stayed in use"),
            db.lease(),
        ):
            pass
        text = caplog.text
        assert "held by the-holder" in text
        assert "leased at test_store_pool_dry.py" in text  # the call site that took it
        assert "hold_the_only_connection" in text  # where the holder is now
    finally:
        release.set()
        holder.join(10)
    with db.lease():  # given back: leased again at once
        pass
    db.close()


def test_reads_on_many_threads_give_their_connections_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read the daemon's threads make (here `session.delete`'s worktree lookup,
    `fork.resolve`'s attribution reads, the checkpoint sweep's) leases a connection for the
    call and returns it: one that pinned it to its thread for good would leave the daemon
    with no connection once as many pool threads as connections had run it."""
    monkeypatch.setattr(base, "LEASE_TIMEOUT_S", 0.5)
    store = Store.open(tmp_path / "store.sqlite3", max_connections=2)
    try:
        reads = [
            lambda: store.sessions.deleted_sessions(),
            lambda: store.fork_workspace.session_worktree("ws", "missing"),
            lambda: store.fork_workspace.newest_checkpoint("ws", "missing"),
            lambda: store.resolution.other_fork_prefixes("ws", "missing", "op"),
            lambda: store.resolution.claimed_provider_children("ws", "missing"),
        ]
        failures: list[BaseException] = []
        for read in reads:
            for n in range(4):  # more threads than connections, each a thread of its own

                def run(read: Callable[[], object] = read) -> None:
                    try:
                        read()
                    except BaseException as exc:  # noqa: BLE001 - reported below
                        failures.append(exc)

                thread = threading.Thread(target=run, name=f"reader-{n}")
                thread.start()
                thread.join(10)
                assert not failures, failures
        assert store.db.open_connections() <= 2
        with store.db.lease():  # one is free at once
            pass
    finally:
        store.close()


def test_no_production_module_pins_a_connection_to_its_thread() -> None:
    """`Database.connection()` keeps a connection until the thread gives it back, which no
    daemon thread does: it is for tests and tools only; the daemon leases per call."""
    root = Path(__file__).resolve().parents[2]
    offenders = [
        str(path.relative_to(root))
        for package in ("storage", "actors", "agenthost", "transport", "workspace")
        for path in sorted((root / package).rglob("*.py"))
        if path.name != "base.py" or package != "storage"
        if ".connection()" in (text := path.read_text()) or "db.connection\n" in text
    ]
    assert offenders == []


def test_a_slow_open_holds_no_other_lease_nor_the_connection_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection's open may wait out the busy timeout (a store another process locks, a
    WAL being recovered): meanwhile another thread gives its connection back, leases an idle
    one and the count `host.status` reads answers — the open holds only its reserved slot."""
    db = Database(tmp_path / "store.sqlite3", max_connections=3)
    with db.lease():  # one connection opened, now idle
        pass
    opening = threading.Event()
    gate = threading.Event()
    real_open = base.open_connection

    def gated_open(*args: object, **kwargs: object) -> object:
        opening.set()
        assert gate.wait(20), "the gate was never opened"
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    taken = threading.Event()
    give_back = threading.Event()

    def hold_the_idle_one() -> None:
        with db.lease():
            taken.set()
            give_back.wait(20)

    holder = threading.Thread(target=hold_the_idle_one)
    holder.start()
    assert taken.wait(10)
    monkeypatch.setattr(base, "open_connection", gated_open)
    opener = threading.Thread(target=lambda: db.with_conn(lambda conn: None))
    opener.start()
    try:
        assert opening.wait(10)  # the opener is inside its open, the pool's idle list empty
        counted: list[int] = []
        others = threading.Thread(
            target=lambda: (give_back.set(), holder.join(10), counted.append(db.open_connections()))
        )
        others.start()
        others.join(10)
        # The holder's checkin and the count went through while the open is still held.
        assert not holder.is_alive() and counted == [1], counted
        with db.lease():  # the connection given back, leased again beside the open
            pass
        assert opener.is_alive()
    finally:
        gate.set()
        give_back.set()
        opener.join(10)
        holder.join(10)
    assert db.open_connections() == 2
    db.close()


def test_no_more_connections_open_than_the_bound_while_some_are_being_opened(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path / "store.sqlite3", max_connections=2)
    # The file in WAL mode first, as the store's migration leaves it before any concurrent
    # open: six first opens of a fresh file race to convert it, and SQLite answers a loser's
    # `journal_mode=WAL` busy without its busy handler (a clean-clone CI run saw a reader die).
    db.with_conn(lambda conn: None)
    start = threading.Barrier(6)
    peak: list[int] = []
    died: list[BaseException] = []

    def read() -> None:
        start.wait(10)
        try:
            for _ in range(20):
                db.with_conn(lambda conn: peak.append(db.open_connections()))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            died.append(exc)

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not died, died
    assert len(peak) == 6 * 20 and max(peak) <= 2 and db.open_connections() <= 2, max(peak)
    db.close()


def _drain(fd: int) -> None:
    while os.read(fd, 1 << 16):
        pass


class _WatchedStream(logging.StreamHandler):  # type: ignore[type-arg]
    """A plain stream handler that says when a record reaches it (the stream does the rest)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.emitting = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.emitting.set()
        super().emit(record)


def test_a_dry_pools_log_stuck_on_its_stream_holds_no_other_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry pool's report goes to the log after the pool's lock is let go: a log stream
    that blocks (here a pipe nobody reads, filled) holds the caller that logs, never another
    thread's checkin, lease or `open_connections` (`host.status`'s storeConnections)."""
    monkeypatch.setattr(base, "LEASE_TIMEOUT_S", 0.2)
    db = Database(tmp_path / "store.sqlite3", max_connections=1)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 65536)
    os.set_blocking(write_end, True)
    stream = os.fdopen(write_end, "w")
    handler = _WatchedStream(stream)
    logger = logging.getLogger("storage.base")
    logger.addHandler(handler)
    leased, release = threading.Event(), threading.Event()

    def hold_the_only_connection() -> None:
        with db.lease():
            leased.set()
            release.wait(20)

    busy: list[BaseException] = []

    def lease_from_a_dry_pool() -> None:
        try:
            with db.lease():
                pass
        except StoreBusy as exc:
            busy.append(exc)

    holder = threading.Thread(target=hold_the_only_connection)
    dry = threading.Thread(target=lease_from_a_dry_pool)
    drainer = threading.Thread(target=lambda: _drain(read_end))
    try:
        holder.start()
        assert leased.wait(10)
        dry.start()
        assert handler.emitting.wait(10)  # the report is on its way into the full pipe
        counted: list[int] = []

        def others() -> None:
            release.set()
            holder.join(10)  # its checkin
            with db.lease():
                counted.append(db.open_connections())

        other = threading.Thread(target=others)
        other.start()
        other.join(10)
        assert not holder.is_alive() and counted == [1], counted
        assert dry.is_alive()  # still stuck on the stream
    finally:
        release.set()
        drainer.start()
        dry.join(10)
        holder.join(10)
        logger.removeHandler(handler)
        stream.close()
        drainer.join(10)
        os.close(read_end)
    assert len(busy) == 1
    db.close()
