"""What a pooled actor's slice costs per message: the bookkeeping the pool does around each
message on the actor's thread, counted (a Turn is ~8.5 messages in ~6.5 slices)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actors.pool import ActorPool, PooledActor


class _Log:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.background_asked = 0
        self.seen: list[Any] = []


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
