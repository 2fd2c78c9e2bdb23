"""A batch handed to the store as a callable (`Database.submit_batch`), and a Session actor's
queued Turn writes applied through it (`TurnWrites`): when the writer baton is busy, the
thread holding it runs the whole batch in its open group — no baton turn of the batch's own,
no hand-off — and the batch keeps `write_batch`'s laws: one member, one COMMIT, a caller that
returns only once that COMMIT returned, events only after it, a lost COMMIT that loses all of
it (and, for the Turn's queue, counts a loss: `TurnWrites.losses`).

Real threads and a real SQLite file; each test pins that the batch ran on the holder's thread
(`write_stats.combined`, `handoffs`), so each fails with the batch taking a baton turn of its
own (`write_batch` on the caller's thread).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import apsw
import pytest
from store_builders import WS, new_session

from actors.session_base import DurableWrite, SessionCore
from actors.turn_writes import TurnWrites
from domain.errors import StoreBusy
from storage.models import ChangeEvent
from storage.store import Store

pytestmark = pytest.mark.timeout(60)


def _wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.002)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store.open(tmp_path / "store.sqlite3")
    s.db.group_max_age_s = 60.0  # a slow machine must not split the group a test builds
    try:
        yield s
    finally:
        s.close()


def _behind_a_held_write(store: Store, caller: Callable[[], None]) -> tuple[int, int]:
    """Hold a write open until `caller`, on a thread of its own, is queued behind it, then let
    it end; returns (the holder's thread id, the caller's)."""
    inside, release = threading.Event(), threading.Event()
    idents: dict[str, int] = {}

    def hold() -> None:
        idents["holder"] = threading.get_ident()
        # A failed COMMIT fails the holder's own write as well.
        with pytest.raises(StoreBusy) if refusing.is_set() else _nothing(), store.db.write(WS):
            inside.set()
            release.wait(20)

    def call() -> None:
        idents["caller"] = threading.get_ident()
        caller()

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(20)
    t = threading.Thread(target=call)
    t.start()
    _wait_for(lambda: store.db._fifo.waiting == 1)
    release.set()
    for each in (holder, t):
        each.join(20)
        assert not each.is_alive()
    return idents["holder"], idents["caller"]


refusing = threading.Event()
"""Set by a test that makes SQLite turn the held group's COMMIT into a rollback."""


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _title(store: Store, sid: str) -> str:
    return store.sessions.get_session(WS, sid).title


def test_a_queued_batch_runs_in_the_holders_turn_and_returns_only_once_committed(
    store: Store, tmp_path: Path
) -> None:
    ids = [new_session(store, title=f"s{i}") for i in range(3)]
    observer = apsw.Connection(str(tmp_path / "store.sqlite3"))
    ran_on: list[int] = []
    heard: list[tuple[ChangeEvent, str]] = []
    seen: list[str] = []

    def listen(event: ChangeEvent) -> None:
        # Delivered only after the COMMIT: another connection already sees the batch.
        row = observer.execute(
            "SELECT title FROM sessions WHERE workspace_id = ? AND session_id = ?", (WS, ids[2])
        ).fetchone()
        heard.append((event, row[0]))

    def batch() -> str:
        ran_on.append(threading.get_ident())
        for i, sid in enumerate(ids):
            store.sessions.update_title(WS, sid, f"batched {i}")
        return "done"

    def caller() -> None:
        assert store.db.submit_batch(batch) == "done"
        seen.extend(
            str(r[0])
            for r in observer.execute(
                "SELECT title FROM sessions WHERE workspace_id = ? ORDER BY title", (WS,)
            ).fetchall()
        )

    unsubscribe = store.db.subscribe(listen)
    try:
        before = store.db.write_stats.snapshot()
        holder, caller_ident = _behind_a_held_write(store, caller)
        after = store.db.write_stats.snapshot()
    finally:
        unsubscribe()
        observer.close()
    assert ran_on == [holder] and holder != caller_ident  # no baton turn of its own
    assert after["combined"] - before["combined"] == 1
    assert after["handoffs"] - before["handoffs"] == 0
    assert after["commits"] - before["commits"] == 1  # the holder's write and the batch
    assert after["batched"] - before["batched"] == 3
    assert seen == ["batched 0", "batched 1", "batched 2"]  # committed when it returned
    assert heard and all(title == "batched 2" for _, title in heard)


