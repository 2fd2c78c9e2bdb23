"""The Python a writer runs inside the writer's baton, counted per hold (`hold_calls`): each
call there is interpreter time with every queued writer waiting on the baton, and a chance for
the interpreter to switch away with the baton held (docs/performance.md, baton)."""

from __future__ import annotations

import threading
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


def test_a_batch_takes_the_baton_at_its_first_write(tmp_path: Path) -> None:
    """What a batch's block runs before its first write (a Turn's queued writes: the actor's
    and the store method's preparation of the first) holds no writer waiting: the baton is
    free until that write, this thread's from it to the block's end; a block that writes
    nothing takes it not at all. Its writes still land as one member, one COMMIT."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        a, b = _sessions(store, 2)
        me = threading.get_ident()
        commits = store.db.write_stats.commits
        with hold_calls(store.db) as got:
            with store.db.write_batch():
                assert store.db._fifo.owner is None  # nothing written yet
                store.sessions.update_title(WS, a, "one")
                assert store.db._fifo.owner == me
                store.sessions.update_title(WS, b, "two")
            with store.db.write_batch():
                assert store.db._fifo.owner is None
        assert got.holds == 1
        assert store.db.write_stats.commits - commits == 1
        assert [store.sessions.get_session(WS, s).title for s in (a, b)] == ["one", "two"]
    finally:
        store.close()


def test_a_claim_makes_its_ids_and_values_before_the_baton(tmp_path: Path) -> None:
    """A submit's claim makes its Turn's and Message's ids (`uuid4`) and reads its enum values
    before it takes the baton: none of them inside its hold; the claim is the same (its Turn
    under the id it was asked for, a replay answered with the claimed one)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        (sid,) = _sessions(store, 1)
        with hold_calls(store.db) as got:
            turn, created = store.turns.claim_submit(WS, sid, "req-1", "hello", "turn-1")
        assert (turn.turn_id, created, got.holds) == ("turn-1", True, 1)
        assert got.of("turns.py:body") == 1, got.calls  # not vacuous: its body ran there
        assert got.of("uuid.py:uuid4") == 0, got.calls
        assert got.of("enum.py:__get__") == 0, got.calls
        assert store.turns.claim_submit(WS, sid, "req-1", "hello") == (turn, False)
    finally:
        store.close()
