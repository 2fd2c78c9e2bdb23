"""The events side hands an event only to the sockets some subscription was read from: a PUB
with none would drop it inside ZeroMQ, so the frames are not even handed over (one call and
one copy fewer per event on the transport loop). Real XPUB/SUB sockets over inproc."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
import zmq

import transport.server
from transport.server import EventSockets


class _Counting:
    """The transport's frame send, counted per socket (each message's frames together) and
    passed on."""

    def __init__(self) -> None:
        self.sent: dict[int, list[list[bytes]]] = defaultdict(list)
        self._open: dict[int, list[bytes]] = {}
        self._send = transport.server._send

    def __call__(self, sock: zmq.Socket[bytes], frame: bytes, flags: int = 0, **kw: Any) -> Any:
        parts = self._open.setdefault(id(sock), [])
        parts.append(bytes(frame))
        if not flags & zmq.SNDMORE:
            self.sent[id(sock)].append(list(parts))
            del self._open[id(sock)]
        return self._send(sock, frame, flags, **kw)


def _read_until(events: EventSockets, sock: zmq.Socket[bytes], done: Any) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the subscription never reached the socket"
        sock.poll(100)
        events.read_subscriptions(sock)


def test_an_event_goes_only_to_the_sockets_someone_subscribed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    events = EventSockets()
    plain, exact = events._socket(ctx), events._socket(ctx)
    plain.bind("inproc://plain")
    exact.bind("inproc://exact")
    events.pub, events.pub_exact = plain, exact
    sub = ctx.socket(zmq.SUB)
    sub_exact = ctx.socket(zmq.SUB)
    try:
        sub.connect("inproc://plain")
        sub.setsockopt(zmq.SUBSCRIBE, b"team")
        _read_until(events, plain, lambda: events.wants("team"))
        counted = _Counting()
        monkeypatch.setattr(transport.server, "_send", counted)
        events.send(b"team", b"one")
        assert sub.poll(10_000)
        assert sub.recv_multipart() == [b"team", b"one"]
        assert counted.sent[id(plain)] == [[b"team", b"one"]]
        assert counted.sent[id(exact)] == []  # nobody subscribed there: not handed the frames

        sub_exact.connect("inproc://exact")
        sub_exact.setsockopt(zmq.SUBSCRIBE, b"team\0")
        _read_until(events, exact, lambda: events._prefixes[1])
        events.send(b"team", b"two")
        assert sub_exact.poll(10_000)
        assert sub_exact.recv_multipart() == [b"team\0", b"two"]
        assert counted.sent[id(exact)] == [[b"team\0", b"two"]]
    finally:
        sub.close(0)
        sub_exact.close(0)
        events.close()
        ctx.term()


def test_wants_is_answered_once_per_topic_until_the_subscriptions_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A publisher asks `wants` for every event of a burst (a dozen times per fork); the answer
    is worked out from the prefixes once per topic and subscription set, and a subscription
    read (or dropped) is seen by the very next ask."""
    asked: list[str] = []
    work = EventSockets._wants

    def counting(topic: str, prefixes: Any) -> bool:
        asked.append(topic)
        return bool(work(topic, prefixes))

    monkeypatch.setattr(EventSockets, "_wants", staticmethod(counting))
    ctx: zmq.Context[Any] = zmq.Context()
    events = EventSockets()
    plain = events._socket(ctx)
    plain.bind("inproc://wants")
    events.pub = plain
    sub = ctx.socket(zmq.SUB)
    try:
        assert [events.wants("team") for _ in range(3)] == [False] * 3
        assert asked == ["team"]
        sub.connect("inproc://wants")
        sub.setsockopt(zmq.SUBSCRIBE, b"team")
        _read_until(events, plain, lambda: events.wants("team"))
        asked.clear()
        assert [events.wants("team") for _ in range(3)] == [True] * 3
        assert [events.wants("other") for _ in range(3)] == [False] * 3
        assert asked == ["other"]
        sub.setsockopt(zmq.UNSUBSCRIBE, b"team")
        _read_until(events, plain, lambda: not events.wants("team"))
        assert not events.wants("team")
        for n in range(transport.server.WANTED_TOPICS_KEPT + 10):  # kept answers are bounded
            events.wants(f"ws-{n}")
        assert len(events._wanted[1]) <= transport.server.WANTED_TOPICS_KEPT
    finally:
        sub.close(0)
        events.close()
        ctx.term()
