"""The supervisor's loop wakes for a descriptor or a deadline, not on a clock: a worker's exit
is an event (its pidfd in the loop's poll set), so a killed worker's requests fail without the
housekeeping tick having to run, and an idle loop sleeps until a heartbeat or a watchdog look
is due instead of waking every 100 ms. Where the kernel gives no pidfd, the tick polls the
process as before.

The worker is the scripted process on a real PAIR over real ipc
(`tests/support/scripted_worker.py`): it says hello, answers what it is asked and sends no
heartbeat, so every wake-up of the loop counted here is the supervisor's own.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import wait_until

import drivers.supervisor as supervisor_module
from drivers.errors import WorkerLost
from drivers.supervisor import WorkerSupervisor
from tests.support.scripted_worker import shim

P = "scripted"


def supervisor(tmp_path: Path) -> WorkerSupervisor:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return WorkerSupervisor(run, python=str(shim(tmp_path)))


@pytest.fixture
def quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerSupervisor]:
    """A supervisor with nothing due for seconds once its worker is ready: heartbeats and the
    watchdog's CPU samples put off (its silence limit, 5 s, is the next thing due)."""
    monkeypatch.setattr(supervisor_module, "HEARTBEAT_INTERVAL_S", 3600.0)
    monkeypatch.setattr(supervisor_module, "SAMPLE_EVERY_S", 3600.0)
    sup = supervisor(tmp_path)
    try:
        yield sup
    finally:
        sup.close()


def ticks_at_each_death(sup: WorkerSupervisor, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The supervisor's tick count at each `_on_death` (read on the loop thread, as it runs)."""
    seen: list[int] = []
    on_death = sup._on_death  # noqa: SLF001 - the test observes the loop's own step

    def counted(worker: Any, reason: str) -> None:
        seen.append(sup.ticks)
        on_death(worker, reason)

    monkeypatch.setattr(sup, "_on_death", counted)
    return seen


def kill_with_a_request_in_flight(sup: WorkerSupervisor) -> tuple[int, int]:
    """Kill the ready worker while a request (no deadline) waits on it: the request fails with
    `WorkerLost`. Returns (its pid, the loop's tick count just before the kill)."""
    assert sup.request(P, "worker.ping", {}, 15).result(20) == {"method": "worker.ping"}
    [row] = sup.status()
    pid = row["pid"]
    assert isinstance(pid, int)
    # Answered after a 30 s pause: in flight when the worker dies.
    inflight = sup.request(P, "burst", {"sid": "s", "n": 1, "pauseMs": 30_000}, None)
    time.sleep(0.2)  # the request has left the host (no answer comes for 30 s)
    ticks = sup.ticks
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerLost, match="exited with status -9"):
        inflight.result(10)
    return pid, ticks


@pytest.mark.timeout(60)
def test_a_killed_worker_is_seen_dead_through_its_pidfd_without_a_tick(
    quiet: WorkerSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    deaths = ticks_at_each_death(quiet, monkeypatch)
    pid, ticks = kill_with_a_request_in_flight(quiet)
    assert deaths == [ticks], "the death waited for a tick: the exit was polled"
    # The restart (after its backoff) is the tick's, as before.
    assert quiet.request(P, "worker.ping", {}, 20).result(25) == {"method": "worker.ping"}
    [row] = quiet.status()
    assert row["restarts"] == 1 and row["state"] == "ready" and row["pid"] != pid, row


@pytest.mark.timeout(60)
def test_without_a_pidfd_the_tick_still_sees_a_killed_worker(
    quiet: WorkerSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old kernel (no `os.pidfd_open`): the worker's exit is polled by the tick, which then
    runs at least every `IDLE_POLL_S`."""
    monkeypatch.delattr(os, "pidfd_open")
    deaths = ticks_at_each_death(quiet, monkeypatch)
    pid, ticks = kill_with_a_request_in_flight(quiet)
    assert len(deaths) == 1 and deaths[0] > ticks
    assert quiet.request(P, "worker.ping", {}, 20).result(25) == {"method": "worker.ping"}
    [row] = quiet.status()
    assert row["restarts"] == 1 and row["state"] == "ready" and row["pid"] != pid, row


@pytest.mark.timeout(60)
def test_an_idle_supervisor_wakes_at_its_heartbeats_rate_not_per_worker_nor_per_poll(
    tmp_path: Path,
) -> None:
    """Three ready workers (as the daemon starts them ahead), nothing in flight, the default
    heartbeat (every 0.5 s): over 2 s the loop wakes for its heartbeats, the three workers'
    in step with the watchdog's CPU samples (one a second), a handful of times: not 20 (a
    100 ms poll), 200 (a 10 ms tick) nor 18 (a wake per worker and per kind of work)."""
    sup = supervisor(tmp_path)
    try:
        for provider in ("a", "b", "c"):
            assert sup.request(provider, "ping", {}, 15).result(20) == {"method": "ping"}
        time.sleep(0.6)  # a heartbeat round: the periods fall in step
        woke, ticked = sup.wakeups, sup.ticks
        time.sleep(2.0)
        woke, ticked = sup.wakeups - woke, sup.ticks - ticked
        beats = 2.0 / supervisor_module.HEARTBEAT_INTERVAL_S
        assert woke <= beats + 3, (woke, ticked)
        assert 2 <= ticked <= woke, (woke, ticked)
        assert wait_until(lambda: {row["state"] for row in sup.status()} == {"ready"})
    finally:
        sup.close()
