"""The Python a writer runs inside the writer's baton, counted per hold (`hold_calls`): each
call there is interpreter time with every queued writer waiting on the baton, and a chance for
the interpreter to switch away with the baton held (docs/performance.md, baton)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hold_calls import hold_calls

from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions

pytestmark = pytest.mark.timeout(60)

EVENT_HASH = "<string>:__hash__"
"""A change event's hash: its dataclass's generated `__hash__`, a Python call."""


def test_a_change_is_hashed_once_per_emit(tmp_path: Path) -> None:
    """`Tx.emit` finds a repeat and places a new change with one dictionary lookup: a rename
    (one change) hashes it once inside its hold, and a batch of two renames of one Session
    (the same change twice, then the batch's own emit of each) four times in its one hold —
    one lookup per emit, where a `get` then a store was two for each new change."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        (sid,) = _sessions(store, 1)
        with hold_calls(store.db) as got:
            store.sessions.update_title(WS, sid, "one")
        assert got.holds == 1
        assert got.of(EVENT_HASH) == 1, got.calls
        with hold_calls(store.db) as got, store.db.write_batch():
            store.sessions.update_title(WS, sid, "two")
            store.sessions.update_title(WS, sid, "three")
        assert got.holds == 1
        assert got.of(EVENT_HASH) == 4, got.calls  # two writes' emits, the batch's two
        assert store.sessions.get_session(WS, sid).title == "three"
    finally:
        store.close()
