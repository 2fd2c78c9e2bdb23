"""The checkpoint pool (`actors.checkpoints.checkpoint_pool`): a job wakes one idle thread, the
one idle last, and a shutdown still ends every thread and cancels what is queued."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from actors.checkpoints import CheckpointPool, checkpoint_pool
from tests.support.wakeups import asleep, woken_since

pytestmark = pytest.mark.timeout(30)


def _pool_threads(pool: CheckpointPool) -> list[threading.Thread]:
    return sorted(pool.threads, key=lambda t: t.name)


def test_a_job_wakes_one_idle_thread_the_one_idle_last() -> None:
    """With both threads idle, jobs submitted one at a time all run on one thread and the other
    sleeps through them (no wake-up). On the executor's own `SimpleQueue` the other woke at
    every job and the jobs went to both."""
    pool = checkpoint_pool(2)
    both, go = threading.Barrier(3), threading.Event()

    def held() -> None:
        both.wait(10)
        go.wait(10)

    try:
        first = [pool.submit(held), pool.submit(held)]  # the second starts the second thread
        both.wait(10)
        go.set()
        for f in first:
            f.result(10)
        threads = _pool_threads(pool)
        assert len(threads) == 2
        before = asleep(threads)
        ran = [pool.submit(lambda: threading.current_thread().name).result(10) for _ in range(20)]
        woken = woken_since(threads, before)
        assert len(set(ran)) == 1, ran
        [other] = [t.name for t in threads if t.name != ran[0]]
        assert woken[other] == 0, woken
    finally:
        pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in threads)


def test_a_shutdown_cancels_what_is_queued_and_ends_every_thread() -> None:
    pool = checkpoint_pool(1)
    gate = threading.Event()
    running = pool.submit(gate.wait, 10)
    queued: list[Future[object]] = [pool.submit(lambda: None) for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert running.result(10) is True
    assert all(f.cancelled() for f in queued)
    for thread in _pool_threads(pool):
        thread.join(10)
        assert not thread.is_alive()


def test_a_jobs_future_carries_its_result_or_error_and_a_closed_pool_refuses() -> None:
    """What the callers read: `result()` (a Turn's capture), `add_done_callback` (the janitor's
    next sweep); a `submit` after the shutdown raises `RuntimeError` (the daemon is closing)."""
    pool = checkpoint_pool(2)

    def fails() -> None:
        raise ValueError("a job that raises")

    done: list[int] = []

    def add(a: int, b: int = 0) -> int:
        return a + b

    ok = pool.submit(add, 2, b=3)
    ok.add_done_callback(lambda f: done.append(f.result()))
    assert ok.result(10) == 5
    bad = pool.submit(fails)
    with pytest.raises(ValueError, match="a job that raises"):
        bad.result(10)
    assert done == [5]
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
