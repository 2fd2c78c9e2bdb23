"""One writer at a time inside the daemon: one writer, no busy-handler sleeps.

The store's writers take turns on its writer lock, handed over as soon as a COMMIT returns;
SQLite's busy handler, with its backoff sleeps of up to 100 ms, is left for other processes.
Counted by the store's busy handler, never timed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import apsw
import pytest

from domain.errors import StoreBusy
from storage.store import Store

WS = "ws-writer"


def _sessions(store: Store, n: int) -> list[str]:
    ids = [f"s{i}" for i in range(n)]
    for sid in ids:
        store.sessions.create_session(
            WS, session_id=sid, provider="p", title=sid, cwd="/", settings={}
        )
    return ids


def test_in_process_writers_take_turns_without_busy_sleeps(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        ids = _sessions(store, 8)
        errors: list[BaseException] = []
        start = threading.Barrier(len(ids))

        def write(sid: str) -> None:
            start.wait()
            try:
                for i in range(60):
                    store.sessions.update_title(WS, sid, f"{sid} {i}")
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(sid,)) for sid in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert [store.sessions.get_session(WS, sid).title for sid in ids] == [
            f"{s} 59" for s in ids
        ]
        assert store.db.busy_waits.sleeps == 0  # 480 contended writes, none polled SQLite's lock
    finally:
        store.close()


def test_a_writer_kept_waiting_past_the_busy_timeout_gets_store_busy(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3", busy_timeout_ms=200)
    try:
        (sid,) = _sessions(store, 1)
        inside, release = threading.Event(), threading.Event()

        def hold() -> None:
            with store.db.write(WS):
                inside.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        assert inside.wait(10)
        with pytest.raises(StoreBusy) as caught:
            store.sessions.update_title(WS, sid, "blocked")
        assert caught.value.retryable
        release.set()
        holder.join()
        assert store.sessions.update_title(WS, sid, "after").title == "after"
    finally:
        store.close()


def test_another_processs_write_lock_is_waited_out_by_the_busy_handler(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store.open(path, busy_timeout_ms=5_000)
    other = apsw.Connection(str(path))
    try:
        (sid,) = _sessions(store, 1)
        other.execute("BEGIN IMMEDIATE")
        timer = threading.Timer(0.3, lambda: other.execute("COMMIT"))
        timer.start()
        assert store.sessions.update_title(WS, sid, "waited").title == "waited"
        timer.join()
        assert store.db.busy_waits.sleeps > 0
    finally:
        other.close()
        store.close()
