"""The host's end of a worker link is drained by `zmq.EVENTS` (`HostEnd.more`), not until a read
fails: every frame that arrived is read in one drain, a refused frame among them too, and the
drain ends with none left; a message is one frame, read by one socket call. Real ipc PAIRs (the
host's and a worker's)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from transport import worker_link
from transport.worker_link import HostEnd, encode, evt_msg, hello_msg, req_msg

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def link() -> Iterator[tuple[HostEnd, zmq.Socket[bytes]]]:
    ctx: zmq.Context[Any] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="ah-he-") as tmp:
        end = HostEnd(ctx, f"ipc://{Path(tmp) / 'w.sock'}")
        dealer: zmq.Socket[bytes] = ctx.socket(zmq.PAIR)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(end.endpoint)
        try:
            yield end, dealer
        finally:
            dealer.close(0)
            end.close()
            ctx.term()


def _drain(end: HostEnd) -> list[dict[str, Any]]:
    """The supervisor's drain: poll said a frame is there; read while `more` says so."""
    read = []
    while True:
        msg = end.recv()
        if msg is not None:
            read.append(msg)
        if not end.more():
            return read


def test_a_burst_is_read_in_one_drain_that_ends_with_nothing_left(
    link: tuple[HostEnd, zmq.Socket[bytes]],
) -> None:
    end, dealer = link
    assert not end.more()
    dealer.send(encode(hello_msg("tutti-agent", 1, "1")))
    deltas = [evt_msg("ws/s", {"type": "message.delta", "delta": f"d{n}"}) for n in range(5)]
    for msg in deltas[:2]:
        dealer.send(encode(msg))
    dealer.send(msgpack.packb({"t": "bogus"}))  # refused and dropped, mid-burst
    for msg in deltas[2:]:
        dealer.send(encode(msg))
    read: list[dict[str, Any]] = []
    while len(read) < 6:
        assert end.socket.poll(10_000)
        read += _drain(end)
    assert [m["t"] for m in read] == ["hello", *["evt"] * 5]
    assert [m["event"]["delta"] for m in read[1:]] == [f"d{n}" for n in range(5)]
    assert not end.more()


def test_a_request_leaves_by_the_sockets_own_send_not_send_multipart(
    link: tuple[HostEnd, zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's request goes out as the socket's own sends with int flags: pyzmq's
    `send_multipart` (its Python per part) is not entered, and the worker reads the frame."""
    end, dealer = link
    dealer.send(encode(hello_msg("tutti-agent", 1, "1")))
    assert end.socket.poll(10_000)
    assert [m["t"] for m in _drain(end)] == ["hello"]

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("send_multipart entered")

    monkeypatch.setattr(zmq.Socket, "send_multipart", refused)
    request = req_msg(7, "turn.start", {"x": 1})
    assert end.send(request)
    assert dealer.poll(10_000)
    assert msgpack.unpackb(dealer.recv(), raw=False) == request


def test_a_message_is_one_frame_read_by_one_socket_call(
    link: tuple[HostEnd, zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain of n messages makes n + 0 reads that succeed and n `zmq.EVENTS` looks, no other
    socket call: no identity frame to read, no `RCVMORE` to look at (a ROUTER's message took
    two `recv`s and a `RCVMORE` look)."""
    end, dealer = link
    dealer.send(encode(hello_msg("tutti-agent", 1, "1")))
    deltas = [evt_msg("ws/s", {"type": "message.delta", "delta": f"d{n}"}) for n in range(5)]
    for msg in deltas:
        dealer.send(encode(msg))
    calls: list[str] = []

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            calls.append(name if name != "get" else f"get {args[1]}")
            return fn(*args)

        return call

    monkeypatch.setattr(worker_link, "_recv", counted("recv", worker_link._recv))
    monkeypatch.setattr(worker_link, "_getsockopt", counted("get", worker_link._getsockopt))
    read: list[dict[str, Any]] = []
    while len(read) < 6:
        assert end.socket.poll(10_000)
        calls.clear()
        got = _drain(end)
        read += got
        # each read message: one recv, one EVENTS look (the last says none waits)
        assert calls == ["recv", f"get {int(zmq.EVENTS)}"] * len(got)
    assert [m["t"] for m in read] == ["hello", *["evt"] * 5]


def test_a_second_peer_is_refused_by_the_link(link: tuple[HostEnd, zmq.Socket[bytes]]) -> None:
    """The link's PAIR takes one peer: a second process connecting to the same endpoint (a
    stale incarnation's, say) gets nothing of it taken — ZeroMQ refuses the connection, where
    the ROUTER's identity check refused its frames."""
    end, worker = link
    worker.send(encode(hello_msg("tutti-agent", 1, "1")))
    assert end.socket.poll(10_000)
    assert [m["pid"] for m in _drain(end)] == [1]
    ctx = zmq.Context.instance()
    other: zmq.Socket[bytes] = ctx.socket(zmq.PAIR)
    other.setsockopt(zmq.LINGER, 0)
    try:
        other.connect(end.endpoint)
        other.send(encode(hello_msg("tutti-agent", 2, "1")), zmq.NOBLOCK)
        other.send(encode(evt_msg("ws/s", {"type": "message.delta", "delta": "x"})), zmq.NOBLOCK)
        worker.send(encode(evt_msg("ws/s", {"type": "message.delta", "delta": "mine"})))
        read: list[dict[str, Any]] = []
        deadline = 20
        while deadline and end.socket.poll(100):
            read += _drain(end)
            deadline -= 1
        assert [m["event"]["delta"] for m in read if m["t"] == "evt"] == ["mine"]
        assert all(m["t"] != "hello" for m in read)
    finally:
        other.close(0)
