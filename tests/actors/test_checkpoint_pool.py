"""The checkpoint pool (`actors.checkpoints.checkpoint_pool`): a job wakes one idle thread, the
one idle last, and a shutdown still ends every thread and cancels what is queued."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from actors.checkpoints import checkpoint_pool

pytestmark = pytest.mark.timeout(30)


def _switches(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far (each a sleep and a wake-up)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def _asleep(threads: list[threading.Thread]) -> dict[str, int]:
    """Each thread's switch count once none moved for 50 ms (idle is not yet asleep)."""
    counts = {t.name: _switches(t) for t in threads}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = {t.name: _switches(t) for t in threads}
        if now == counts:
            break
        counts = now
    return counts


def _pool_threads(pool: ThreadPoolExecutor) -> list[threading.Thread]:
    return sorted(pool._threads, key=lambda t: t.name)  # type: ignore[attr-defined]


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
        before = _asleep(threads)
        ran = [pool.submit(lambda: threading.current_thread().name).result(10) for _ in range(20)]
        after = {t.name: _switches(t) for t in threads}
        assert len(set(ran)) == 1, ran
        [other] = [t.name for t in threads if t.name != ran[0]]
        assert after[other] - before[other] == 0, (before, after)
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
