"""The actor pool's threads (`domain.wake_one.WakeOneThreads`): bounded, reused while idle (the one
idle last, alone woken), a raising slice logged without losing its thread, and the slices queued
before a close still run."""

from __future__ import annotations

import threading
import time

import pytest

from actors.pool import ActorPool
from tests.support.wakeups import asleep, woken_since

pytestmark = pytest.mark.timeout(30)


def test_threads_are_bounded_and_every_slice_runs() -> None:
    pool = ActorPool(3, name="t-bounded")
    gate, done = threading.Event(), threading.Semaphore(0)
    names: set[str] = set()
    lock = threading.Lock()

    def slice_() -> None:
        gate.wait(10)
        with lock:
            names.add(threading.current_thread().name)
        done.release()

    try:
        for _ in range(10):
            pool.submit(slice_)
        gate.set()
        for _ in range(10):
            assert done.acquire(timeout=10)
        assert names and len(names) <= 3
        assert all(name.startswith("t-bounded_") for name in names)
    finally:
        pool.close()


def test_an_idle_thread_is_reused_and_a_raising_slice_keeps_it() -> None:
    pool = ActorPool(4, name="t-reuse")
    ran = threading.Semaphore(0)
    names: list[str] = []

    def boom() -> None:
        names.append(threading.current_thread().name)
        ran.release()
        raise ValueError("a slice that raises")

    def fine() -> None:
        names.append(threading.current_thread().name)
        ran.release()

    def idle() -> None:
        deadline = time.monotonic() + 10
        while pool._threads.idle == 0 and time.monotonic() < deadline:
            time.sleep(0.001)  # the slice has returned; its thread counts itself idle next

    try:
        pool.submit(boom)
        assert ran.acquire(timeout=10)
        for _ in range(5):
            idle()
            pool.submit(fine)  # one at a time: the one thread is idle each time
            assert ran.acquire(timeout=10)
        assert set(names) == {"t-reuse_0"}
    finally:
        pool.close()


def test_slices_queued_before_the_close_still_run_and_later_ones_are_dropped() -> None:
    pool = ActorPool(1, name="t-close")
    gate = threading.Event()
    ran: list[int] = []
    pool.submit(lambda: gate.wait(10))
    for i in range(3):
        pool.submit(lambda i=i: ran.append(i))
    pool.close()
    pool.submit(lambda: ran.append(99))  # closed: dropped, not raised
    gate.set()
    (thread,) = [t for t in threading.enumerate() if t.name == "t-close_0"]
    thread.join(10)
    assert not thread.is_alive()
    assert ran == [0, 1, 2]


def test_a_slice_wakes_one_idle_thread_the_one_idle_last() -> None:
    """With two threads idle, each slice wakes exactly one of them, the one that went idle
    last: one actor's slices, submitted one at a time, all run on one thread, and the other
    thread sleeps through them (no wake-up at all). On one `SimpleQueue` both idle threads
    waited on, the other woke at every slice (its lock handed on by the taker's `get`) and
    the slices alternated between the two."""
    pool = ActorPool(2, name="t-lifo")
    both, go = threading.Barrier(3), threading.Event()
    ran: list[str] = []
    done = threading.Semaphore(0)

    def held() -> None:
        both.wait(10)
        go.wait(10)

    def one() -> None:
        ran.append(threading.current_thread().name)
        done.release()

    def idle(n: int) -> None:
        deadline = time.monotonic() + 10
        while pool._threads.idle < n and time.monotonic() < deadline:
            time.sleep(0.001)
        assert pool._threads.idle == n

    try:
        pool.submit(held)
        pool.submit(held)  # no thread idle: a second one starts
        both.wait(10)
        go.set()
        idle(2)
        threads = [t for t in threading.enumerate() if t.name.startswith("t-lifo_")]
        assert len(threads) == 2
        before = asleep(threads)
        for _ in range(20):
            pool.submit(one)
            assert done.acquire(timeout=10)
            idle(2)
        woken = woken_since(threads, before)
        assert len(set(ran)) == 1, ran
        [other] = [t.name for t in threads if t.name != ran[0]]
        assert woken[other] == 0, woken
    finally:
        pool.close()
