"""The pooled actors' inbox lets a message the actor marks `goes_ahead` pass the background
messages waiting at the back (so a Session's rename does not wait behind its
Turn's driver events), never another message, and at most `MAX_AHEAD` times in a row."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from actors.messages import DriverEvent, FollowUp, Mutate, Submit
from actors.pool import MAX_AHEAD, ActorPool, PooledActor
from actors.session_actor import SessionActor
from actors.session_base import RetryDurable
from domain.turn_events import TurnActivity


class _Recorder(PooledActor):
    """Requests are ("req", n), background messages ("bg", n); "block" holds the actor until
    the test releases it, so everything after it is queued at once."""

    def __init__(
        self, pool: ActorPool, gate: threading.Event, done: threading.Event, seen: list[Any]
    ) -> None:
        super().__init__()
        self.actor_pool = pool
        self.gate = gate
        self.done = done
        self.seen = seen

    def goes_ahead(self, message: Any) -> bool:
        return isinstance(message, tuple) and message[0] == "req"

    def is_background(self, message: Any) -> bool:
        return isinstance(message, tuple) and message[0] == "bg"

    def on_receive(self, message: Any) -> Any:
        if message == "block":
            self.gate.wait(10)
        elif message == "end":
            self.done.set()
        else:
            self.seen.append(message)
        return None


@pytest.fixture
def pool() -> Iterator[ActorPool]:
    p = ActorPool(4, name="test-pool")
    yield p
    p.close()


def _handled(pool: ActorPool, messages: list[Any]) -> list[Any]:
    gate, done, seen = threading.Event(), threading.Event(), []
    ref = _Recorder.start(pool, gate, done, seen)
    try:
        ref.tell("block")
        for message in messages:
            ref.tell(message)
        ref.tell("end")
        gate.set()
        assert done.wait(10)
        return seen
    finally:
        ref.stop()


def test_requests_go_ahead_of_background_messages_and_keep_their_own_order(
    pool: ActorPool,
) -> None:
    sent = [("bg", 1), ("bg", 2), ("req", 1), ("bg", 3), ("req", 2)]
    assert _handled(pool, sent) == [("req", 1), ("req", 2), ("bg", 1), ("bg", 2), ("bg", 3)]


def test_a_request_never_passes_a_message_that_is_not_background(pool: ActorPool) -> None:
    sent = [("bg", 1), ("other", 1), ("bg", 2), ("req", 1)]
    assert _handled(pool, sent) == [("bg", 1), ("other", 1), ("req", 1), ("bg", 2)]


def test_background_messages_wait_behind_at_most_max_ahead_requests(pool: ActorPool) -> None:
    requests = [("req", i) for i in range(MAX_AHEAD + 2)]
    got = _handled(pool, [("bg", 1), *requests, ("bg", 2), ("req", 99)])
    # Eight pass the first background message; the rest (and any request after them, while
    # it is still queued) wait behind it.
    assert got == [*requests[:MAX_AHEAD], ("bg", 1), *requests[MAX_AHEAD:], ("bg", 2), ("req", 99)]


def test_the_count_starts_again_once_a_background_message_was_handled(pool: ActorPool) -> None:
    gate, done, seen = threading.Event(), threading.Event(), []
    ref = _Recorder.start(pool, gate, done, seen)
    try:
        ref.tell("block")
        ref.tell(("bg", 1))
        requests = [("req", i) for i in range(MAX_AHEAD)]
        for request in requests:
            ref.tell(request)
        answered = ref.ask("sync", block=False)  # an ask queues at the back
        gate.set()
        answered.get(timeout=10)
        gate.clear()
        ref.tell("block")
        ref.tell(("bg", 2))
        ref.tell(("req", 99))
        ref.tell("end")
        gate.set()
        assert done.wait(10)
        assert seen == [*requests, ("bg", 1), "sync", ("req", 99), ("bg", 2)]
    finally:
        ref.stop()


def test_a_session_actor_lets_plain_mutations_pass_its_turns_events_only() -> None:
    actor = cast(SessionActor, object.__new__(SessionActor))
    title = Mutate(lambda: None, lambda _r: None)
    delete = Mutate(lambda: None, lambda _r: None, stop_runtime=True)
    assert actor.goes_ahead(title)
    assert not actor.goes_ahead(delete)
    assert not actor.goes_ahead(Submit("r", "text", lambda _r: None))
    assert actor.is_background(DriverEvent(TurnActivity("t")))
    assert actor.is_background(RetryDurable())
    assert actor.is_background(FollowUp(lambda: None))
    # A request's own continuation (it carries the request's reply) is not passed.
    assert not actor.is_background(FollowUp(lambda: None, reply=lambda _r: None))
    assert not actor.is_background(title)


def test_an_ask_is_never_moved(pool: ActorPool) -> None:
    gate, done, seen = threading.Event(), threading.Event(), []
    ref = _Recorder.start(pool, gate, done, seen)
    try:
        ref.tell("block")
        ref.tell(("bg", 1))
        answered = ref.ask(("req", 1), block=False)
        ref.tell("end")
        gate.set()
        assert done.wait(10)
        answered.get(timeout=10)
        assert seen == [("bg", 1), ("req", 1)]
    finally:
        ref.stop()
