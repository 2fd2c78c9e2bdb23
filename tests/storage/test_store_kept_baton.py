"""A kept baton (`Database.write_turn`, `write(keep=True)`): a pair of writes of one thread that
follow at once, each its own transaction committed before it returns, with no queue between.

Counted and ordered, never timed: a writer queued meanwhile runs after the pair, not between;
the first write is seen by another connection (committed) before the second begins; a kept
baton the block does not use is handed on at its end, an exception included; a kept write
that joined an open durable group ends it at once (never left open for others)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from storage.store import Store

pytestmark = pytest.mark.timeout(60)

WS = "ws-kept"


def _store(tmp_path: Path, n: int = 3) -> Store:
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0  # a slow machine must not split a group a test builds
    for i in range(n):
        store.sessions.create_session(
            WS, session_id=f"s{i}", provider="p", title=f"s{i}", cwd="/", settings={}
        )
    return store


def _wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def _title(conn: apsw.Connection, sid: str) -> str:
    row = conn.execute("SELECT title FROM sessions WHERE session_id = ?", (sid,)).fetchone()
    return str(row[0])


def test_a_kept_pair_runs_without_a_queued_writer_between_and_each_commits(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    observer = apsw.Connection(str(tmp_path / "store.sqlite3"))
    order: list[str] = []
    seen_between: list[str] = []
    queued = threading.Event()
    try:
        before = store.db.write_stats.snapshot()

        def other() -> None:
            with store.db.write(WS) as tx:
                order.append("other")
                tx.execute("UPDATE sessions SET title = 'other' WHERE session_id = 's2'")

        intruder = threading.Thread(target=other)
        with store.db.write_turn():
            with store.db.write(WS, durable=False, keep=True) as tx:
                order.append("first")
                tx.execute("UPDATE sessions SET title = 'first' WHERE session_id = 's0'")
                intruder.start()
                _wait_for(lambda: store.db._fifo.waiting == 1)
                queued.set()
            # Committed (in the WAL) before it returned: another connection reads it now,
            # with the baton still this thread's and the other writer still queued.
            seen_between.append(_title(observer, "s0"))
            assert store.db._fifo.owner == threading.get_ident()
            assert store.db._fifo.waiting == 1
            with store.db.write(WS) as tx:
                order.append("second")
                tx.execute("UPDATE sessions SET title = 'second' WHERE session_id = 's1'")
        intruder.join(20)
        assert queued.is_set()
        assert order == ["first", "second", "other"]
        assert seen_between == ["first"]
        after = store.db.write_stats.snapshot()
        assert after["transactions"] - before["transactions"] == 3
        assert after["lazy_commits"] - before["lazy_commits"] == 1  # the first, alone
        assert after["kept"] - before["kept"] == 1  # the second began on the kept baton
        # The second either committed alone or left its group open for the queued writer,
        # which it joined: one or two fsync'd COMMITs, never the first's among them.
        assert 1 <= after["commits"] - before["commits"] <= 2
        assert [_title(observer, s) for s in ("s0", "s1", "s2")] == ["first", "second", "other"]
        assert store.db._fifo.owner is None
    finally:
        observer.close()
        store.close()


def test_a_kept_baton_not_used_is_handed_on_at_the_blocks_end_even_on_an_error(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="after the kept write"), store.db.write_turn():
            with store.db.write(WS, durable=False, keep=True) as tx:
                tx.execute("UPDATE sessions SET title = 'kept' WHERE session_id = 's0'")
            assert store.db._fifo.owner == threading.get_ident()
            raise RuntimeError("after the kept write")
        assert store.db._fifo.owner is None
        # The store writes on, from any thread.
        done = threading.Thread(target=lambda: store.sessions.update_title(WS, "s1", "later"))
        done.start()
        done.join(20)
        assert store.sessions.get_session(WS, "s1").title == "later"
        assert store.sessions.get_session(WS, "s0").title == "kept"
    finally:
        store.close()


def test_a_kept_write_that_fails_hands_the_baton_on(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        with store.db.write_turn():
            with (
                pytest.raises(ValueError, match="body"),
                store.db.write(WS, durable=False, keep=True) as tx,
            ):
                tx.execute("UPDATE sessions SET title = 'lost' WHERE session_id = 's0'")
                raise ValueError("body")
            assert store.db._fifo.owner is None  # not kept: the write did not land
            store.sessions.update_title(WS, "s1", "taken again")
        assert store.db._fifo.owner is None
        assert store.sessions.get_session(WS, "s0").title == "s0"
        assert store.sessions.get_session(WS, "s1").title == "taken again"
    finally:
        store.close()


def _joined_pair(
    tmp_path: Path, queue_behind: bool
) -> tuple[list[str], list[bool], dict[str, int]]:
    """A durable write held open; a pair's `keep=True` lazy write queued behind it joins its
    group; with `queue_behind`, another writer queues behind the joined write meanwhile.
    What another connection saw between the pair's writes, whether the pair's thread held the
    baton there, and the write counters' deltas."""
    store = _store(tmp_path)
    observer = apsw.Connection(str(tmp_path / "store.sqlite3"))
    inside, release = threading.Event(), threading.Event()
    seen: list[str] = []
    holding: list[bool] = []
    try:

        def hold() -> None:
            with store.db.write(WS) as tx:
                tx.execute("UPDATE sessions SET title = 'held' WHERE session_id = 's2'")
                inside.set()
                release.wait(20)

        def late() -> None:
            store.sessions.update_title(WS, "s2", "late")

        def pair() -> None:
            with store.db.write_turn():
                with store.db.write(WS, durable=False, keep=True) as tx:
                    tx.execute("UPDATE sessions SET title = 'joined' WHERE session_id = 's0'")
                    if queue_behind:
                        threading.Thread(target=late).start()
                        _wait_for(lambda: store.db._fifo.waiting == 1)
                seen.append(_title(observer, "s0"))
                holding.append(store.db._fifo.owner == threading.get_ident())
                with store.db.write(WS) as tx:
                    tx.execute("UPDATE sessions SET title = 'after' WHERE session_id = 's1'")

        holder = threading.Thread(target=hold)
        holder.start()
        assert inside.wait(20)
        before = store.db.write_stats.snapshot()
        paired = threading.Thread(target=pair)
        paired.start()
        _wait_for(lambda: store.db._fifo.waiting == 1)
        release.set()
        for t in (holder, paired):
            t.join(20)
        _wait_for(lambda: store.db._fifo.owner is None and store.db._fifo.waiting == 0)
        after = store.db.write_stats.snapshot()
        return seen, holding, {k: after[k] - before[k] for k in after}
    finally:
        observer.close()
        store.close()


