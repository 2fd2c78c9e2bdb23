"""Group commit: writes queued behind one another share one fsync'd COMMIT.

Each write is a savepoint of the shared `BEGIN IMMEDIATE` transaction on the store's one
writer connection; a failing write rolls back its own savepoint alone; every member returns
only after the COMMIT that made it durable returned. Counted (`Database.write_stats`), never timed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from domain.errors import SessionNotFound, StoreBusy
from storage.base import Database
from storage.models import SessionChanged
from storage.store import Store

pytestmark = pytest.mark.timeout(60)

WS = "ws-group"


def _sessions(store: Store, n: int) -> list[str]:
    ids = [f"s{i}" for i in range(n)]
    for sid in ids:
        store.sessions.create_session(
            WS, session_id=sid, provider="p", title=sid, cwd="/", settings={}
        )
    return ids


def _wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def _queued(store: Store, n: int) -> Callable[[], bool]:
    return lambda: store.db._fifo.waiting == n


def _behind_a_held_write(store: Store, writers: list[Callable[[], None]]) -> list[BaseException]:
    """Hold one write open until every writer is queued behind it, then let them all run."""
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with store.db.write(WS) as tx:
                tx.execute("UPDATE sessions SET title = 'held' WHERE session_id = 's0'")
                inside.set()
                release.wait(20)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted by the caller
            errors.append(exc)

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted by the caller
            errors.append(exc)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(20)
    threads = [threading.Thread(target=run, args=(fn,)) for fn in writers]
    for t in threads:
        t.start()
    _wait_for(lambda: store.db._fifo.waiting == len(writers))
    release.set()
    for t in [holder, *threads]:
        t.join(20)
    return errors


def test_queued_writes_share_one_commit_and_each_returns_only_when_durable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    store.db.group_max_age_s = 60.0  # a slow machine must not split the group the test builds
    observer = apsw.Connection(str(path))
    seen_at_return: dict[str, str] = {}
    try:
        ids = _sessions(store, 9)
        before = store.db.write_stats.snapshot()

        def writer(sid: str) -> Callable[[], None]:
            def write() -> None:
                store.sessions.update_title(WS, sid, f"{sid} titled")
                # Acknowledged: another connection must already see it (it was committed).
                row = observer.execute(
                    "SELECT title FROM sessions WHERE workspace_id = ? AND session_id = ?",
                    (WS, sid),
                ).fetchone()
                seen_at_return[sid] = row[0]

            return write

        errors = _behind_a_held_write(store, [writer(sid) for sid in ids[1:]])
        assert errors == []
        after = store.db.write_stats.snapshot()
        assert after["transactions"] - before["transactions"] == 9  # the held write + 8
        assert after["commits"] - before["commits"] == 1  # one fsync'd COMMIT for all nine
        assert after["largest_group"] == 9
        assert seen_at_return == {sid: f"{sid} titled" for sid in ids[1:]}
        assert store.sessions.get_session(WS, "s0").title == "held"
    finally:
        observer.close()
        store.close()


def test_a_failing_write_rolls_back_its_own_savepoint_and_the_others_land(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0
    try:
        ids = _sessions(store, 4)
        before = store.db.write_stats.snapshot()

        def failing() -> None:
            # Writes a row, then fails: its savepoint alone is rolled back.
            with store.db.write(WS) as tx:
                tx.execute("UPDATE sessions SET title = 'half' WHERE session_id = 's2'")
                raise SessionNotFound("deliberate failure after a write")

        writers = [
            lambda: store.sessions.update_title(WS, "s1", "first landed"),
            failing,
            lambda: store.sessions.update_title(WS, "s3", "third landed"),
        ]
        errors = _behind_a_held_write(store, writers)
        assert [type(e) for e in errors] == [SessionNotFound]
        after = store.db.write_stats.snapshot()
        assert after["commits"] - before["commits"] == 1
        assert after["transactions"] - before["transactions"] == 3  # held, first, third
        assert after["rolled_back"] - before["rolled_back"] == 1
        titles = [store.sessions.get_session(WS, sid).title for sid in ids]
        assert titles == ["held", "first landed", "s2", "third landed"]
    finally:
        store.close()


def test_a_failed_commit_fails_every_member_and_writes_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0
    try:
        ids = _sessions(store, 3)
        refuse = threading.Event()
        store.db._writer_connection().set_commit_hook(lambda: refuse.is_set())
        refuse.set()  # SQLite turns the next COMMIT into a rollback
        errors = _behind_a_held_write(
            store,
            [
                lambda: store.sessions.update_title(WS, "s1", "lost 1"),
                lambda: store.sessions.update_title(WS, "s2", "lost 2"),
            ],
        )
        refuse.clear()
        # Every member of the group — the held write and both queued ones — is told, with a
        # retryable error, and none of their writes exists.
        assert [type(e) for e in errors] == [StoreBusy] * 3
        assert all(e.retryable for e in errors if isinstance(e, StoreBusy))
        assert store.db.write_stats.group_failures == 1
        assert [store.sessions.get_session(WS, sid).title for sid in ids] == ["s0", "s1", "s2"]
        assert store.sessions.update_title(WS, "s1", "after").title == "after"
    finally:
        store.close()


def test_a_write_inside_a_write_of_the_same_thread_is_refused(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        (sid,) = _sessions(store, 1)
        with pytest.raises(apsw.SQLError), store.db.write(WS):
            store.sessions.update_title(WS, sid, "nested")
        assert store.sessions.update_title(WS, sid, "after").title == "after"
    finally:
        store.close()


def test_the_wal_is_checkpointed_off_the_write_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No COMMIT copies the WAL into the database (SQLite's auto-checkpoint would, inside the
    write that crossed the mark, with every queued writer waiting): the writer's WAL hook only
    signals, and the background checkpointer does it on its own connection."""
    path = tmp_path / "store.sqlite3"
    wal = Path(f"{path}-wal")

    def frames() -> int:
        return max(0, (wal.stat().st_size - 32) // (4096 + 24))

    # First with the checkpointer held back: the WAL grows far past the mark, so no write
    # checkpointed (and restarted the WAL) inline.
    paused = threading.Event()
    monkeypatch.setattr(Database, "_checkpoint_loop", lambda self: paused.set())
    store = Store.open(path)
    store.db.checkpoint_pages = 8
    try:
        ids = _sessions(store, 2)
        for i in range(40):
            store.sessions.update_title(WS, ids[i % 2], "x" * 3000 + str(i))
        assert paused.is_set()  # the hook asked for a checkpoint
        assert frames() > 3 * store.db.checkpoint_pages
        assert store.db.write_stats.checkpoints == 0
    finally:
        store.close()
    monkeypatch.undo()
    # Then with it: the background pass runs and counts.
    store = Store.open(path)
    store.db.checkpoint_pages = 8
    try:
        for i in range(40):
            store.sessions.update_title(WS, "s1", "y" * 3000 + str(i))
        _wait_for(lambda: store.db.write_stats.checkpoints >= 1)
        assert store.sessions.get_session(WS, "s1").title.endswith("39")
    finally:
        store.close()


def test_a_batch_of_writes_is_one_commit_and_a_failing_one_rolls_back_alone(
    tmp_path: Path,
) -> None:
    """`write_batch` (a Session actor's queued Turn writes): nested savepoints of
    one member, one COMMIT; the failing write alone is undone; events only after the COMMIT."""
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    observer = apsw.Connection(str(path))
    events: list[object] = []
    store.db.subscribe(events.append)
    try:
        ids = _sessions(store, 3)
        events.clear()
        before = store.db.write_stats.snapshot()
        with store.db.write_batch():
            store.sessions.update_title(WS, "s0", "one")
            with pytest.raises(SessionNotFound), store.db.write(WS) as tx:
                tx.execute("UPDATE sessions SET title = 'half' WHERE session_id = 's1'")
                raise SessionNotFound("deliberate failure after a write")
            store.sessions.update_title(WS, "s2", "three")
            # Not durable yet, not published yet: nothing else sees the batch.
            seen = observer.execute("SELECT title FROM sessions ORDER BY session_id").fetchall()
            assert [r[0] for r in seen] == ids
            assert events == []
        after = store.db.write_stats.snapshot()
        assert after["commits"] - before["commits"] == 1
        assert after["batched"] - before["batched"] == 2
        assert after["rolled_back"] - before["rolled_back"] == 1
        seen = observer.execute("SELECT title FROM sessions ORDER BY session_id").fetchall()
        assert [r[0] for r in seen] == ["one", "s1", "three"]
        assert len(events) >= 2
    finally:
        observer.close()
        store.close()


def test_a_batch_whose_commit_fails_writes_nothing_and_says_so(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        ids = _sessions(store, 2)
        refuse = threading.Event()
        store.db._writer_connection().set_commit_hook(lambda: refuse.is_set())
        refuse.set()
        with pytest.raises(StoreBusy) as caught, store.db.write_batch():
            store.sessions.update_title(WS, "s0", "lost 0")
            store.sessions.update_title(WS, "s1", "lost 1")
        refuse.clear()
        assert caught.value.retryable
        assert [store.sessions.get_session(WS, sid).title for sid in ids] == ids
        assert store.sessions.update_title(WS, "s0", "after").title == "after"
    finally:
        store.close()


def test_queued_writers_get_the_baton_in_arrival_order(tmp_path: Path) -> None:
    """One waiter woken per hand-off, first come first served (no writer overtaken)."""
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0
    try:
        ids = _sessions(store, 8)
        order: list[str] = []
        inside, release = threading.Event(), threading.Event()

        def hold() -> None:
            with store.db.write(WS):
                inside.set()
                release.wait(20)

        def write(sid: str) -> None:
            with store.db.write(WS) as tx:
                order.append(sid)
                tx.execute("UPDATE sessions SET title = ? WHERE session_id = ?", (sid, sid))

        holder = threading.Thread(target=hold)
        holder.start()
        assert inside.wait(20)
        threads = []
        for n, sid in enumerate(ids):
            t = threading.Thread(target=write, args=(sid,))
            t.start()
            threads.append(t)
            _wait_for(_queued(store, n + 1))  # queued in this order
        release.set()
        for t in [holder, *threads]:
            t.join(20)
        assert order == ids
    finally:
        store.close()


def _body_order(store: Store, queued: list[tuple[str, bool, float]]) -> list[str]:
    """Hold one write, queue each `(name, background, pause before the next)` writer behind
    it in that order, release, and return the order their bodies ran in."""
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def hold() -> None:
        with store.db.write(WS):
            inside.set()
            release.wait(20)

    def write(name: str, background: bool) -> None:
        with contextlib.ExitStack() as stack:
            if background:
                stack.enter_context(store.db.background())
            with store.db.write(WS):
                order.append(name)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(20)
    threads = []
    for name, background, pause in queued:
        t = threading.Thread(target=write, args=(name, background))
        t.start()
        threads.append(t)
        _wait_for(_queued(store, len(threads)))
        time.sleep(pause)
    release.set()
    for t in [holder, *threads]:
        t.join(20)
    return order


def test_a_clients_write_goes_ahead_of_queued_background_writes(tmp_path: Path) -> None:
    """A fork saga's later steps are background writes: a client's rename queued after them
    runs first, and the background ones keep their own order."""
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0
    # Not the aging rule's case (its own test below): a slow minute queuing the four must not
    # let the first background writer's wait pass its bound.
    store.db._fifo.background_max_wait_s = 60.0
    try:
        _sessions(store, 1)
        order = _body_order(
            store,
            [("bg1", True, 0.0), ("bg2", True, 0.0), ("fg1", False, 0.0), ("fg2", False, 0.0)],
        )
        assert order == ["fg1", "fg2", "bg1", "bg2"]
    finally:
        store.close()


def test_a_background_write_is_overtaken_for_a_bounded_time_only(tmp_path: Path) -> None:
    """Once the first background writer has waited `background_max_wait_s`, it goes next:
    background writes are delayed, never starved by a stream of client writes."""
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0
    store.db._fifo.background_max_wait_s = 0.2
    try:
        _sessions(store, 1)
        order = _body_order(store, [("bg", True, 0.3), ("fg1", False, 0.0), ("fg2", False, 0.0)])
        assert order == ["bg", "fg1", "fg2"]
    finally:
        store.close()


def test_a_lazy_write_commits_without_its_own_fsync_and_never_carries_a_durable_one(
    tmp_path: Path,
) -> None:
    """`write(durable=False)` that opens a group is committed alone without the WAL's
    fsync a durable group's COMMIT is followed by (in the WAL, seen by every reader:
    `lazy_commits`). A durable write queued behind it does not join it (its own fsync'd
    COMMIT); a lazy write that finds a durable group open joins it. The fsyncs themselves
    are counted with strace: tests/storage/test_store_wal_sync.py, and through a real daemon
    tests/bench/test_fork_syscalls."""
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    store.db.group_max_age_s = 60.0
    observer = apsw.Connection(str(path))
    try:
        _sessions(store, 3)
        before = store.db.write_stats.snapshot()
        with store.db.write(WS, durable=False) as tx:
            tx.execute("UPDATE sessions SET title = 'lazy' WHERE session_id = 's1'")
        after = store.db.write_stats.snapshot()
        assert after["lazy_commits"] - before["lazy_commits"] == 1
        assert after["commits"] == before["commits"]
        seen = observer.execute("SELECT title FROM sessions WHERE session_id = 's1'").fetchone()
        assert seen == ("lazy",)

        # A durable write queued behind a held lazy one gets a COMMIT of its own.
        inside, release = threading.Event(), threading.Event()

        def hold_lazily() -> None:
            with store.db.write(WS, durable=False) as tx:
                tx.execute("UPDATE sessions SET title = 'held lazily' WHERE session_id = 's0'")
                inside.set()
                release.wait(20)

        holder = threading.Thread(target=hold_lazily)
        before = store.db.write_stats.snapshot()
        holder.start()
        assert inside.wait(20)
        durable = threading.Thread(target=lambda: store.sessions.update_title(WS, "s2", "d"))
        durable.start()
        _wait_for(_queued(store, 1))
        release.set()
        for t in (holder, durable):
            t.join(20)
        after = store.db.write_stats.snapshot()
        assert after["lazy_commits"] - before["lazy_commits"] == 1
        assert after["commits"] - before["commits"] == 1

        # A lazy write queued behind a held durable one joins its fsync'd COMMIT.
        def lazy() -> None:
            with store.db.write(WS, durable=False) as tx:
                tx.execute("UPDATE sessions SET title = 'lazy too' WHERE session_id = 's2'")

        before = store.db.write_stats.snapshot()
        assert _behind_a_held_write(store, [lazy]) == []
        after = store.db.write_stats.snapshot()
        assert after["commits"] - before["commits"] == 1
        assert after["lazy_commits"] == before["lazy_commits"]
        assert store.sessions.get_session(WS, "s2").title == "lazy too"
    finally:
        observer.close()
        store.close()


def test_a_lazy_writes_events_wait_for_the_next_fsynced_commit(tmp_path: Path) -> None:
    """A lazy COMMIT's change events are held: a subscriber hears of the write only after a
    later fsync'd COMMIT (of any writer) made it durable, ahead of that COMMIT's own events;
    a lazy write that joins a durable group is published with it."""
    store = Store.open(tmp_path / "store.sqlite3")
    store.db.group_max_age_s = 60.0
    heard: list[SessionChanged] = []

    def hear(event: object) -> None:
        if isinstance(event, SessionChanged):
            heard.append(event)

    try:
        _sessions(store, 3)
        store.db.subscribe(hear)
        with store.db.write(WS, durable=False) as tx:
            tx.execute("UPDATE sessions SET title = 'lazy' WHERE session_id = 's1'")
            tx.emit(SessionChanged(WS, "s1"))
        assert heard == []  # in the WAL, not yet on the disk: nobody is told
        with store.db.write(WS, durable=False) as tx:
            tx.emit(SessionChanged(WS, "s0"))
        assert heard == []
        store.sessions.update_title(WS, "s2", "durable")  # fsync'd: covers both lazy COMMITs
        assert [e.session_id for e in heard] == ["s1", "s0", "s2"]

        # Joining a durable group, a lazy write is fsync'd with it and heard with it.
        heard.clear()

        def lazy() -> None:
            with store.db.write(WS, durable=False) as tx:
                tx.emit(SessionChanged(WS, "s1"))

        assert _behind_a_held_write(store, [lazy]) == []
        assert "s1" in [e.session_id for e in heard]
    finally:
        store.close()


def test_events_after_tells_subscribers_at_the_end_of_the_block_in_commit_order(
    tmp_path: Path,
) -> None:
    """`events_after`: this thread's durable writes in the block are heard when the block
    ends (after each COMMIT returned), in commit order, the lazy writes' among them once an
    fsync covered them; another thread's writes meanwhile are heard at once; an exception in
    the block still delivers what was committed."""
    store = Store.open(tmp_path / "store.sqlite3")
    heard: list[str] = []

    def hear(event: object) -> None:
        if isinstance(event, SessionChanged):
            heard.append(event.session_id)

    try:
        _sessions(store, 4)
        store.db.subscribe(hear)
        with store.db.events_after():
            with store.db.write(WS, durable=False) as tx:
                tx.emit(SessionChanged(WS, "s0"))
            store.sessions.update_title(WS, "s1", "durable")
            with store.db.events_after():  # the same block
                store.sessions.update_title(WS, "s2", "durable")
            assert heard == []  # durable, but the block has not ended
            other = threading.Thread(target=lambda: store.sessions.update_title(WS, "s3", "x"))
            other.start()
            other.join(20)
            assert heard == ["s3"]  # another thread's write is not held
        assert heard == ["s3", "s0", "s1", "s2"]

        heard.clear()
        with pytest.raises(RuntimeError), store.db.events_after():
            store.sessions.update_title(WS, "s1", "again")
            raise RuntimeError("after the write")
        assert heard == ["s1"]
        store.sessions.update_title(WS, "s2", "outside")  # no block: heard at once
        assert heard == ["s1", "s2"]
    finally:
        store.close()
