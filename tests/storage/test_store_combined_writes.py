"""A true group commit (`Database.submit_write`): a writer hands its body to the store, and the
thread holding the writer baton runs the queued bodies in its open group — each in its own
savepoint with its fence checked inside it — commits once and wakes each caller once.

Real threads and a real SQLite file; every test also pins that the queued bodies ran on the
holder's thread (`write_stats.combined`), so each fails if the bodies ran on their callers'.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn

from domain.errors import ForkInProgress, StoreBusy
from storage.models import ChangeEvent, ForkPrepareRequest
from storage.sqlite import Tx
from storage.store import Store

pytestmark = pytest.mark.timeout(60)

Outcome = Any  # a caller's result, or the exception it raised


def _wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.002)


def _sessions(store: Store, n: int) -> list[str]:
    return [new_session(store, title=f"s{i}") for i in range(n)]


def _titled(sid: str, title: str, ran: list[tuple[str, int]]) -> Callable[[Tx], str]:
    """A body that renames `sid` and records which thread ran it."""

    def body(tx: Tx) -> str:
        ran.append((title, threading.get_ident()))
        tx.execute(
            "UPDATE sessions SET title = ? WHERE workspace_id = ? AND session_id = ?",
            (title, WS, sid),
        )
        return title

    return body


def _behind_a_held_write(
    store: Store, callers: list[Callable[[], Outcome]]
) -> tuple[list[Outcome], int]:
    """Hold a write open until every caller is queued behind it, in list order, then let it
    end: the callers' outcomes (results or exceptions; last, the holder's `StoreBusy` or
    None) and the holder's thread id."""
    inside, release = threading.Event(), threading.Event()
    outcomes: list[Outcome] = [None] * len(callers)
    holder_ident: list[int] = []
    holder_failed: list[StoreBusy] = []

    def hold() -> None:
        holder_ident.append(threading.get_ident())
        try:
            with store.db.write(WS):
                inside.set()
                release.wait(20)
        except StoreBusy as exc:  # a failed COMMIT fails the holder's own write as well
            holder_failed.append(exc)

    def run(i: int) -> None:
        try:
            outcomes[i] = callers[i]()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            outcomes[i] = exc

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(20)
    threads = []
    for i in range(len(callers)):
        t = threading.Thread(target=run, args=(i,))
        t.start()
        threads.append(t)
        _wait_for(lambda n=i + 1: store.db._fifo.waiting == n)  # queued in this order
    release.set()
    for t in [holder, *threads]:
        t.join(20)
    outcomes.append(holder_failed[0] if holder_failed else None)
    return outcomes, holder_ident[0]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store.open(tmp_path / "store.sqlite3")
    s.db.group_max_age_s = 60.0  # a slow machine must not split the group a test builds
    try:
        yield s
    finally:
        s.close()


def test_queued_bodies_run_in_the_holders_turn_and_each_returns_only_once_committed(
    store: Store, tmp_path: Path
) -> None:
    ids = _sessions(store, 6)
    observer = apsw.Connection(str(tmp_path / "store.sqlite3"))
    seen: dict[str, str] = {}
    ran: list[tuple[str, int]] = []

    def caller(sid: str) -> Callable[[], Outcome]:
        def call() -> Outcome:
            got = store.db.submit_write(_titled(sid, f"{sid} titled", ran), WS)
            # Returned: another connection must already see the write (it was committed).
            row = observer.execute(
                "SELECT title FROM sessions WHERE workspace_id = ? AND session_id = ?",
                (WS, sid),
            ).fetchone()
            seen[sid] = row[0]
            return got

        return call

    try:
        before = store.db.write_stats.snapshot()
        outcomes, holder = _behind_a_held_write(store, [caller(sid) for sid in ids])
        after = store.db.write_stats.snapshot()
    finally:
        observer.close()
    assert outcomes == [*(f"{sid} titled" for sid in ids), None]
    assert seen == {sid: f"{sid} titled" for sid in ids}
    # Every body ran on the holder's thread, in its one group: no hand-off, one COMMIT.
    assert {ident for _, ident in ran} == {holder}
    assert after["combined"] - before["combined"] == 6
    assert after["handoffs"] - before["handoffs"] == 0
    assert after["commits"] - before["commits"] == 1
    assert after["transactions"] - before["transactions"] == 7


