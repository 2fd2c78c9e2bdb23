"""A request to a ready worker with nothing ahead of it is sent on its link from the caller's
thread (`WorkerSupervisor._send_direct`), under the link's lock the loop takes for every touch
of that socket. What must still hold: a request never overtakes one (or failpoints) handed to
the loop before it; a direct send racing the loop's drain of a streaming link neither garbles
a frame nor loses an answer's match; a worker killed while direct sends are under way fails
each of them typed, and none hangs.

The worker is the scripted process on a real DEALER over real ipc
(`tests/support/scripted_worker.py`): `echo` answers with its params and how many requests
reached the worker before it, so the order of arrival is read from the answers.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import drivers.supervisor as supervisor_module
from drivers.errors import WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.supervisor import WorkerSupervisor
from tests.support.scripted_worker import shim

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


def _ready(sup: WorkerSupervisor) -> None:
    assert sup.request(P, "ping", {}, 20).result(20) == {"method": "ping"}


@pytest.mark.timeout(60)
def test_a_request_after_failpoints_still_in_the_loops_mailbox_is_not_sent_ahead_of_them(
    scripted: WorkerSupervisor,
) -> None:
    """Direct sends are taken (the link is idle), but while the loop is held, failpoints set
    meanwhile wait in its mailbox: a request made after `set_failpoints` returned goes behind
    them, so the worker sees the points armed first (the rule `set_failpoints` promises)."""
    _ready(scripted)
    first = scripted.request(P, "echo", {"i": 0}, 20).result(20)
    assert scripted.sent_direct >= 1, "an idle ready link's request did not go direct"
    held, release = threading.Event(), threading.Event()

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        held.set()  # on the loop thread (nothing queued there): the loop waits here
        release.wait(10)

    scripted.set_event_sink(sink)
    burst = scripted.request(P, "burst", {"sid": "s", "n": 1, "pauseMs": 0}, 20)
    assert held.wait(10)
    scripted.set_failpoints({"test.point": "error"})
    after = scripted.request(P, "echo", {"i": 1}, 20)
    time.sleep(0.05)
    release.set()
    assert burst.result(10) == {"method": "burst"}
    # burst, then debug.failpoints, then this echo: two arrivals between the echoes.
    assert after.result(10)["n"] == first["n"] + 3


@pytest.mark.timeout(90)
def test_requests_of_each_thread_arrive_in_order_from_the_workers_start_on(
    scripted: WorkerSupervisor,
) -> None:
    """Four threads send back to back from before the worker said hello (their first requests
    queue, then the queue is sent at the hello while later ones come in): each thread's
    requests reach the worker in the order it made them, queued or direct."""
    per_thread, threads = 300, 4
    answers: list[list[Future[dict[str, Any]]]] = [[] for _ in range(threads)]
    go = threading.Event()

    def send(t: int) -> None:
        go.wait()
        for i in range(per_thread):
            answers[t].append(scripted.request(P, "echo", {"t": t, "i": i}, 30))

    workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    go.set()  # the first request spawns the worker
    for w in workers:
        w.join(30)
    for t in range(threads):
        got = [f.result(30) for f in answers[t]]
        assert [g["params"] for g in got] == [{"t": t, "i": i} for i in range(per_thread)]
        arrivals = [g["n"] for g in got]
        assert arrivals == sorted(arrivals), f"thread {t}: a request overtook an earlier one"
    # Sent back to back, they may all have gone through the loop; the link is idle now.
    before = scripted.sent_direct
    scripted.request(P, "echo", {}, 20).result(20)
    assert scripted.sent_direct == before + 1


@pytest.mark.timeout(120)
def test_direct_sends_racing_the_loops_drain_of_a_stream_lose_no_frame_and_match_every_answer(
    scripted: WorkerSupervisor,
) -> None:
    """Six threads send 250 requests each while the loop drains a 3,000-delta stream from the
    same link: every answer carries its own request's params, every delta arrives in order,
    and the stream's end arrives (a frame whose signal a direct send took is still read)."""
    deltas: list[str] = []
    ended = threading.Event()

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        if event["type"] == "message.delta":
            deltas.append(event["delta"])
        elif event["type"] == "turn.completed":
            ended.set()

    scripted.set_event_sink(sink)
    _ready(scripted)
    n = 3000
    scripted.request(P, "stream", {"sid": "s", "n": n, "every": 1}, 30)
    per_thread, threads = 250, 6
    answers: list[list[Future[dict[str, Any]]]] = [[] for _ in range(threads)]

    def send(t: int) -> None:
        for i in range(per_thread):
            answers[t].append(scripted.request(P, "echo", {"t": t, "i": i}, 30))
            if i % 25 == 0:
                time.sleep(0.002)

    workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    for t in range(threads):
        got = [f.result(30) for f in answers[t]]
        assert [g["params"] for g in got] == [{"t": t, "i": i} for i in range(per_thread)]
    assert scripted.sent_direct > 0  # some direct, some behind the loop holding the link
    assert ended.wait(30), "the stream stopped: a frame stranded"
    assert deltas == [str(i) for i in range(n)]


