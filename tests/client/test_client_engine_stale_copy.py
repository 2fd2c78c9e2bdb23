"""The Engine against copies of one fork operation arriving out of order, without a daemon: the
`fork.resolve` reply (on the caller's thread) and the `fork.operation` events (on the event
pump's) race, so the `unknown` event that `fork.resolve` publishes as it begins an Abandon can
be handled after the reply that says `abandoned`. A terminal status is final: that late copy
must not put the `unknown` mark back, nor move the settled record back to `unknown` (a loaded
CI run's GUI showed the mark again after Abandon)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from client.engine.changes import ChangeFeed
from client.engine.lifecycle import Engine
from client.engine.unknown import UnknownOperations
from client.engine.values import ChangeKind, EngineChange, MutationStatus
from protocol.events import FORK_OPERATION
from protocol.methods import Method
from tests.client.fakeclock import FakeClock
from transport.client import Reply

WS, SID, TURN, OP = "ws-stale", "sess-1", "turn-1", "op-1"


def operation(status: str, **extra: Any) -> dict[str, Any]:
    """A wire operation of the fork through `TURN`, in `status`."""
    return {
        "operationId": OP,
        "requestId": "req-other",
        "sourceAgentSessionId": SID,
        "targetAgentSessionId": "target-other",
        "point": {"type": "throughTurn", "turnId": TURN},
        "status": status,
        "phase": {"unknown": "deliveryUnknown", "abandoned": "abandoned"}.get(status, status),
        **extra,
    }


class ScriptedApi:
    """An `ApiPort` answering each method with the next scripted result, at once."""

    def __init__(self) -> None:
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.sent: list[str] = []

    def submit(self, method: Method[Any, Any], params: Any) -> Future[Reply[Any]]:
        self.sent.append(method.name)
        future: Future[Reply[Any]] = Future()
        future.set_result(Reply(200, self.results[method.name].pop(0)))
        return future


@pytest.fixture
def api() -> ScriptedApi:
    return ScriptedApi()


@pytest.fixture
def engine(api: ScriptedApi) -> Iterator[Engine]:
    e = Engine(api, WS, scheduler=FakeClock())
    try:
        yield e
    finally:
        e.close()


def marked_unknown(engine: Engine, api: ScriptedApi) -> None:
    """This Engine's Fork click on `TURN` answered with another client's `unknown` operation
    (the boundary barrier): the Turn is marked and the record is `unknown`."""
    api.results["fork.create"] = [{"operation": operation("unknown")}]
    engine.fork(SID, TURN)
    assert list(engine.unknown_operations(SID)) == [TURN]
    record = engine.mutation(SID, TURN)
    assert record is not None and record.status is MutationStatus.UNKNOWN
    assert record.operation_id == OP


def event(status: str) -> Any:
    return {"type": FORK_OPERATION, "operation": operation(status)}


def abandon(engine: Engine, api: ScriptedApi) -> None:
    api.results["fork.resolve"] = [{"operation": operation("abandoned"), "evidence": {}}]
    result = engine.resolve(OP, "abandon")
    assert result["operation"]["status"] == "abandoned"


def assert_freed(engine: Engine) -> None:
    assert engine.unknown_operations(SID) == {}
    record = engine.mutation(SID, TURN)
    assert record is not None and record.status is MutationStatus.FAILED, record
    assert not engine.is_fork_pending(SID, TURN)


def test_an_unknown_event_handled_after_the_abandon_reply_puts_no_mark_back(
    engine: Engine, api: ScriptedApi
) -> None:
    marked_unknown(engine, api)
    changes: list[EngineChange] = []
    engine.subscribe(changes.append)
    abandon(engine, api)
    assert_freed(engine)
    # The event fork.resolve published as it began the Abandon (read back before the commit),
    # handled only now: stale. Before the fix it marked the Turn again and made the record
    # `unknown` until the `abandoned` event came (forever, had that one been lost).
    engine.handle_event(event("unknown"))
    assert_freed(engine)
    engine.handle_event(event("abandoned"))
    assert_freed(engine)
    marks = [c for c in changes if c.kind is ChangeKind.OPERATION]
    assert len(marks) == 1, marks  # the reply's removal only: no mark shown again meanwhile


def test_the_abandoned_event_before_the_reply_frees_the_turn_too(
    engine: Engine, api: ScriptedApi
) -> None:
    marked_unknown(engine, api)
    engine.handle_event(event("unknown"))  # the one published as the Abandon began
    engine.handle_event(event("abandoned"))
    assert_freed(engine)
    abandon(engine, api)
    assert_freed(engine)


def test_an_unknown_copy_still_marks_when_no_terminal_copy_was_seen(
    engine: Engine, api: ScriptedApi
) -> None:
    engine.handle_event(event("unknown"))  # another client's fork, heard by event only
    assert list(engine.unknown_operations(SID)) == [TURN]
    engine.handle_event(event("abandoned"))
    assert engine.unknown_operations(SID) == {}


def test_the_terminal_memory_is_bounded_oldest_first() -> None:
    feed = ChangeFeed()
    index = UnknownOperations(feed, final_remembered=2)
    with feed.lock:
        for op_id in ("a", "b", "c"):
            index.note_locked({**operation("abandoned"), "operationId": op_id})
        stale = [
            index.is_stale_locked({**operation("unknown"), "operationId": op_id})
            for op_id in ("a", "b", "c")
        ]
    assert stale == [False, True, True]