def test_a_failing_body_rolls_back_alone_and_its_caller_gets_its_own_error(
    store: Store,
) -> None:
    ids = _sessions(store, 3)
    ran: list[tuple[str, int]] = []
    failure = ValueError("deliberate failure after a write")

    def failing(tx: Tx) -> None:
        ran.append(("failing", threading.get_ident()))
        tx.execute("UPDATE sessions SET title = 'half' WHERE session_id = ?", (ids[1],))
        raise failure

    before = store.db.write_stats.snapshot()
    outcomes, holder = _behind_a_held_write(
        store,
        [
            lambda: store.db.submit_write(_titled(ids[0], "first landed", ran), WS),
            lambda: store.db.submit_write(failing, WS),
            lambda: store.db.submit_write(_titled(ids[2], "third landed", ran), WS),
        ],
    )
    after = store.db.write_stats.snapshot()
    assert outcomes[0] == "first landed" and outcomes[2] == "third landed"
    assert outcomes[1] is failure  # its own exception, delivered to its own caller
    assert {ident for _, ident in ran} == {holder}
    assert after["rolled_back"] - before["rolled_back"] == 1
    assert after["combined"] - before["combined"] == 2
    assert after["commits"] - before["commits"] == 1
    titles = [store.sessions.get_session(WS, sid).title for sid in ids]
    assert titles == ["first landed", "s1", "third landed"]


def test_a_failed_commit_fails_every_combined_member_and_writes_nothing(store: Store) -> None:
    ids = _sessions(store, 2)
    ran: list[tuple[str, int]] = []
    refuse = threading.Event()
    store.db._writer_connection().set_commit_hook(lambda: refuse.is_set())
    refuse.set()  # SQLite turns the next COMMIT into a rollback
    before = store.db.write_stats.snapshot()
    outcomes, holder = _behind_a_held_write(
        store, [lambda sid=sid: store.db.submit_write(_titled(sid, "lost", ran), WS) for sid in ids]
    )
    refuse.clear()
    after = store.db.write_stats.snapshot()
    assert [type(o) for o in outcomes] == [StoreBusy, StoreBusy, StoreBusy]  # and the holder
    assert all(o.retryable for o in outcomes)
    assert {ident for _, ident in ran} == {holder}
    assert after["combined"] - before["combined"] == 2
    assert after["group_failures"] - before["group_failures"] == 1
    assert [store.sessions.get_session(WS, sid).title for sid in ids] == ["s0", "s1"]


def test_no_subscriber_hears_of_a_combined_write_before_its_commit(
    store: Store, tmp_path: Path
) -> None:
    """Each caller publishes its own events on its own thread, after the COMMIT returned."""
    ids = _sessions(store, 4)
    observer = apsw.Connection(str(tmp_path / "store.sqlite3"))
    heard: list[tuple[str, str, int]] = []

    def listen(event: ChangeEvent) -> None:
        sid = getattr(event, "session_id", None)
        if sid not in ids:
            return
        row = observer.execute(
            "SELECT title FROM sessions WHERE workspace_id = ? AND session_id = ?", (WS, sid)
        ).fetchone()
        heard.append((sid, row[0], threading.get_ident()))

    unsubscribe = store.db.subscribe(listen)
    callers_of: dict[str, int] = {}

    def caller(sid: str) -> Callable[[], Outcome]:
        def call() -> Outcome:
            callers_of[sid] = threading.get_ident()
            return store.sessions.update_title(WS, sid, f"{sid} announced").title

        return call

    try:
        before = store.db.write_stats.snapshot()
        outcomes, holder = _behind_a_held_write(store, [caller(sid) for sid in ids])
        after = store.db.write_stats.snapshot()
    finally:
        unsubscribe()
        observer.close()
    assert outcomes == [*(f"{sid} announced" for sid in ids), None]
    assert after["combined"] - before["combined"] == 4
    assert sorted(heard) == sorted(
        (sid, f"{sid} announced", callers_of[sid]) for sid in ids
    )  # durable when heard, heard on its caller's thread (never the holder's)
    assert holder not in {ident for _, _, ident in heard}