class _LongSleeps:
    """The loop's epoll with its 0.1 s wake-up made 10 s: a frame nobody signals waits."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def poll(self, timeout: float = -1) -> Any:
        return self.real.poll(10.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.timeout(120)
def test_an_answer_whose_signal_a_direct_send_took_wakes_the_loop(
    scripted: WorkerSupervisor,
) -> None:
    """The loop has made its last look and is about to sleep when an answer arrives; a direct
    send made then reads the socket's commands, and with them the descriptor's signal of that
    answer, so the loop's `epoll` would not wake for it. The sender's look after its send finds
    the answer and wakes the loop; without it the answer waits for the next frame (here the
    other request's answer, 3 s later)."""
    _ready(scripted)
    at_sleep, go = threading.Event(), threading.Event()
    armed = threading.Event()
    look = scripted._look_after_sends

    def look_then_wait() -> None:
        look()
        if armed.is_set():  # the loop's last look of this pass is done: hold it here
            armed.clear()
            at_sleep.set()
            go.wait(10)

    scripted._look_after_sends = look_then_wait  # type: ignore[method-assign]
    scripted._epoll = _LongSleeps(scripted._epoll)  # type: ignore[assignment]
    for i in range(3):
        at_sleep.clear()
        go.clear()
        armed.set()
        scripted._mailbox.wake()  # one pass of the loop, held before it sleeps
        assert at_sleep.wait(10)
        first = scripted.request(P, "echo", {"i": i}, 30)
        time.sleep(0.05)  # its answer arrives while the loop is held
        scripted.request(P, "later", {"ms": 3000}, 30)  # this send takes the answer's signal
        go.set()
        t0 = time.monotonic()
        assert first.result(10)["params"] == {"i": i}
        assert time.monotonic() - t0 < 1.5, f"round {i}: the answer waited for another frame"


@pytest.mark.timeout(120)
def test_a_worker_killed_while_direct_sends_are_under_way_fails_each_typed_and_none_hangs(
    scripted: WorkerSupervisor,
) -> None:
    """Four threads keep sending while the worker is SIGKILLed: every `request` returns a
    future (no raise on the caller's thread), every future ends — answered, or `WorkerLost`
    (sent; fate unknown), `WorkerUnavailable` (never sent) — well within its timeout, and the
    restarted worker takes direct sends again."""
    _ready(scripted)
    pid = scripted.status()[0]["pid"]
    assert isinstance(pid, int)
    stop = threading.Event()
    futures: list[Future[dict[str, Any]]] = []
    raised: list[BaseException] = []
    lock = threading.Lock()

    def send(t: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                fut = scripted.request(P, "echo", {"t": t, "i": i}, 60)
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                raised.append(exc)
                return
            with lock:
                futures.append(fut)
            i += 1
            if i % 10 == 0:
                time.sleep(0.001)

    workers = [threading.Thread(target=send, args=(t,)) for t in range(4)]
    for w in workers:
        w.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    stop.set()
    for w in workers:
        w.join(10)
    assert raised == []
    deadline = time.monotonic() + 20  # far below the requests' 60 s: nothing waits for it
    kinds: dict[str, int] = {}
    for fut in futures:
        left = max(0.01, deadline - time.monotonic())
        exc = fut.exception(left)  # raises TimeoutError: a hung request
        name = "ok" if exc is None else type(exc).__name__
        assert exc is None or isinstance(exc, WorkerLost | WorkerUnavailable | WorkerTimeout), exc
        kinds[name] = kinds.get(name, 0) + 1
    assert kinds.get("ok", 0) > 0 and len(kinds) > 1, kinds
    before = scripted.sent_direct
    end = time.monotonic() + 20
    while True:  # restarted after its backoff; a request then goes direct again
        try:
            scripted.request(P, "echo", {"again": True}, 5).result(10)
        except WorkerUnavailable:
            assert time.monotonic() < end
            time.sleep(0.1)
            continue
        if scripted.sent_direct > before:
            break
        assert time.monotonic() < end
    assert scripted.status()[0]["pid"] != pid
