"""`domain.wake_one`: a `put` wakes at most one waiting thread, the one waiting since last
(LIFO); queued items are taken in order (FIFO); `close` ends the waiters and keeps (or drops)
what is queued; under a hammer of producers and consumers no item is lost or taken twice and
no waiter sleeps through an item. The pools built on it keep their own tests (the actor pool,
the checkpoint pool, the worker's lanes, the API's pools) through `tests.support.wakeups`."""

from __future__ import annotations

import functools
import queue
import random
import threading
import time
from typing import Any

import pytest

from domain.wake_one import QueueClosed, WakeOneQueue, WakeOneThreads
from tests.support.wakeups import asleep, woken_since

pytestmark = pytest.mark.timeout(60)


def _waiting(q: WakeOneQueue[Any], n: int) -> None:
    deadline = time.monotonic() + 10
    while q.waiting < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert q.waiting == n


def _getters(
    q: WakeOneQueue[object], n: int, got: list[tuple[str, object]]
) -> list[threading.Thread]:
    """`n` threads each taking items until the queue closes, started one after the other (each
    asleep in `get` before the next starts)."""

    def take() -> None:
        while True:
            try:
                item = q.get()
            except QueueClosed:
                return
            got.append((threading.current_thread().name, item))

    threads = []
    for i in range(n):
        thread = threading.Thread(target=take, name=f"getter-{i}", daemon=True)
        thread.start()
        threads.append(thread)
        _waiting(q, i + 1)
    return threads


def test_a_put_wakes_one_waiter_the_one_waiting_since_last() -> None:
    """Three threads asleep in `get`; twenty items put one at a time all go to the thread that
    waited last, and the other two sleep through them (no wake-up). A `SimpleQueue` woke a
    second waiter per item (its `get` hands its lock on as it returns)."""
    q: WakeOneQueue[object] = WakeOneQueue()
    got: list[tuple[str, object]] = []
    threads = _getters(q, 3, got)
    before = asleep(threads)
    for i in range(20):
        assert q.put(i) is True  # handed: one thread woken
        deadline = time.monotonic() + 10
        while len(got) <= i and time.monotonic() < deadline:
            time.sleep(0.001)
        _waiting(q, 3)
    woken = woken_since(threads, before)
    assert [item for _, item in got] == list(range(20))
    assert {name for name, _ in got} == {"getter-2"}
    assert woken["getter-0"] == 0 and woken["getter-1"] == 0, woken
    assert q.handed == 20
    q.close()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_items_put_while_nobody_waits_are_taken_first_in_first_out() -> None:
    q: WakeOneQueue[int] = WakeOneQueue()
    assert [q.put(i) for i in range(5)] == [False] * 5  # queued, nobody woken
    assert len(q) == 5
    assert [q.get() for _ in range(3)] == [0, 1, 2]
    assert q.get_nowait() == 3
    assert q.get() == 4
    with pytest.raises(queue.Empty):
        q.get_nowait()
    assert q.handed == 0


def test_close_ends_every_waiter_and_keeps_what_is_queued_unless_dropped() -> None:
    q: WakeOneQueue[object] = WakeOneQueue()
    got: list[tuple[str, object]] = []
    threads = _getters(q, 2, got)
    q.close()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert got == []
    with pytest.raises(QueueClosed):
        q.put(1)
    with pytest.raises(RuntimeError):  # what an executor's submit raises after its shutdown
        q.put(1)

    kept: WakeOneQueue[int] = WakeOneQueue()
    kept.put(1)
    kept.put(2)
    assert kept.close() == []
    assert [kept.get(), kept.get()] == [1, 2]  # queued before the close: still taken
    with pytest.raises(QueueClosed):
        kept.get()

    dropped: WakeOneQueue[int] = WakeOneQueue()
    dropped.put(1)
    dropped.put(2)
    assert dropped.close(drop=True) == [1, 2]
    with pytest.raises(QueueClosed):
        dropped.get()


def test_no_item_is_lost_or_taken_twice_under_a_hammer_of_producers_and_consumers() -> None:
    """6 producers, 5 consumers, bursts and pauses at random: every item is taken exactly once,
    and once the producers are done every consumer is asleep again with nothing queued (no
    waiter slept through an item: the last items were taken without another `put`)."""
    q: WakeOneQueue[tuple[int, int]] = WakeOneQueue()
    taken: list[tuple[int, int]] = []
    lock = threading.Lock()
    per_producer = 2_000

    def consume() -> None:
        mine = []
        while True:
            try:
                item = q.get()
            except QueueClosed:
                break
            mine.append(item)
        with lock:
            taken.extend(mine)

    def produce(p: int) -> None:
        rng = random.Random(p)
        for i in range(per_producer):
            q.put((p, i))
            if rng.random() < 0.3:  # the consumers fall asleep: thousands of hand-offs
                time.sleep(rng.random() * 0.0002)

    consumers = [threading.Thread(target=consume, daemon=True) for _ in range(5)]
    producers = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(6)]
    for thread in consumers + producers:
        thread.start()
    for thread in producers:
        thread.join(30)
    _waiting(q, 5)  # every item taken without another put: no lost wake-up
    assert len(q) == 0
    assert q.handed > 500, q.handed  # the hand-off path was hammered, not only the queue
    q.close()
    for thread in consumers:
        thread.join(10)
        assert not thread.is_alive()
    assert len(taken) == 6 * per_producer
    assert sorted(taken) == [(p, i) for p in range(6) for i in range(per_producer)]
    for p in range(6):  # one producer's items in its order per consumer is not promised;
        assert {i for q_, i in taken if q_ == p} == set(range(per_producer))  # each once


def test_the_threads_start_only_when_none_is_idle_and_end_at_shutdown() -> None:
    pool = WakeOneThreads(3, "t-wake")
    gate = threading.Event()
    done = threading.Semaphore(0)

    def job() -> None:
        gate.wait(10)
        done.release()

    for _ in range(5):
        pool.submit(job)
    assert len(pool.threads) == 3  # bounded
    gate.set()
    for _ in range(5):
        assert done.acquire(timeout=10)
    deadline = time.monotonic() + 10
    while pool.idle < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    for _ in range(10):
        pool.submit(done.release)  # one idle: no thread starts
        assert done.acquire(timeout=10)
    assert len(pool.threads) == 3
    threads = pool.threads
    pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError):
        pool.submit(job)


@pytest.mark.parametrize("drop", [False, True])
def test_a_shutdown_runs_what_is_queued_or_drops_it(drop: bool) -> None:
    pool = WakeOneThreads(1, f"t-drop-{drop}")
    gate = threading.Event()
    ran: list[int] = []
    pool.submit(lambda: gate.wait(10))
    for i in range(3):
        pool.submit(functools.partial(ran.append, i))
    dropped = pool.shutdown(wait=False, drop=drop)
    gate.set()
    for thread in pool.threads:
        thread.join(10)
        assert not thread.is_alive()
    assert ran == ([] if drop else [0, 1, 2])
    assert len(dropped) == (3 if drop else 0)


def test_a_raising_job_is_logged_and_keeps_its_thread(caplog: pytest.LogCaptureFixture) -> None:
    pool = WakeOneThreads(1, "t-raise")
    done = threading.Semaphore(0)

    def boom() -> None:
        done.release()
        raise ValueError("a job that raises")

    try:
        pool.submit(boom)
        assert done.acquire(timeout=10)
        pool.submit(done.release)
        assert done.acquire(timeout=10)
        assert [t.name for t in pool.threads] == ["t-raise_0"]
    finally:
        pool.shutdown()
    assert "a job failed" in caplog.text
