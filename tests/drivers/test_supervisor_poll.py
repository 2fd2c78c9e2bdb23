"""The supervisor's loop sleeps on descriptors (`zmq.FD` of each link, the mailbox's eventfd):
no frame is left unread when several arrive between its wake-ups, nor when a send of the loop's
own took the descriptor's signal of a frame that had just arrived.

The worker here is a scripted process on a real DEALER over real ipc (only the provider is
left out; `tests/support/scripted_worker.py`): it sends exactly what the test asks and no
heartbeat, and the supervisor's own heartbeats are put off, so a frame left unread stays
unread — nothing else would wake the loop.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drivers.supervisor as supervisor_module
from drivers.supervisor import WorkerSupervisor
from tests.support.scripted_worker import shim
from transport.worker_link import Mailbox

P = "scripted"


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerSupervisor]:
    """A supervisor whose one worker is the scripted process, with its heartbeats put off."""
    monkeypatch.setattr(supervisor_module, "HEARTBEAT_INTERVAL_S", 3600.0)
    python = shim(tmp_path)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sup = WorkerSupervisor(run, python=str(python))
    try:
        yield sup
    finally:
        sup.close()


class Heard:
    """What the sink heard, per Session, and a wait for a Session's `turn.completed`."""

    def __init__(self) -> None:
        self.deltas: dict[str, list[str]] = {}
        self.ended: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def sink(self, provider: str, sid: str, event: dict[str, Any]) -> None:
        with self.lock:
            if event["type"] == "message.delta":
                self.deltas.setdefault(sid, []).append(event["delta"])
            elif event["type"] == "turn.completed":
                self.ended.setdefault(sid, threading.Event()).set()

    def ended_event(self, sid: str) -> threading.Event:
        with self.lock:
            return self.ended.setdefault(sid, threading.Event())


@pytest.mark.timeout(60)
def test_a_burst_that_arrives_while_the_loop_is_away_is_read_whole_at_its_next_wake(
    scripted: WorkerSupervisor,
) -> None:
    n = 300
    held = threading.Event()
    heard: list[str] = []

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        # A delta's sink runs on the loop thread (nothing queued): the first one holds it
        # while the other 299 and the answer arrive.
        heard.append(event["delta"])
        if not held.is_set():
            held.set()
            time.sleep(0.4)

    scripted.set_event_sink(sink)
    scripted.request(P, "worker.ping", {}, 15)  # spawns it; the answer is not awaited
    answer = scripted.request(P, "burst", {"sid": "s", "n": n, "pauseMs": 100}, 30)
    assert answer.result(10) == {"method": "burst"}
    assert heard == [str(i) for i in range(n)]


@pytest.mark.timeout(120)
def test_no_frame_is_stranded_by_the_loops_own_send_after_it_woke(
    scripted: WorkerSupervisor,
) -> None:
    """A send of the loop's may take the descriptor signal of a frame that arrived after the
    loop woke (ZeroMQ reads the socket's commands in a send); the loop looks again before it
    sleeps, or that frame and every later one of the link wait: the stream stops and the ping
    is never answered. Here each ping is sent right after another worker's spawn, which holds
    the loop for milliseconds while the stream's deltas arrive."""
    heard = Heard()
    scripted.set_event_sink(heard.sink)
    assert scripted.request(P, "worker.ping", {}, 15).result(20) == {"method": "worker.ping"}
    n = 3000
    # A delta, then a millisecond's pause: each finds the loop's reader asleep and signals.
    scripted.request(P, "stream", {"sid": "s", "n": n, "every": 1}, 30)
    for i in range(20):
        scripted.start_ahead(f"{P}-{i}")  # the loop spawns it, then sends the ping
        assert scripted.request(P, "ping", {}, 30).result(10) == {"method": "ping"}, i
        time.sleep(0.01)
    assert heard.ended_event("s").wait(30), "the stream stopped: a frame stranded"
    assert heard.deltas["s"] == [str(i) for i in range(n)]


@pytest.mark.timeout(10)
def test_a_put_wakes_a_poll_on_the_mailbox_descriptor_until_drained() -> None:
    box = Mailbox()
    try:
        poll = select.poll()
        poll.register(box.fd, select.POLLIN)
        assert poll.poll(0) == []
        putter = threading.Thread(target=lambda: [box.put(("req", i)) for i in range(3)])
        putter.start()
        putter.join()
        assert poll.poll(1000) == [(box.fd, select.POLLIN)]
        assert box.drain() == [("req", 0), ("req", 1), ("req", 2)]
        assert poll.poll(0) == []
        assert box.drain() == []
    finally:
        box.close()
