"""The worker's request lanes (`drivers.worker.RequestLane`): the link thread hands a request over
with one put that never starts a thread; a lane runs up to its size at once, queues the rest,
and survives a handler that raises."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from drivers.worker import RequestLane

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
