"""The client decodes each event once, on its SUB socket, into the `protocol.events` types: a
known event arrives as its TypedDict, one the client does not know (a newer daemon's type, a
known type missing a key its type requires) as an `UnknownEvent` that says why — kept, never a
crash — and the events after it still arrive, through the subscriber and the Engine alike."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import msgpack
import pytest
import zmq

from client.engine.lifecycle import Engine
from client.engine.values import ChangeKind, EngineChange
from protocol.envelope import decode_event
from protocol.events import ClientEvent, UnknownEvent
from transport.client import EventSubscriber

pytestmark = pytest.mark.timeout(30)

SESSION: dict[str, Any] = {
    "workspaceId": "ws",
    "agentSessionId": "s-1",
    "kind": "root",
    "provider": "tutti-agent",
    "providerSessionId": None,
    "title": "t",
    "cwd": "/",
    "settings": {},
    "model": None,
    "pinned": False,
    "goal": None,
    "activeTurnId": None,
    "parentAgentSessionId": None,
    "parentTurnId": None,
    "createdAtUnixMs": 1,
    "updatedAtUnixMs": 1,
    "lifecycleCapabilities": {"fork": True, "forkThroughTurn": True, "forkFullSession": True},
    "forkedFrom": None,
}
NEWER = {"type": "session.archived", "agentSessionId": "s-1", "archivedAtUnixMs": 5}
MALFORMED = {"type": "turn.updated", "agentSessionId": "s-1"}  # no `turn`
DELTA = {
    "type": "message.delta",
    "agentSessionId": "s-1",
    "turnId": "t-1",
    "itemId": "i-1",
    "kind": "assistant",
    "delta": "hel",
}


@pytest.fixture
def pub() -> Iterator[tuple[zmq.Socket[bytes], str]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, f"tcp://127.0.0.1:{port}"
    sock.close()
    ctx.term()


def publish_until_joined(sock: zmq.Socket[bytes], seen: Any) -> None:
    """Publish a marker until the subscriber has one (ZeroMQ's slow joiner)."""
    marker = msgpack.packb({"type": "session.removed", "agentSessionId": "joined"})
    deadline = time.monotonic() + 10
    while not seen() and time.monotonic() < deadline:
        sock.send_multipart([b"ws", marker])
        time.sleep(0.02)
    assert seen(), "the subscriber never joined"


def send(sock: zmq.Socket[bytes], *events: object) -> None:
    for event in events:
        sock.send_multipart([b"ws", msgpack.packb(event)])


def test_decoding_types_known_events_and_keeps_unknown_ones_whole() -> None:
    assert decode_event(msgpack.packb(DELTA)) == DELTA
    assert decode_event(msgpack.packb(NEWER)) == UnknownEvent(
        "session.archived", NEWER, "unknown type"
    )
    assert decode_event(msgpack.packb(MALFORMED)) == UnknownEvent(
        "turn.updated", MALFORMED, "'turn' is not a dict"
    )
    assert decode_event(msgpack.packb({"type": 3})).problem == "no string 'type'"
    assert decode_event(b"\xc1").problem.startswith("not msgpack")


def test_the_subscriber_hands_on_typed_events_and_unknown_ones_without_stopping(
    pub: tuple[zmq.Socket[bytes], str],
) -> None:
    sock, endpoint = pub
    with EventSubscriber(endpoint, ["ws"]) as sub:
        got: list[ClientEvent] = []

        heard: list[object] = []

        def joined() -> bool:
            if not heard and sub.next_message(0.05) is not None:
                heard.append(True)
            return bool(heard)

        publish_until_joined(sock, joined)
        send(sock, NEWER, MALFORMED, DELTA, {"type": "session.upserted", "session": SESSION})
        while len(got) < 4:
            event = sub.next(5.0)
            assert event is not None
            if isinstance(event, dict) and event.get("agentSessionId") == "joined":
                continue
            got.append(event)
    assert got == [
        UnknownEvent("session.archived", NEWER, "unknown type"),
        UnknownEvent("turn.updated", MALFORMED, "'turn' is not a dict"),
        DELTA,
        {"type": "session.upserted", "session": SESSION},
    ]


def test_the_engine_keeps_an_unknown_event_and_applies_the_next(
    pub: tuple[zmq.Socket[bytes], str],
) -> None:
    class NoApi:
        def submit(self, method: object, params: object) -> Future[Any]:
            raise AssertionError("events alone send nothing")

    sock, endpoint = pub
    engine = Engine(NoApi(), "ws")  # type: ignore[arg-type]
    seen: list[ClientEvent] = []
    lock = threading.Lock()

    def listen(change: EngineChange) -> None:
        if change.kind is ChangeKind.EVENT and change.event is not None:
            with lock:
                seen.append(change.event)

    engine.subscribe(listen)
    try:
        engine.attach_events(endpoint)
        publish_until_joined(sock, lambda: bool(seen))
        child = {**SESSION, "agentSessionId": f"s-{uuid.uuid4()}"}
        send(sock, NEWER, {"type": "session.upserted", "session": child})
        assert engine.wait_for(lambda: engine.session(child["agentSessionId"]) is not None, 10)
        with lock:
            unknown = [e for e in seen if isinstance(e, UnknownEvent)]
        assert unknown == [UnknownEvent("session.archived", NEWER, "unknown type")]
    finally:
        engine.close()