def test_the_fence_check_runs_in_the_transaction_of_the_write_it_guards(store: Store) -> None:
    """A prepare combined into the group ahead of a fenced body fences it, uncommitted."""
    sid = new_session(store, title="src")
    turn = settled_turn(store, sid, text="t1", provider_turn_id="p1").turn_id
    guarded: list[str] = []

    def fenced(tx: Tx) -> None:
        guarded.append("ran")

    def prepare() -> Outcome:
        op, created = store.fork_prepare.prepare_fork(
            WS,
            ForkPrepareRequest(
                source_session_id=sid,
                request_id=f"req-{uuid.uuid4()}",
                target_session_id=str(uuid.uuid4()),
                turn_id=turn,
                driver_kind="tutti-agent",
                driver_version="0.0.10",
                binding_mode="host_copy",
                runtime_identity={},
            ),
        )
        return created

    before = store.db.write_stats.snapshot()
    outcomes, _ = _behind_a_held_write(
        store, [prepare, lambda: store.db.submit_write(fenced, WS, fence=sid)]
    )
    after = store.db.write_stats.snapshot()
    assert outcomes[0] is True
    assert isinstance(outcomes[1], ForkInProgress)
    assert guarded == []  # the body never ran: its fence held inside the same transaction
    assert after["combined"] - before["combined"] == 1  # the prepare; the fenced one failed
    assert after["commits"] - before["commits"] == 1


def test_bodies_run_in_the_order_their_writers_queued(store: Store) -> None:
    """FIFO across both kinds: bodies queued before a writer of its own run on the holder's
    turn, the writer then takes the baton (the group open), and the bodies after it run on
    that writer's turn."""
    ids = _sessions(store, 7)
    ran: list[tuple[str, int]] = []
    writer_ident: list[int] = []

    def own_writer() -> Outcome:
        writer_ident.append(threading.get_ident())
        with store.db.write(WS) as tx:
            ran.append(("own", threading.get_ident()))
            tx.execute("UPDATE sessions SET title = 'own' WHERE session_id = ?", (ids[3],))
        return "own"

    callers: list[Callable[[], Outcome]] = []
    for i, sid in enumerate(ids):
        if i == 3:
            callers.append(own_writer)
        else:
            callers.append(lambda sid=sid: store.db.submit_write(_titled(sid, sid, ran), WS))
    before = store.db.write_stats.snapshot()
    outcomes, holder = _behind_a_held_write(store, callers)
    after = store.db.write_stats.snapshot()
    assert outcomes == [ids[0], ids[1], ids[2], "own", ids[4], ids[5], ids[6], None]
    assert [name for name, _ in ran] == [ids[0], ids[1], ids[2], "own", ids[4], ids[5], ids[6]]
    runners = [ident for _, ident in ran]
    assert runners[:3] == [holder] * 3
    assert runners[3:] == [writer_ident[0]] * 4
    assert after["combined"] - before["combined"] == 6
    assert after["handoffs"] - before["handoffs"] == 1  # the writer of its own, once
    assert after["commits"] - before["commits"] == 1


def test_a_body_submitted_inside_a_write_of_the_same_thread_is_refused(store: Store) -> None:
    with store.db.write(WS), pytest.raises(apsw.SQLError):
        store.db.submit_write(lambda tx: None, WS)
