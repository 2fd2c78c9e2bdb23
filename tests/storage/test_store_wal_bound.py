"""The WAL stays bounded under a write load that never pauses: the background checkpointer's
PASSIVE passes copy the frames, and past `wal_bound_pages` one pass holds the writer baton so
the next write starts the WAL again (without it the log grew for as long as the writers kept
coming: SQLite restarts a WAL only when a write begins with every frame copied)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import apsw

from storage.sqlite import JOURNAL_SIZE_LIMIT_BYTES
from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions

PAGE = 4096
FRAME = PAGE + 24


def test_the_wal_file_stays_bounded_while_writers_never_pause(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    try:
        db = store.db
        db.checkpoint_pages, db.checkpoint_retry_pages, db.wal_bound_pages = 50, 25, 200
        # Frames the writers appended in all (the WAL hook's length after each COMMIT; a
        # shorter length than the last one is a restart).
        seen = {"last": 0, "appended": 0, "longest": 0}
        inner = db._wal_grew

        def grew(conn: apsw.Connection, name: str, pages: int) -> int:
            last = seen["last"]
            seen["appended"] += pages - last if pages >= last else pages
            seen["last"] = pages
            seen["longest"] = max(seen["longest"], pages)
            return inner(conn, name, pages)

        db._wal_grew = grew  # type: ignore[method-assign]  # bound at the first write
        ids = _sessions(store, 2)
        target = 30 * db.wal_bound_pages
        stop = threading.Event()
        failures: list[BaseException] = []

        def write(sid: str) -> None:
            n = 0
            try:
                while not stop.is_set() and seen["appended"] < target:
                    store.sessions.update_title(WS, sid, f"{n:06d}" + "x" * 5000)
                    n += 1
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
            finally:
                stop.set()

        def read() -> None:
            while not stop.is_set():
                db.rows("SELECT session_id, title FROM sessions")

        threads = [threading.Thread(target=write, args=(sid,)) for sid in ids]
        threads.append(threading.Thread(target=read))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures
        assert seen["appended"] >= target
        wal_pages = (Path(f"{path}-wal").stat().st_size - 32) // FRAME
        stats = db.write_stats.snapshot()
        # The writers appended 30 bounds' worth of frames; the log restarted on the way, and
        # neither it nor its file ever held more than a few bounds (the slack: what the
        # writers add while the checkpointer's pass and its baton turn run).
        assert stats["wal_restarts"] >= 1, (stats, seen)
        assert seen["longest"] <= 4 * db.wal_bound_pages, (seen, stats)
        assert wal_pages <= 4 * db.wal_bound_pages, (wal_pages, seen, stats)
        # Every write is still there.
        assert all(store.sessions.get_session(WS, sid).title.endswith("x" * 5000) for sid in ids)
    finally:
        store.close()


HOLD_READ = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN")
conn.execute("SELECT count(*) FROM sessions").fetchall()  # a read snapshot: the WAL is pinned
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("COMMIT")
"""


def test_a_wal_a_long_reader_made_long_shrinks_once_it_restarts(tmp_path: Path) -> None:
    """Another process's read transaction (a backup, a `sqlite3` shell left open) keeps every
    checkpoint from finishing, so the WAL grows past its bound for as long as it lasts; once
    the log restarts, its file goes back to the limit instead of keeping that peak size on disk
    for the daemon's whole life."""
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    reader: subprocess.Popen[str] | None = None
    try:
        db = store.db
        (sid,) = _sessions(store, 1)
        reader = subprocess.Popen(
            [sys.executable, "-c", HOLD_READ, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None and reader.stdout.readline() == "held\n"
        wal = Path(f"{path}-wal")
        with db.write(WS) as tx:
            tx.execute("CREATE TABLE bulk(b BLOB)")
        limit = JOURNAL_SIZE_LIMIT_BYTES
        while wal.stat().st_size <= limit + (8 << 20):
            with db.write(WS) as tx:
                tx.execute("INSERT INTO bulk VALUES (randomblob(?))", (1 << 20,))
        assert reader.stdin is not None
        reader.stdin.close()
        assert reader.wait(30) == 0
        n = 0
        deadline = time.monotonic() + 60
        while wal.stat().st_size > limit:
            assert time.monotonic() < deadline, (wal.stat().st_size, db.write_stats.snapshot())
            store.sessions.update_title(WS, sid, f"title {n}")
            n += 1
        assert db.write_stats.snapshot()["wal_restarts"] >= 1
        # Every write is still there.
        assert store.sessions.get_session(WS, sid).title == f"title {n - 1}"
        assert db.rows("SELECT count(*) FROM bulk")[0][0] > limit >> 20
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        store.close()
