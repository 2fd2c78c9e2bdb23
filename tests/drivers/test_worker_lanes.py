"""The worker's request lanes (`drivers.worker.RequestLane`): the link thread hands a request over
with one put that never starts a thread; a lane runs up to its size at once, queues the rest,
and survives a handler that raises."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from drivers.worker import RequestLane
from tests.support.wakeups import asleep, woken_since

pytestmark = pytest.mark.timeout(60)


def test_put_starts_no_thread_on_the_putting_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    starters: list[int] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        starters.append(threading.get_ident())
        real_start(self)

    done = threading.Semaphore(0)
    release = threading.Event()

    def handle(msg: Any) -> None:
        done.release()
        release.wait(30)

    lane = RequestLane("t", 4, handle)
    monkeypatch.setattr(threading.Thread, "start", start)
    for i in range(4):
        lane.put(i)
    for _ in range(4):
        assert done.acquire(timeout=30)  # all four run at once: the lane grew to its size
    release.set()
    assert lane.threads == 4
    assert starters and threading.get_ident() not in starters


def test_a_full_lane_queues_the_rest_and_runs_them_as_threads_free() -> None:
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()
    first_two = threading.Semaphore(0)
    all_done = threading.Semaphore(0)

    def handle(msg: int) -> None:
        with lock:
            started.append(msg)
        if msg < 2:
            first_two.release()
            release.wait(30)
        all_done.release()

    lane = RequestLane("t", 2, handle)
    for i in range(6):
        lane.put(i)
    assert first_two.acquire(timeout=30) and first_two.acquire(timeout=30)
    with lock:
        assert sorted(started) == [0, 1]  # the other four wait: the lane is at its size
    release.set()
    for _ in range(6):
        assert all_done.acquire(timeout=30)
    assert sorted(started[:2]) == [0, 1] and sorted(started[2:]) == [2, 3, 4, 5]
    assert lane.threads == 2


def test_a_handler_that_raises_does_not_stop_the_lane() -> None:
    ran = threading.Semaphore(0)

    def handle(msg: str) -> None:
        if msg == "bad":
            raise RuntimeError("a driver bug")
        ran.release()

    lane = RequestLane("t", 1, handle)
    lane.put("bad")
    lane.put("good")
    assert ran.acquire(timeout=30)


def test_a_request_wakes_one_idle_thread_the_one_idle_last() -> None:
    """With two lane threads idle, each request wakes exactly one, the one idle last: requests
    put one at a time all run on one thread and the other sleeps through them (no wake-up).
    On one `SimpleQueue` both waited on, the other woke at every request (the taker's `get`
    handed the queue's lock on) and the requests alternated between them."""
    ran: list[str] = []
    done = threading.Semaphore(0)

    def handle(msg: int) -> None:
        ran.append(threading.current_thread().name)
        done.release()

    lane = RequestLane("lifo", 4, handle)
    lane.put(0)  # the first request leaves no thread idle: a spare starts
    assert done.acquire(timeout=30)

    def lane_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("req-lifo-")]

    deadline = time.monotonic() + 10
    while (len(lane_threads()) < 2 or lane.idle < 2) and time.monotonic() < deadline:
        time.sleep(0.001)
    threads = lane_threads()
    assert len(threads) == 2 and lane.idle == 2
    ran.clear()
    before = asleep(threads)
    for i in range(20):
        lane.put(i)
        assert done.acquire(timeout=30)
        while lane.idle < 2 and time.monotonic() < deadline + 20:
            time.sleep(0.001)
    woken = woken_since(threads, before)
    assert len(set(ran)) == 1, ran
    [other] = [t.name for t in threads if t.name != ran[0]]
    assert woken[other] == 0, woken
    assert lane.threads == 2