def test_a_keep_write_that_joined_an_open_group_keeps_the_baton_only_where_the_group_ends(
    tmp_path: Path,
) -> None:
    """A lazy write that finds a durable group open joins it as any member does, and returns
    only once that group's COMMIT returned — so what it wrote is committed before the next
    write of the pair begins (the crash matrix's cell between the two). With nobody queued
    behind it, it ends the group (as any member would) and keeps the baton; with a writer
    queued, the group stays open for that writer (never cut short by an fsync for the keep)
    and the baton goes back to the queue."""
    seen, holding, delta = _joined_pair(tmp_path / "alone", queue_behind=False)
    assert seen == ["joined"]
    assert holding == [True]
    assert delta["kept"] == 1
    assert delta["commits"] == 2  # the held group with the joined write; the second write
    assert delta["lazy_commits"] == 0

    seen, holding, delta = _joined_pair(tmp_path / "queued", queue_behind=True)
    assert seen == ["joined"]
    assert holding == [False]
    assert delta["kept"] == 0
    assert delta["transactions"] == 4
    assert delta["lazy_commits"] == 0


def test_keep_outside_a_write_turn_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, 1)
    try:
        with pytest.raises(ValueError, match="write_turn"), store.db.write(WS, keep=True):
            pass
        assert store.db._fifo.owner is None
    finally:
        store.close()
