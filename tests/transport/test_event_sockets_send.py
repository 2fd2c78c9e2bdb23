"""The events side hands an event only to the sockets some subscription was read from: a PUB
with none would drop it inside ZeroMQ, so the frames are not even handed over (one call and
one copy fewer per event on the transport loop). Real XPUB/SUB sockets over inproc."""

from __future__ import annotations

import time
from typing import Any

import zmq

from transport.server import EventSockets


class _Counting:
    """A socket whose sends are counted and passed on."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> Any:
        self.sent.append(list(frames))
        return self.sock.send_multipart(frames, flags)


def _read_until(events: EventSockets, sock: zmq.Socket[bytes], done: Any) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the subscription never reached the socket"
        sock.poll(100)
        events.read_subscriptions(sock)


def test_an_event_goes_only_to_the_sockets_someone_subscribed_on() -> None:
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
        counted_plain, counted_exact = _Counting(plain), _Counting(exact)
        events.pub, events.pub_exact = counted_plain, counted_exact  # type: ignore[assignment]
        events.send(b"team", b"one")
        assert sub.poll(10_000)
        assert sub.recv_multipart() == [b"team", b"one"]
        assert counted_plain.sent == [[b"team", b"one"]]
        assert counted_exact.sent == []  # nobody subscribed there: not handed the frames

        events.pub, events.pub_exact = plain, exact
        sub_exact.connect("inproc://exact")
        sub_exact.setsockopt(zmq.SUBSCRIBE, b"team\0")
        _read_until(events, exact, lambda: events._prefixes[1])
        events.pub, events.pub_exact = counted_plain, counted_exact  # type: ignore[assignment]
        events.send(b"team", b"two")
        assert sub_exact.poll(10_000)
        assert sub_exact.recv_multipart() == [b"team\0", b"two"]
        assert counted_exact.sent == [[b"team\0", b"two"]]
    finally:
        events.pub, events.pub_exact = plain, exact
        sub.close(0)
        sub_exact.close(0)
        events.close()
        ctx.term()
