"""What a pooled actor's slice costs per message: the bookkeeping the pool does around each
message on the actor's thread, counted (a Turn is ~8.5 messages in ~6.5 slices)."""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors import pool as pool_module
from actors.pool import ActorPool, PooledActor
from tests.support.counting_lock import CountingLock


class _Log:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.background_asked = 0
        self.seen: list[Any] = []
        self.peek_calls: list[list[str]] = []


class _Counter(PooledActor):
    """Counts the pool's questions about its messages; "req" goes ahead of "bg"."""

    def __init__(self, pool: ActorPool, log: _Log) -> None:
        super().__init__()
        self.actor_pool = pool
        self.log = log

    def goes_ahead(self, message: Any) -> bool:
        return message == "req"

    def is_background(self, message: Any) -> bool:
        self.log.background_asked += 1
        return message == "bg"

    def on_receive(self, message: Any) -> Any:
        if message == "end":
            self.log.done.set()
        else:
            self.log.seen.append(message)
        return None


@pytest.fixture
def pool() -> Iterator[ActorPool]:
    p = ActorPool(2, name="test-slices")
    yield p
    p.close()


def test_taking_a_message_when_none_went_ahead_asks_the_actor_nothing(pool: ActorPool) -> None:
    # The reset of the goes-ahead count needs the taken message's kind only while the count
    # is not 0: a plain Turn's messages are taken without a call into the actor.
    log = _Log()
    ref = _Counter.start(pool, log)
    for n in range(20):
        ref.tell(("plain", n))
    ref.tell("end")
    assert log.done.wait(5)
    assert log.background_asked == 0
    assert log.seen == [("plain", n) for n in range(20)]
    ref.stop()


class _Peeker(PooledActor):
    """Asks `next_message` in each receive, as the Session actor does, and records what it
    saw and how many inbox lock acquisitions the question took."""

    def __init__(self, pool: ActorPool, log: _Log, gate: threading.Event) -> None:
        super().__init__()
        self.actor_pool = pool
        self.log = log
        self.gate = gate
        self.peek_locks = 0

    def goes_ahead(self, message: Any) -> bool:
        return False

    def is_background(self, message: Any) -> bool:
        return False

    def on_receive(self, message: Any) -> Any:
        if message == "block":
            self.gate.wait(5)
            return None
        lock = self.actor_inbox._lock
        before = lock.taken
        calls: list[str] = []

        def profile(frame: Any, event: str, _arg: object) -> None:
            if event == "call" and frame.f_code.co_filename == pool_module.__file__:
                calls.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            following = self.next_message()
        finally:
            sys.setprofile(None)
        self.peek_locks += lock.taken - before
        self.log.peek_calls.append(calls)
        self.log.seen.append((message, following, self.peek_locks))
        if message == "end":
            self.log.done.set()
        return None


def test_the_next_message_is_seen_without_the_inbox_lock_or_a_call(pool: ActorPool) -> None:
    # Asked in every receive of a Session actor (~8.5 a Turn) on its own thread, the only
    # thread that takes from its inbox: the answer needs no lock, and it is still the message
    # handled next.
    log, gate = _Log(), threading.Event()
    ref = _Peeker.start(pool, log, gate)
    ref.tell("block")
    ref.actor_inbox._lock = CountingLock(ref.actor_inbox._lock)
    for n in range(3):
        ref.tell(n)
    ref.tell("end")
    gate.set()
    assert log.done.wait(5)
    assert [(m, f) for m, f, _ in log.seen] == [(0, 1), (1, 2), (2, "end"), ("end", None)]
    assert log.seen[-1][2] == 0
    # Read in place: the pool's only Python call is `next_message` itself.
    assert log.peek_calls == [["next_message"]] * 4
    ref.stop()


def test_a_slice_calls_only_its_take_and_its_handler_per_message() -> None:
    # The pool's own Python calls on the actor's thread (a Turn is ~8.5 messages in ~6.5
    # slices): per slice one `_run_slice` and the take that finds the inbox empty, per message
    # a take and a handler — no gate check when there is no gate, no reset of the goes-ahead
    # count when nothing went ahead.
    calls: list[str] = []

    def profile(frame: Any, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_filename == pool_module.__file__:
            calls.append(frame.f_code.co_name)

    pool = ActorPool(1, name="test-profiled")
    log = _Log()
    threading.setprofile(profile)  # seen by the pool's thread, started by the first slice
    try:
        ref = _Counter.start(pool, log)
        for n in range(5):
            ref.tell(("plain", n))
        ref.tell("end")
        assert log.done.wait(5)
        ref.stop()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        pool.close()
    on_thread = collections.Counter(name for name in calls if name != "_work")
    slices = on_thread["_run_slice"]
    assert set(on_thread) == {"_run_slice", "take_or_idle", "_handle_envelope", "_teardown"}
    assert on_thread["_handle_envelope"] == 7  # five, "end" and the stop
    assert on_thread["take_or_idle"] == 7 + slices


class _Gated(_Counter):
    """Handles nothing, not even `on_start`, until `predecessor` is done."""

    def __init__(
        self, pool: ActorPool, log: _Log, predecessor: pykka.Future[Any], timeout: float
    ) -> None:
        super().__init__(pool, log)
        self.wait_for(predecessor, timeout)

    def on_start(self) -> None:
        self.log.seen.append("started")


def test_an_actor_behind_a_predecessor_waits_for_it_without_holding_a_thread() -> None:
    # The law of the gate the slice checks first: nothing (not `on_start`) before the
    # predecessor completes, the pool's one thread free for others meanwhile, then every
    # message in order; a predecessor never done lets the actor go at its timeout.
    pool = ActorPool(1, name="test-gate")
    try:
        predecessor: pykka.Future[Any] = pykka.ThreadingFuture()
        log, other = _Log(), _Log()
        gated = _Gated.start(pool, log, predecessor, 30.0)
        for n in range(3):
            gated.tell(("plain", n))
        gated.tell("end")
        free = _Counter.start(pool, other)
        free.tell("end")
        assert other.done.wait(5)  # the only thread was not held by the gated actor
        time.sleep(0.05)
        assert log.seen == []
        predecessor.set(None)
        assert log.done.wait(5)
        assert log.seen == ["started", ("plain", 0), ("plain", 1), ("plain", 2)]

        late = _Log()
        never: pykka.Future[Any] = pykka.ThreadingFuture()
        timed_out = _Gated.start(pool, late, never, 0.1)
        timed_out.tell("end")
        assert late.done.wait(5)
        assert late.seen == ["started"]
        for ref in (gated, free, timed_out):
            ref.stop()
    finally:
        pool.close()
