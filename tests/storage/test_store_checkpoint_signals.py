"""The background checkpointer is asked to run when the WAL crosses the mark, and then again
only after the WAL grew by `checkpoint_retry_pages` more or restarted: a reader that keeps a
checkpoint from finishing (so the WAL does not restart) no longer makes every COMMIT past the
mark ask for one."""

from __future__ import annotations

from pathlib import Path

import apsw

from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions


def _wal_frames(store: Store) -> int:
    """Frames in the WAL now (a PASSIVE checkpoint's answer, on a connection of its own)."""
    probe = apsw.Connection(store.db.path)
    try:
        return int(probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])
    finally:
        probe.close()


def test_the_checkpointer_is_asked_at_the_mark_then_per_retry_step_or_restart(
    tmp_path: Path,
) -> None:
    """The rule, on the WAL hook's own numbers (frames in the WAL after each COMMIT)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        db = store.db
        db.checkpoint_pages, db.checkpoint_retry_pages = 20, 50
        asked = []
        for frames in (5, 19, 20, 25, 60, 69, 70, 71, 119, 120, 3, 19, 22, 30, 72):
            before = db.write_stats.checkpoint_signals
            db._wal_grew(None, "main", frames)  # type: ignore[arg-type]
            if db.write_stats.checkpoint_signals > before:
                asked.append(frames)
        # The mark; 50 more; 50 more; the WAL restarted (3): the mark again; 50 more.
        assert asked == [20, 70, 120, 22, 72]
    finally:
        store.close()


def test_a_reader_holding_the_wal_does_not_make_every_commit_ask(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        _sessions(store, 1)
        db = store.db
        db.checkpoint_pages, db.checkpoint_retry_pages = 20, 60
        reader = apsw.Connection(db.path)  # an open reader: the WAL cannot restart
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sessions").fetchall()
        commits = 0
        try:
            while _wal_frames(store) < 400:
                store.sessions.update_title(WS, "s0", f"title {commits}")
                commits += 1
            frames = _wal_frames(store)
            signals = db.write_stats.checkpoint_signals
        finally:
            reader.close()
        assert 1 <= signals <= (frames - 20) // 60 + 2, (signals, frames, commits)
        assert signals < commits / 3, (signals, commits)
    finally:
        store.close()