def test_a_queued_batch_whose_commit_is_lost_raises_and_leaves_nothing(store: Store) -> None:
    ids = [new_session(store, title=f"s{i}") for i in range(2)]
    ran_on: list[int] = []
    raised: list[BaseException] = []
    heard: list[ChangeEvent] = []

    def batch() -> None:
        ran_on.append(threading.get_ident())
        for sid in ids:
            store.sessions.update_title(WS, sid, "lost")

    def caller() -> None:
        try:
            store.db.submit_batch(batch)
        except StoreBusy as exc:
            raised.append(exc)

    store.db._writer_connection().set_commit_hook(lambda: refusing.is_set())
    unsubscribe = store.db.subscribe(heard.append)
    refusing.set()
    try:
        before = store.db.write_stats.snapshot()
        holder, _ = _behind_a_held_write(store, caller)
        after = store.db.write_stats.snapshot()
    finally:
        refusing.clear()
        unsubscribe()
    assert ran_on == [holder]
    assert after["combined"] - before["combined"] == 1
    assert len(raised) == 1 and raised[0].retryable
    assert [_title(store, sid) for sid in ids] == ["s0", "s1"]
    assert heard == []


class _Timeouts:
    store_retry_limit_s = 60.0


class _Pool:
    def __init__(self) -> None:
        self.retries: list[float] = []

    def call_later(self, delay: float, fn: Callable[[], None]) -> object:
        self.retries.append(delay)  # the retry is only counted: the test drains by hand
        return self


class _Ctx:
    def __init__(self) -> None:
        self.timeouts = _Timeouts()
        self.actor_pool = _Pool()


class _Core:
    """What `TurnWrites` uses of its Session actor: the real store, a retry pool that
    records, no actor."""

    def __init__(self, store: Store) -> None:
        self.session_store = store
        self.ctx = _Ctx()
        self.key = "ws/s"
        self.actor_ref = None


def _queue(store: Store) -> tuple[TurnWrites, _Core]:
    core = _Core(store)
    writes = TurnWrites(cast(SessionCore, core), give_up=lambda item, exc: None)
    return writes, core


def test_a_turns_queued_writes_land_as_one_batch_run_by_the_baton_holder(
    store: Store, tmp_path: Path
) -> None:
    ids = [new_session(store, title=f"s{i}") for i in range(3)]
    writes, _ = _queue(store)
    observer = apsw.Connection(str(tmp_path / "store.sqlite3"))
    ran_on: list[int] = []
    landed: list[tuple[str, str]] = []

    def item(i: int) -> DurableWrite:
        def apply() -> None:
            ran_on.append(threading.get_ident())
            store.sessions.update_title(WS, ids[i], f"turn write {i}")

        def on_landed() -> None:
            # Landed only once the batch's COMMIT returned: another connection sees it.
            row = observer.execute(
                "SELECT title FROM sessions WHERE workspace_id = ? AND session_id = ?",
                (WS, ids[i]),
            ).fetchone()
            landed.append((f"turn write {i}", row[0]))

        return DurableWrite("t1", f"write {i}", apply, landed=on_landed)

    writes.hold = True  # the burst: queued, applied together when it ends
    for i in range(3):
        writes.enqueue(item(i))
    writes.hold = False
    try:
        before = store.db.write_stats.snapshot()
        holder, caller = _behind_a_held_write(store, writes.drain)
        after = store.db.write_stats.snapshot()
    finally:
        observer.close()
    assert set(ran_on) == {holder} and holder != caller
    assert after["combined"] - before["combined"] == 1
    assert after["handoffs"] - before["handoffs"] == 0
    assert after["batched"] - before["batched"] == 3
    assert landed == [(f"turn write {i}", f"turn write {i}") for i in range(3)]
    assert len(writes) == 0 and writes.losses == 0


def test_a_turns_batch_lost_at_its_commit_counts_a_loss_and_stays_queued(store: Store) -> None:
    sid = new_session(store, title="s0")
    writes, core = _queue(store)
    ran_on: list[int] = []
    answers: list[object] = []

    def apply() -> None:
        ran_on.append(threading.get_ident())
        store.sessions.update_title(WS, sid, "lost")

    writes.hold = True
    for n in range(2):
        writes.enqueue(DurableWrite("t1", f"write {n}", apply, then=answers.append))
    writes.hold = False
    store.db._writer_connection().set_commit_hook(lambda: refusing.is_set())
    refusing.set()
    try:
        holder, _ = _behind_a_held_write(store, writes.drain)
    finally:
        refusing.clear()
    assert set(ran_on) == {holder}
    # Lost: none of it exists, the settlement's image is no longer trusted, and the queue
    # stalls at its head, a retry scheduled.
    assert writes.losses == 1
    assert _title(store, sid) == "s0"
    assert len(writes) == 2 and core.ctx.actor_pool.retries
    assert len(answers) == 1 and isinstance(answers[0], StoreBusy)
    writes.retry()  # the store takes writes again: both land, in one batch, in order
    assert len(writes) == 0 and _title(store, sid) == "lost"
