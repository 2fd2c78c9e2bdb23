"""A store whose connection pool runs dry names, in its log, the threads holding the
connections and where each is, so a holder that never gives one back can be found."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

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
    start = threading.Barrier(6)
    peak: list[int] = []

    def read() -> None:
        start.wait(10)
        for _ in range(20):
            db.with_conn(lambda conn: peak.append(db.open_connections()))

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert max(peak) <= 2 and db.open_connections() <= 2, max(peak)
    db.close()
