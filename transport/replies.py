"""Replies: the one-shot responder a dispatcher answers through, and the ROUTER side that
sends each reply to its client without ever blocking the transport loop.

A client that does not read cannot grow the daemon: ZeroMQ queues at most `PEER_REPLY_HWM`
replies per connection and, of large ones, at most `MAX_QUEUED_BYTES` not yet written to its
socket (each tracked until ZeroMQ has written it); further replies wait in a per-client backlog
(kept in order, counted in that client's in-flight budget) up to `MAX_UNREAD_BYTES`, past which
they are dropped. So one connection holds at most 8 MiB of small replies, 8 MiB of large ones
and 16 MiB of backlog, plus one reply over each bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import zmq

from domain.errors import HostError, internal_error
from protocol.envelope import encode_result, encode_result_packed
from transport.wire import encode_error

RECENTLY_ANSWERED_S = 10.0
"""A client answered this recently is talking: the fd guard never sheds its connection (a
request it sent right after the answer may be in ZeroMQ's pipe, not yet read)."""
MAX_ANSWERED_PEERS = 4096
"""Past this many clients remembered, the ones answered long ago are forgotten."""
log = logging.getLogger("transport.server")

PEER_REPLY_HWM = 32
"""Replies queued in ZeroMQ per client connection; past it, replies wait in a per-client
backlog counted in that client's in-flight budget."""
MAX_QUEUED_BYTES = 8 << 20
"""Bytes of large replies (`TRACKED_BYTES` and up) a client may have in ZeroMQ's queue not yet
written to its socket: a further reply waits in its backlog until they are (ZeroMQ bounds its
pipe in messages only, whatever their size)."""
TRACKED_BYTES = 256 << 10
"""Replies from this size on are handed to ZeroMQ without a copy and tracked until it has
written them; smaller ones (at most `PEER_REPLY_HWM` of them queued) are not."""
MAX_UNREAD_BYTES = 16 << 20
"""Reply bytes kept for a client that does not read, beyond the 32 replies ZeroMQ queues:
while it has this much, its new requests are refused without being run, and a further reply
to it is dropped (it is not reading) — so its unread replies cannot grow the daemon (issue
15 #6: 5.9 GB from one DEALER sending `session.list` and never reading). A client that reads
only drains its backlog, bursts of small replies included."""


_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
# The socket's own send, below pyzmq's Python `Socket.send` (which only adds the routing_id
# and group arguments we never use): one reply is 2-3 sends, on the hot path of every read.
_send: Callable[..., Any] = zmq.backend.Socket.send


def send_parts(router: zmq.Socket[bytes], envelope: list[bytes], frame: bytes) -> Any:
    """`router.send_multipart([*envelope, frame], NOBLOCK)` with int flags and the backend's
    send. With ROUTER_MANDATORY only the first part (the identity) can fail — EAGAIN for a
    full peer pipe, EHOSTUNREACH for a vanished peer — and then nothing was sent. Returns the
    `zmq.MessageTracker` of a frame of `TRACKED_BYTES` or more, else None."""
    for part in envelope:
        _send(router, part, _SNDMORE_NOBLOCK)
    if len(frame) >= TRACKED_BYTES:
        return _send(router, frame, _NOBLOCK, copy=False, track=True)
    _send(router, frame, _NOBLOCK)
    return None


class Responder(Protocol):
    """Answers one request, exactly once, from any thread."""

    def result(self, status: int, result: Mapping[str, Any]) -> bool: ...

    def error(self, error: HostError) -> bool: ...


class OneShotResponder:
    """The responder handed to the dispatcher; the first answer wins, later ones are ignored.

    `post(token, frame)` delivers the encoded reply (on the loop thread it is sent at once)."""

    __slots__ = ("_post", "_token", "_request_id", "_answered", "_lock")

    def __init__(self, post: Callable[[int, bytes], bool], token: int, request_id: str) -> None:
        self._post = post
        self._token = token
        self._request_id = request_id
        self._answered = False
        self._lock = threading.Lock()

    @property
    def answered(self) -> bool:
        return self._answered

    def _claim(self) -> bool:
        with self._lock:
            if self._answered:
                return False
            self._answered = True
            return True

    def result(self, status: int, result: Mapping[str, Any]) -> bool:
        """Send a 2xx reply. Returns False if this request was already answered."""
        if not self._claim():
            log.warning("request %s answered twice; ignoring the second answer", self._request_id)
            return False
        try:
            frame = encode_result(self._request_id, status, result)
        except Exception as exc:  # noqa: BLE001 - the request is still answered, typed
            what = f"encoding the result of request {self._request_id}"
            frame = encode_error(self._request_id, internal_error(exc, what, logger=log))
        return self._post(self._token, frame)

    def result_packed(self, status: int, packed_result: bytes) -> bool:
        """`result` of a result map already packed (`protocol.envelope.pack_result`)."""
        if not self._claim():
            log.warning("request %s answered twice; ignoring the second answer", self._request_id)
            return False
        return self._post(
            self._token, encode_result_packed(self._request_id, status, packed_result)
        )

    def error(self, error: HostError) -> bool:
        """Send an error reply. Returns False if this request was already answered."""
        if not self._claim():
            log.warning("request %s answered twice; ignoring the second answer", self._request_id)
            return False
        return self._post(self._token, encode_error(self._request_id, error))


class ReplyRouter:
    """The ROUTER's sending side and each client's budget; used by the loop thread only."""

    def __init__(self) -> None:
        self.router: zmq.Socket[bytes] | None = None
        # Per client identity: requests in flight, and replies ZeroMQ could not queue yet.
        self.peer_in_flight: dict[bytes, int] = {}
        # When each client last got an answer: a connection answered this recently is not idle
        # (its next request may already sit in ZeroMQ's pipe; shedding it would lose that).
        self.answered_at: dict[bytes, float] = {}
        self.backlog: dict[bytes, list[tuple[list[bytes], bytes]]] = {}
        self.backlog_bytes: dict[bytes, int] = {}
        # Per client: large replies ZeroMQ holds, until its tracker says they are written.
        self.queued: dict[bytes, list[tuple[Any, int]]] = {}

    def queued_bytes(self, peer: bytes) -> int:
        """Bytes of this client's large replies ZeroMQ has not yet written to its socket."""
        held = self.queued.get(peer)
        if held is None:
            return 0
        held[:] = [(tracker, size) for tracker, size in held if not tracker.done]
        if not held:
            del self.queued[peer]
            return 0
        return sum(size for _, size in held)

    def _room(self, peer: bytes, size: int) -> bool:
        """Whether ZeroMQ may take a reply of `size` for this client now: one at a time past
        `MAX_QUEUED_BYTES` (a single large reply always goes once the queue is written)."""
        if size < TRACKED_BYTES and peer not in self.queued:
            return True
        queued = self.queued_bytes(peer)
        return queued == 0 or queued + size <= MAX_QUEUED_BYTES

    def _sent(self, peer: bytes, tracker: Any, size: int) -> None:
        if tracker is not None:
            self.queued.setdefault(peer, []).append((tracker, size))

    def unread(self, peer: bytes) -> bool:
        """Whether a request or a reply of this client is pending, or it was answered within
        `RECENTLY_ANSWERED_S` (any thread; approximate)."""
        if self.peer_load(peer) > 0 or peer in self.queued:
            return True
        at = self.answered_at.get(peer)
        return at is not None and time.monotonic() - at < RECENTLY_ANSWERED_S

    def peer_load(self, peer: bytes) -> int:
        """What counts against a client's budget: its requests in flight and its replies
        that ZeroMQ could not queue because it does not read."""
        return self.peer_in_flight.get(peer, 0) + len(self.backlog.get(peer, ()))

    def not_reading(self, peer: bytes) -> bool:
        return self.backlog_bytes.get(peer, 0) >= MAX_UNREAD_BYTES

    def started(self, peer: bytes) -> None:
        self.peer_in_flight[peer] = self.peer_in_flight.get(peer, 0) + 1

    def finished(self, peer: bytes) -> None:
        left = self.peer_in_flight.get(peer, 1) - 1
        if left > 0:
            self.peer_in_flight[peer] = left
        else:
            self.peer_in_flight.pop(peer, None)
        now = time.monotonic()
        self.answered_at[peer] = now
        if len(self.answered_at) > MAX_ANSWERED_PEERS:
            self.answered_at = {
                p: t for p, t in self.answered_at.items() if now - t < RECENTLY_ANSWERED_S
            }

    def send_now(self, envelope: list[bytes], frame: bytes, *, backlog: bool = True) -> None:
        assert self.router is not None
        peer = envelope[0]
        pending = self.backlog.get(peer)
        if pending is None and not self._room(peer, len(frame)):
            if not backlog:
                return  # an overload refusal to a client that does not read: not kept
            pending = self.backlog[peer] = []  # ZeroMQ holds enough of its bytes: wait
        if pending is not None:
            if backlog and self.backlog_bytes.get(peer, 0) < MAX_UNREAD_BYTES:
                pending.append((envelope, frame))  # keep the connection's reply order
                self.backlog_bytes[peer] = self.backlog_bytes.get(peer, 0) + len(frame)
            elif backlog:
                log.warning("a client that does not read: reply dropped (%d unread)", len(pending))
            return
        try:
            self._sent(peer, send_parts(self.router, envelope, frame), len(frame))
        except zmq.Again:
            if backlog:
                self.backlog[peer] = [(envelope, frame)]
                self.backlog_bytes[peer] = len(frame)
        except zmq.ZMQError as exc:
            # A vanished peer must never take the loop down.
            log.debug("reply dropped: %s", exc)

    def flush_backlogs(self) -> None:
        assert self.router is not None
        for peer, pending in list(self.backlog.items()):
            while pending:
                envelope, frame = pending[0]
                if not self._room(peer, len(frame)):
                    break
                try:
                    self._sent(peer, send_parts(self.router, envelope, frame), len(frame))
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    pending.clear()  # the peer is gone: its replies have no reader
                    break
                pending.pop(0)
                self.backlog_bytes[peer] = self.backlog_bytes.get(peer, 0) - len(frame)
            if not pending:
                del self.backlog[peer]
                self.backlog_bytes.pop(peer, None)
