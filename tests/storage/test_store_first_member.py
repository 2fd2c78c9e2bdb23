"""A group's first write runs without a savepoint of its own (two SQLite calls fewer inside the
writer baton): undoing it is the ROLLBACK of the transaction it is alone in, and a lazy one
(`durable=False`) leaves the next durable write fsync'd whichever way it failed (the writer
stays at `synchronous=NORMAL`; the fsync follows a durable COMMIT: tests/storage/
test_store_wal_sync.py counts it with strace)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from domain.errors import SessionNotFound
from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions


def _synchronous(store: Store) -> int:
    return int(store.db._writer_connection().execute("PRAGMA synchronous").fetchone()[0])


def test_a_lone_write_that_raises_leaves_nothing_and_no_open_transaction(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    observer = apsw.Connection(str(path))
    try:
        (sid,) = _sessions(store, 1)
        before = store.db.write_stats.snapshot()
        with pytest.raises(SessionNotFound), store.db.write(WS) as tx:
            tx.execute("UPDATE sessions SET title = 'half' WHERE session_id = ?", (sid,))
            raise SessionNotFound("deliberate failure after a write")
        after = store.db.write_stats.snapshot()
        assert after["rolled_back"] - before["rolled_back"] == 1
        assert after["group_failures"] == before["group_failures"]
        assert after["commits"] == before["commits"]
        assert store.db._writer_connection().getautocommit()  # nothing left open
        assert observer.execute("SELECT title FROM sessions").fetchall() == [(sid,)]
        # The next write is its own group and lands.
        assert store.sessions.update_title(WS, sid, "after").title == "after"
        assert observer.execute("SELECT title FROM sessions").fetchall() == [("after",)]
    finally:
        observer.close()
        store.close()


def test_a_rename_of_a_missing_or_deleted_session_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sid, gone = _sessions(store, 2)
        store.sessions.delete_session(WS, gone)
        for target in (gone, "no-such-session"):
            with pytest.raises(SessionNotFound):
                store.sessions.update_title(WS, target, "x")
            with pytest.raises(SessionNotFound):
                store.sessions.set_pinned(WS, target, True)
        assert store.sessions.get_session(WS, sid).title == sid
        assert store.sessions.set_pinned(WS, sid, True).pinned
    finally:
        store.close()


@pytest.mark.parametrize("aborted", [False, True], ids=["raised", "transaction-aborted"])
def test_a_lazy_write_that_fails_leaves_the_writer_at_fsynced_commits(
    tmp_path: Path, aborted: bool
) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        (sid,) = _sessions(store, 1)
        assert _synchronous(store) == 1  # NORMAL: a durable COMMIT's fsync is the store's own
        with pytest.raises(SessionNotFound), store.db.write(WS, durable=False) as tx:
            tx.execute("UPDATE sessions SET title = 'lazy' WHERE session_id = ?", (sid,))
            if aborted:
                # What SQLite does on a full disk or an I/O error: the transaction is gone.
                tx.execute("ROLLBACK")
            raise SessionNotFound("deliberate failure")
        assert _synchronous(store) == 1
        assert store.sessions.get_session(WS, sid).title == sid
        before = store.db.write_stats.snapshot()
        store.sessions.update_title(WS, sid, "durable")
        after = store.db.write_stats.snapshot()
        assert after["commits"] - before["commits"] == 1  # fsync'd, not lazy
        assert after["lazy_commits"] == before["lazy_commits"]
    finally:
        store.close()
