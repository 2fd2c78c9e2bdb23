"""The API's reader and writer pools (`agenthost.api_base.RequestPlumbing`, on
`domain.wake_one.WakeOneThreads`): a request handed to a pool wakes ONE idle thread, the one idle
last, and the daemon's close ends every pool thread. On a `ThreadPoolExecutor` (its
`SimpleQueue`) both idle threads woke for every request and the requests went to both."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from domain.errors import HostError
from tests.support.in_process import in_process_daemon
from tests.support.wakeups import asleep, woken_since
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


class _Refused:
    def __init__(self) -> None:
        self.errors: list[HostError] = []

    def error(self, error: HostError) -> bool:
        self.errors.append(error)
        return True


def _one_thread_per_job(
    submit: Callable[[Callable[[], None]], Any], idle: Callable[[], int], prefix: str
) -> None:
    """Two of the pool's threads made and idle; then 20 jobs one at a time: all on one
    thread, and the other not woken once."""
    both, go = threading.Barrier(3), threading.Event()
    done = threading.Semaphore(0)
    ran: list[str] = []

    def held() -> None:
        both.wait(10)
        go.wait(10)

    def one() -> None:
        ran.append(threading.current_thread().name)
        done.release()

    def idle_at_least(n: int) -> None:
        deadline = time.monotonic() + 10
        while idle() < n and time.monotonic() < deadline:
            time.sleep(0.001)
        assert idle() >= n

    submit(held)
    submit(held)
    both.wait(10)
    go.set()
    idle_at_least(2)
    threads = [t for t in threading.enumerate() if t.name.startswith(prefix)]
    assert len(threads) >= 2, threads
    before = asleep(threads)
    for _ in range(20):
        submit(one)
        assert done.acquire(timeout=10)
        idle_at_least(len(threads))
    woken = woken_since(threads, before)
    assert len(set(ran)) == 1, ran
    assert all(n == 0 for name, n in woken.items() if name != ran[0]), woken


def test_a_read_wakes_one_idle_reader_thread_the_one_idle_last(
    running: tuple[Daemon, Client],
) -> None:
    daemon, _ = running
    assert daemon.api is not None
    plumbing = daemon.api.plumbing
    refused = _Refused()
    _one_thread_per_job(
        lambda fn: plumbing.on_pool(refused, fn), lambda: plumbing._pool.idle, "agenthost-read_"
    )
    assert refused.errors == []


def test_a_lane_write_wakes_one_idle_writer_thread_the_one_idle_last(
    running: tuple[Daemon, Client],
) -> None:
    daemon, _ = running
    assert daemon.api is not None
    plumbing = daemon.api.plumbing
    keys = iter(range(1_000))
    # Each job on a lane of its own (a Session's lane runs its writes one after the other).
    _one_thread_per_job(
        lambda fn: plumbing.lanes.write_or_route(("ws", f"s{next(keys)}"), fn),
        lambda: plumbing._writers.idle,
        "agenthost-write_",
    )


def test_the_daemons_close_ends_every_pool_thread(tmp_path: Path) -> None:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as (daemon, client):
        assert daemon.api is not None
        plumbing = daemon.api.plumbing
        refused = _Refused()
        ran = threading.Semaphore(0)
        for _ in range(3):
            plumbing.on_pool(refused, ran.release)
            plumbing.lanes.write_or_route(("ws", "s"), ran.release)
        for _ in range(6):
            assert ran.acquire(timeout=10)
        threads = plumbing._pool.threads + plumbing._writers.threads
        assert threads
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), thread.name
    plumbing.on_pool(refused, ran.release)  # closed: answered `shutting_down`, not run
    assert [e.reason for e in refused.errors] == ["shutting_down"]
