"""`PooledActor.handle_here`: an idle actor handles a message on the caller's thread (no pool
thread woken), and only then: a busy, unstarted or stopped actor refuses it, and whatever
arrives while it runs waits behind it and goes to the pool, in order."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actors.pool import ActorPool, PooledActor

pytestmark = pytest.mark.timeout(30)


_made: list[Any] = []


class _Recorder(PooledActor):
    """Records (message, thread name); "block" holds the actor until `gate` is set."""

    def __init__(self, pool: ActorPool, gate: threading.Event, seen: list[Any]) -> None:
        super().__init__()
        self.actor_pool = pool
        self.gate = gate
        self.seen = seen
        self.during: Any = None  # run inside the message "call": tells the actor meanwhile
        _made.append(self)

    def goes_ahead(self, message: Any) -> bool:
        return False

    def is_background(self, message: Any) -> bool:
        return False

    def on_receive(self, message: Any) -> Any:
        if message == "block":
            self.gate.wait(10)
        if message == "call" and self.during is not None:
            self.during()
        self.seen.append((message, threading.current_thread().name))
        return None


@pytest.fixture
def pool() -> Iterator[ActorPool]:
    p = ActorPool(4, name="here-pool")
    yield p
    p.close()


def _idle(ref: Any) -> None:
    """Until the actor's first slice has run and it went idle."""
    ref.ask("started", timeout=10)
    inbox = ref.actor_inbox
    for _ in range(1000):
        with inbox._lock:
            if not inbox._scheduled:
                return
        threading.Event().wait(0.001)
    raise AssertionError("the actor never went idle")


def test_an_idle_actor_handles_the_message_on_the_callers_thread(pool: ActorPool) -> None:
    seen: list[Any] = []
    ref = _Recorder.start(pool, threading.Event(), seen)
    try:
        _idle(ref)
        actor = _made[-1]
        submitted: list[Any] = []
        real = pool.submit
        pool.submit = lambda fn: (submitted.append(fn), real(fn))  # type: ignore[method-assign]
        assert actor.handle_here("call") is True
        assert seen[-1] == ("call", threading.current_thread().name)
        assert submitted == []  # no pool thread was asked for
        # And the actor is idle again: a later tell runs on the pool as usual.
        ref.ask("after", timeout=10)
        assert seen[-1][0] == "after" and seen[-1][1].startswith("here-pool_")
    finally:
        ref.stop()


def test_a_busy_actor_refuses_and_keeps_its_order(pool: ActorPool) -> None:
    gate, seen = threading.Event(), []
    ref = _Recorder.start(pool, gate, seen)
    try:
        _idle(ref)
        ref.tell("block")
        ref.tell("queued")
        assert _made[-1].handle_here("call") is False
        gate.set()
        ref.ask("end", timeout=10)
        assert [m for m, _ in seen] == ["started", "block", "queued", "end"]
    finally:
        ref.stop()


def test_what_arrives_during_a_run_here_goes_to_the_pool_after_it(pool: ActorPool) -> None:
    seen: list[Any] = []
    ref = _Recorder.start(pool, threading.Event(), seen)
    try:
        _idle(ref)
        actor = _made[-1]
        here = threading.current_thread().name
        # Told while "call" runs here: not run on this thread, nor before "call" ends.
        actor.during = lambda: ref.tell("meanwhile")
        assert actor.handle_here("call") is True
        ref.ask("end", timeout=10)
        messages = [m for m, _ in seen]
        assert messages == ["started", "call", "meanwhile", "end"]
        assert dict(seen)["meanwhile"] != here
    finally:
        ref.stop()


def test_an_actor_not_started_or_stopped_refuses(pool: ActorPool) -> None:
    gate, seen = threading.Event(), []
    ref = _Recorder.start(pool, gate, seen)
    actor = _made[-1]
    ref.stop()
    assert actor.handle_here("call") is False
    assert ("call", threading.current_thread().name) not in seen
    fresh = _Recorder(pool, gate, seen)  # never started: no inbox owner, no slice yet
    assert fresh.handle_here("call") is False
