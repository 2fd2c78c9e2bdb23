"""The daemon's client-facing API server: one transport thread owns the ROUTER (API) and the
events sockets, decodes requests and hands each to a dispatcher with a one-shot responder.

It never blocks on work: replies and events from any thread reach the loop through an outbox
(a deque of Python objects, no encoding into ZeroMQ frames) whose first entry since the loop
last looked writes its wake-up eventfd (polled as a plain descriptor: a ZeroMQ socket in the
poll set costs system calls at every wake-up), and every failure of a request becomes a typed
error reply (law 7). A reply given during dispatch (the point reads,
every validation error) is sent at once, without the outbox. The loop blocks in one `zmq_poll`
with no timeout while there is nothing to do (it wakes on a request, the wake-up descriptor, or a
subscription); only a client with unread replies backlogged makes it retry every 50 ms, and
an outbox left longer than one wake-up's bound makes it look again without blocking. It reads
no socket past what it knows is there (`zmq.EVENTS`), so a drain ends without a failed read:
each read lets the interpreter go, and each failed one raised `zmq.Again` besides.

Replies, here too: the one-shot responder a dispatcher answers through, and the ROUTER side
that sends each reply to its client without ever blocking the transport loop (`ReplyRouter`).
A client that does not read cannot grow the daemon: ZeroMQ queues at most `PEER_REPLY_HWM`
replies per connection and, of large ones, at most `MAX_QUEUED_BYTES` not yet written to its
socket (each tracked until ZeroMQ has written it); further replies wait in a per-client backlog
(kept in order, counted in that client's in-flight budget) up to `MAX_UNREAD_BYTES`, past which
they are dropped. So one connection holds at most 8 MiB of small replies, 8 MiB of large ones
and 16 MiB of backlog, plus one reply over each bound.

One exception to "the loop sends": an event handed over by `publish_now` (a streamed delta,
on the worker supervisor's thread) is sent on the XPUBs by that thread itself when no event
handed to the loop before it is still in the outbox, so it wakes no transport thread; the
XPUBs are guarded by one lock for that (`_xpub_lock`), and events leave in the order they were
handed over either way.

Events, here too: the PUB sockets the loop owns (`EventSockets`: one with bare workspace
topics, an optional second one with terminated topics `workspaceId + "\\0"`) and who is
subscribed to what. They are XPUB sockets: publishing is exactly PUB's (prefix filtering by
ZeroMQ, `EVENTS_HWM` per subscriber), and they also hand the loop each subscription made or
dropped. Without verbose mode ZeroMQ reports a topic's first subscriber and its last
unsubscription (a disconnecting subscriber's subscriptions are dropped for it), so the set of
topics read from them is "some connected client wants this prefix". `wants(topic)` answers
from that set, from any thread, and the daemon's publisher skips the store reads and
projection of an event no one would receive. A subscription that reaches the daemon after an
event was skipped misses it, as it would miss it on a plain PUB (ZeroMQ's slow joiner).

The other parts, by concern: `transport.endpoints` (ipc files, bind order),
`transport.security` (CURVE, ZAP), `transport.wire` (the envelope).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import zmq

from domain.errors import HostError, Unavailable, internal_error
from protocol.envelope import Request, encode_event, encode_result, encode_result_packed, peek_id
from protocol.events import Event
from transport import accept_shim
from transport.connections import ConnectionGuard, ConnectionLimits
from transport.endpoints import Binder, EndpointInUse, rebind_missing
from transport.security import ServerCurve, needs_curve, start_authenticator
from transport.wire import WireReason, decode_request, encode_error
from transport.zmq_options import install as _fast_options

_fast_options()  # the daemon's option looks without an enum call each

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_IN_FLIGHT_PER_CLIENT",
    "EVENTS_HWM",
    "HARD_MAX_MESSAGE",
    "MAX_EVENT_BYTES",
    "MAX_UNREAD_BYTES",
    "PEER_REPLY_HWM",
    "ApiServer",
    "Dispatcher",
    "EndpointInUse",
    "EventSockets",
    "OneShotResponder",
    "Responder",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 10_000
# Frames past this are dropped by libzmq with the peer's connection (a memory guard); frames
# between MAX_FRAME and this still get a proper 413 reply.
HARD_MAX_MESSAGE = 64 << 20
_MAX_ENVELOPE_FRAMES = 32
_CLOSE_LINGER_MS = 1000
_BACKLOG_RETRY_MS = 50
DEFAULT_MAX_IN_FLIGHT_PER_CLIENT = 1024
"""Requests in flight plus replies it has not read, per client connection: past it the
client is refused (503 `overloaded`, retryable)."""

# A plain int: pyzmq's flag enums cost an enum construction per use on the hot path.
_NOBLOCK = int(zmq.NOBLOCK)
_SRCFD = int(zmq.SRCFD)

_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_FD = int(zmq.FD)

# What other threads hand the loop through its outbox (the first item of each entry).
_TAG_REPLY = 0  # (_TAG_REPLY, token, frame)
_TAG_EVENT = 1  # (_TAG_EVENT, [(topic, payload), ...])
_TAG_STOP = 2  # (_TAG_STOP,)
_TAG_REBIND = 3  # (_TAG_REBIND,)
_TAG_UNBIND = 4  # (_TAG_UNBIND, address)

_OUTBOX_BOUND = 10_000
"""Outbox entries the loop takes per wake-up at most, so requests are not starved by a flood
of replies and events (it looks again at once, without blocking, for the rest)."""


# --------------------------------------------------------------------------- replies

RECENTLY_ANSWERED_S = 10.0
"""A client answered this recently is talking: the fd guard never sheds its connection (a
request it sent right after the answer may be in ZeroMQ's pipe, not yet read)."""
MAX_ANSWERED_PEERS = 4096
"""Past this many clients remembered, the ones answered long ago are forgotten (and past twice
as many as the last such pass kept, when that was more)."""

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
to it is dropped (it is not reading) — so its unread replies cannot grow the daemon (5.9 GB
once, from one DEALER sending `session.list` and never reading). A client that reads
only drains its backlog, bursts of small replies included."""


_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
# The socket's own send, below pyzmq's Python `Socket.send` (which only adds the routing_id
# and group arguments we never use): one reply is 2-3 sends, on the hot path of every read.
_send: Callable[..., Any] = zmq.backend.Socket.send
_recv: Callable[..., Any] = zmq.backend.Socket.recv
_getsockopt: Callable[..., Any] = zmq.backend.Socket.get
_zmq_poll: Callable[..., list[tuple[Any, int]]] = zmq.backend.zmq_poll


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
        self._prune_at = MAX_ANSWERED_PEERS
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
        if tracker is None:
            return
        held = self.queued.get(peer)
        if held is None:
            # A client is only looked up again when it is sent another large reply: one that
            # went away would keep its entry for the daemon's life. So each new one first
            # forgets the clients whose large replies are all written.
            self.forget_written()
            held = self.queued[peer] = []
        held.append((tracker, size))

    def forget_written(self) -> None:
        """Forget the clients whose large replies ZeroMQ has all written: `queued` holds only
        clients with bytes still in ZeroMQ's queue (at most one per open connection)."""
        for peer in [p for p, held in self.queued.items() if all(t.done for t, _ in held)]:
            del self.queued[peer]

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
        if len(self.answered_at) > self._prune_at:
            self.answered_at = kept = {
                p: t for p, t in self.answered_at.items() if now - t < RECENTLY_ANSWERED_S
            }
            # The next pass only after as many answers again as it kept: with more clients
            # than the bound answered recently, a pass per answer was O(clients) per reply.
            self._prune_at = max(MAX_ANSWERED_PEERS, 2 * len(kept))

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


# --------------------------------------------------------------------------- events

EVENTS_HWM = 1000
"""Events queued per subscriber that does not read (PUB drops beyond it; a reading one keeps
up with bursts of hundreds): with events capped at `MAX_EVENT_BYTES` a subscriber that never
reads holds at most 1000 × 256 KiB of the daemon, typically far less (100,000 whole-Turn
events, unbounded, would take a daemon past 1 GB)."""
MAX_EVENT_BYTES = 256 << 10
WANTED_TOPICS_KEPT = 256
"""Topics whose `EventSockets.wants` answer is kept for the current subscriptions."""

_SUBSCRIBE = 1
_UNSUBSCRIBE = 0


class EventSockets:
    """Owned by the transport loop (sending and reading subscriptions); `wants` from any."""

    def __init__(self) -> None:
        self.pub: zmq.Socket[bytes] | None = None
        self.pub_exact: zmq.Socket[bytes] | None = None
        self.endpoints: list[str] = []
        self.exact_endpoints: list[str] = []
        self._topics: dict[zmq.Socket[bytes], set[bytes]] = {}
        # Swapped whole on each change, so readers on other threads never see it mid-update.
        self._prefixes: tuple[frozenset[bytes], frozenset[bytes]] = (frozenset(), frozenset())
        # `wants`' answers for these very prefixes (topic → answer), swapped with them in one
        # tuple: an answer is kept only in the map of the prefixes it was computed from.
        self._wanted: tuple[tuple[frozenset[bytes], frozenset[bytes]], dict[str, bool]] = (
            self._prefixes,
            {},
        )

    def bind(
        self,
        ctx: zmq.Context[Any],
        binder: Binder,
        endpoints: list[str],
        exact_endpoints: list[str],
        watch: Callable[[zmq.Socket[bytes]], None] | None = None,
    ) -> None:
        """Bind the sockets; `watch` is called with each before it binds (the connection
        guard counts what it accepts)."""
        self.pub = self._socket(ctx)
        if watch is not None:
            watch(self.pub)
        self.endpoints = binder.bind_each(self.pub, endpoints)
        if exact_endpoints:
            # The same bounds as the first socket: a subscriber that never reads costs the same.
            self.pub_exact = self._socket(ctx)
            if watch is not None:
                watch(self.pub_exact)
            self.exact_endpoints = binder.bind_each(self.pub_exact, exact_endpoints)

    def _socket(self, ctx: zmq.Context[Any]) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, EVENTS_HWM)
        self._topics[sock] = set()
        return sock

    @property
    def sockets(self) -> list[zmq.Socket[bytes]]:
        """The sockets the loop polls for subscription messages."""
        return [s for s in (self.pub, self.pub_exact) if s is not None]

    # -- subscriptions -----------------------------------------------------------------------

    def read_subscriptions(self, sock: zmq.Socket[bytes], limit: int = 1000) -> bool:
        """Apply the subscription messages waiting on `sock` (loop thread); True when it
        stopped at `limit` with more perhaps waiting."""
        topics = self._topics[sock]
        changed = False
        more = True
        for _ in range(limit):
            try:
                message = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                more = False
                break
            if not message:
                continue
            if message[0] == _SUBSCRIBE:
                topics.add(message[1:])
                changed = True
            elif message[0] == _UNSUBSCRIBE:
                topics.discard(message[1:])
                changed = True
        if changed:
            plain = frozenset(self._topics[self.pub]) if self.pub is not None else frozenset()
            exact = (
                frozenset(self._topics[self.pub_exact])
                if self.pub_exact is not None
                else frozenset()
            )
            self._prefixes = (plain, exact)
            self._wanted = (self._prefixes, {})
        return more

    def wants(self, topic: str) -> bool:
        """Whether some connected subscriber would receive an event published under `topic`
        (any thread; as of the last subscription the loop read). The answer is a function of
        the topic and the subscriptions only, so it is kept until they change (a publisher
        asks it for every event of a burst, a dozen times per fork: forkprof)."""
        prefixes, answers = self._wanted
        held = answers.get(topic)
        if held is None:
            held = self._wants(topic, prefixes)
            if len(answers) >= WANTED_TOPICS_KEPT:
                answers.clear()  # topics are workspace ids: a host with more asks again
            answers[topic] = held
        return held

    @staticmethod
    def _wants(topic: str, prefixes: tuple[frozenset[bytes], frozenset[bytes]]) -> bool:
        plain, exact = prefixes
        if not plain and not exact:
            return False
        raw = topic.encode("utf-8")
        if any(raw.startswith(prefix) for prefix in plain):
            return True
        if exact and b"\0" not in raw:
            terminated = raw + b"\0"
            return any(terminated.startswith(prefix) for prefix in exact)
        return False

    # -- sending -----------------------------------------------------------------------------

    def send(self, topic: bytes, payload: bytes) -> None:
        """Publish on each socket some subscription was read from (loop thread): one with
        none would drop the event itself, so it is not handed the frames at all (the window
        a subscription just made has is the one `wants` already has)."""
        assert self.pub is not None
        plain, exact = self._prefixes
        # The backend's send with int flags (a PUB never blocks: past its high-water mark it
        # drops for that subscriber), not `send_multipart`'s per-part Python.
        if plain:
            try:
                _send(self.pub, topic, _SNDMORE_NOBLOCK)
                _send(self.pub, payload, _NOBLOCK)
            except zmq.ZMQError as exc:
                log.debug("event dropped: %s", exc)
        if self.pub_exact is None or not exact or b"\0" in topic:
            # A topic holding NUL could still prefix-match another (workspace ids never hold
            # one: the API refuses it); such an event is not published terminated at all.
            return
        try:
            # The one encoding of the event, under its terminated topic.
            _send(self.pub_exact, topic + b"\0", _SNDMORE_NOBLOCK)
            _send(self.pub_exact, payload, _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("event dropped (exact): %s", exc)

    def send_now(self, frames: list[tuple[bytes, bytes]]) -> bool:
        """`send` each (topic, payload) in order (under the XPUB lock, off the loop thread),
        then whether a subscription waits unread on an XPUB they were handed to: a send there
        may have taken its descriptor's signal. An XPUB handed none kept its signal for the
        loop and is not looked at (a `zmq.EVENTS` look, one enum built inside pyzmq, per
        socket per streamed delta: turnall). The prefixes change only under the same lock."""
        send = self.send
        for topic, payload in frames:
            send(topic, payload)
        plain, exact = self._prefixes
        if plain and _getsockopt(self.pub, _EVENTS) & _POLLIN:
            return True
        return bool(
            exact and self.pub_exact is not None and _getsockopt(self.pub_exact, _EVENTS) & _POLLIN
        )

    def close(self) -> None:
        for sock in (self.pub, self.pub_exact):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close()
        self.pub = self.pub_exact = None
        self._topics.clear()
        self._prefixes = (frozenset(), frozenset())
        self._wanted = (self._prefixes, {})


# --------------------------------------------------------------------------- the server

Dispatcher = Callable[[Request, Responder], None]
"""Called on the transport thread for every decoded request; must not block. It answers
through the responder now or later (from any thread), or raises a HostError synchronously."""


class ApiServer:
    """ROUTER + PUB owned by one transport thread; see the module docstring.

    `start()` binds every endpoint (raising on failure) and returns; `close()` answers what is
    still in flight with 503 `shutting_down`, closes the sockets and removes ipc files.
    """

    def __init__(
        self,
        api_endpoints: list[str],
        events_endpoint: str,
        dispatcher: Dispatcher,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_per_client: int = DEFAULT_MAX_IN_FLIGHT_PER_CLIENT,
        context: zmq.Context[Any] | None = None,
        events_listen: list[str] | tuple[str, ...] = (),
        curve: ServerCurve | None = None,
        events_exact_endpoint: str | None = None,
        events_exact_listen: list[str] | tuple[str, ...] = (),
        connection_limits: ConnectionLimits | None = None,
    ) -> None:
        """`events_listen`: further endpoints of the events PUB socket. With `curve`, every
        non-ipc endpoint (API or events) is a CURVE server behind a ZAP handler.

        `events_exact_endpoint` (and `events_exact_listen`): the endpoints of a second PUB
        socket carrying the same events under a *terminated* topic, `workspaceId + "\0"`:
        a subscription to `team\0` cannot prefix-match `team-secret\0`. None
        and empty: no second socket.

        `connection_limits`: what the listeners may hold (`transport.connections`); None:
        derived from the soft descriptor limit at `start()`."""
        if not api_endpoints:
            raise ValueError("at least one API endpoint is required")
        self._api_requested = list(api_endpoints)
        self._events_requested = events_endpoint
        self._events_listen = list(events_listen)
        self._exact_requested = (
            [events_exact_endpoint, *events_exact_listen]
            if events_exact_endpoint is not None
            else list(events_exact_listen)
        )
        self._curve = curve
        self._auth: Any = None
        self._dispatcher = dispatcher
        self._max_in_flight = max_in_flight
        self._max_per_client = max_in_flight_per_client
        self._replies = ReplyRouter()
        self._events = EventSockets()
        self._binder = Binder(curve)
        self._connection_limits = connection_limits
        self._guard: ConnectionGuard | None = None
        self.wakeups = 0
        """Times the loop's poll returned (tests pin that an idle loop stays blocked)."""
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._push_lock = threading.Lock()
        self._wake_fd: int | None = None
        """The loop's wake-up: an eventfd it polls as a plain descriptor (a ZeroMQ socket in
        the poll set costs two `zmq.EVENTS` checks, each a system call or two, at every
        wake-up of the loop, and an inproc message its own pipe and signaller)."""
        # Entries for the loop (`_send_pipe`); `_signalled`: a wake-up was written since
        # the loop last cleared it (set under `_push_lock`, cleared by the loop before it
        # takes the entries, so an entry is never left without a wake-up after it).
        self._outbox: deque[tuple[Any, ...]] = deque()
        self._signalled = False
        self._events_sent = False
        """Events (or a re-bind) went out on the XPUBs since the loop last looked at their
        `zmq.EVENTS` (set by the loop, and by `publish_now` before it wakes the loop)."""
        self._xpub_lock = threading.Lock()
        """Guards the events sockets (`EventSockets`): the loop holds it for their every
        operation (sends, subscription reads, `zmq.EVENTS`, binds, close), `publish_now` for
        its sends on its caller's thread (a ZeroMQ socket may move between threads behind a
        full memory barrier, which the lock is)."""
        self._events_put = 0
        """Event entries put in the outbox (under `_push_lock`)."""
        self._events_done = 0
        """Of them, those the loop has sent or dropped (the loop only, after the send): while
        it is behind `_events_put`, an event handed over earlier is still in the outbox."""
        self.events_now = 0
        """Events `publish_now` sent on its caller's thread (tests and benches read it)."""
        self._router: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None
        self._term_in_loop = False
        self._endpoints: list[str] = []
        # token -> (routing envelope, request id) of every request not yet answered.
        self._in_flight: dict[int, tuple[list[bytes], str]] = {}
        self._next_token = 0
        self._closing = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()
        self._rebinds: list[Future[list[str]]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """The bound API endpoints (tcp wildcard ports resolved)."""
        return list(self._endpoints)

    @property
    def events_endpoint(self) -> str:
        return self._events.endpoints[0] if self._events.endpoints else ""

    @property
    def events_endpoints(self) -> list[str]:
        """Every bound events endpoint: `events_endpoint` first, then `events_listen`."""
        return list(self._events.endpoints)

    @property
    def events_exact_endpoints(self) -> list[str]:
        """Every bound endpoint of the terminated-topic events socket (empty: none)."""
        return list(self._events.exact_endpoints)

    @property
    def connections(self) -> ConnectionGuard | None:
        """What the listeners hold and refused (None before `start()`)."""
        return self._guard

    @property
    def in_flight(self) -> int:
        """Requests dispatched but not yet answered (read from any thread; approximate)."""
        return len(self._in_flight)

    def start(self) -> None:
        """Bind every endpoint and start the transport thread; raises if any bind fails."""
        with self._lifecycle_lock:
            if self._thread is not None or self._closed:
                raise RuntimeError("ApiServer.start() may be called once")
            try:
                self._bind_all()
            except BaseException:
                self._close_sockets()
                self._stop_authenticator()
                raise
            assert self._guard is not None
            self._guard.start()
            self._thread = threading.Thread(
                target=self._run, name="agenthost-transport", daemon=True
            )
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Answer in-flight requests with 503 shutting_down, close sockets, remove ipc files."""
        with self._lifecycle_lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None and threading.get_ident() == self._loop_ident:
                # Closed from a handler on the loop itself: the loop stops after this call.
                self._term_in_loop = self._own_context
                self._send_pipe((_TAG_STOP,))
                return
            if thread is not None:
                self._send_pipe((_TAG_STOP,))
                thread.join(timeout)
                if thread.is_alive():
                    log.error("transport thread did not stop within %.1fs", timeout)
            else:
                self._close_sockets()
            if thread is None or not thread.is_alive():
                self._stop_authenticator()
                if self._own_context:
                    self._ctx.term()

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- thread-safe entry points ------------------------------------------------------------

    def publish(self, topic: str, event: Event) -> bool:
        """Publish one event (topic frame + msgpack map) from any thread.

        Returns False if the server is not running. Raises TypeError if `event` cannot be
        encoded, in the caller's thread, so a bad event never reaches the loop.
        """
        return self.publish_many([(topic, event)])

    def publish_many(self, events: Sequence[tuple[str, Event]]) -> bool:
        """Publish several events, in order, with one hand-over to the loop (see `publish`)."""
        if not events:
            return True
        return self.publish_frames(
            [(topic.encode("utf-8"), encode_event(event)) for topic, event in events]
        )

    def publish_frames(self, frames: list[tuple[bytes, bytes]]) -> bool:
        """`publish_many` of events already encoded: (topic, `encode_event` body) pairs."""
        return self._send_pipe((_TAG_EVENT, frames))

    def publish_now(self, frames: list[tuple[bytes, bytes]]) -> bool:
        """`publish_frames`, sent on the XPUBs by the calling thread when every event handed
        to the loop before is sent (nothing of them left in the outbox), else put in the
        outbox behind them: events leave in the order they were handed over either way, and
        an event sent here wakes no transport thread (design/internals.md, "A delta's way
        to the transport"). A send may take the XPUBs' descriptor signal of a subscription
        still unread, so one found waiting afterwards wakes the loop to read it."""
        put = self._events_put
        if self._events_done >= put:
            events = self._events
            with self._xpub_lock:
                if events.pub is not None and not self._closing:
                    waiting = events.send_now(frames)
                    self.events_now += 1
                else:
                    return False
            if waiting:
                self._look_at_subscriptions()
            return True
        return self.publish_frames(frames)

    def _look_at_subscriptions(self) -> None:
        """Have the loop read the XPUBs' subscriptions (a send on another thread saw one)."""
        with self._push_lock:
            self._events_sent = True
            wake = self._wake_fd
            if wake is not None and not self._signalled:
                self._signalled = True
                os.eventfd_write(wake, 1)

    def wants(self, topic: str) -> bool:
        """Whether a connected subscriber would receive an event under `topic` (any thread):
        a publisher may skip building an event nobody receives (`EventSockets.wants`)."""
        return self._events.wants(topic)

    def rebind_missing_ipc(self) -> Future[list[str]]:
        """Bind again, on the loop thread, every ipc endpoint whose file has gone (its directory
        removed and made again); the result: those endpoints (`endpoints.rebind_missing`)."""
        fut: Future[list[str]] = Future()
        self._rebinds.append(fut)
        if not self._send_pipe((_TAG_REBIND,)):
            self._rebinds.remove(fut)
            fut.set_exception(RuntimeError("the API server is not running"))
        return fut

    def _rebind_missing(self) -> None:
        assert self._guard is not None
        while self._rebinds:
            fut = self._rebinds.pop(0)
            try:
                # New listeners: never while the guard is between its check of a connection's
                # descriptor and its shutdown (docs/design/connections.md).
                with self._guard.binding(), self._xpub_lock:
                    again = rebind_missing(
                        self._binder,
                        [
                            (self._router, self._endpoints),
                            (self._events.pub, self._events.endpoints),
                            (self._events.pub_exact, self._events.exact_endpoints),
                        ],
                    )
                fut.set_result(again)
            except Exception as exc:  # noqa: BLE001 - reported to the caller, not the loop
                fut.set_exception(exc)
            finally:
                # The listeners replaced: the guard has them unbound once none is used.
                for address, endpoint in self._binder.take_replaced():
                    self._guard.replaced(address, endpoint)

    def _unbind_replaced(self, address: str) -> None:
        """On the loop thread: unbind a listener a re-bind replaced (the guard found no
        connection left on it); libzmq closes it."""
        try:
            with self._xpub_lock:  # the listener may be an XPUB's
                self._binder.unbind(address)
        except zmq.ZMQError as exc:
            log.warning("unbinding the replaced listener %s failed: %s", address, exc)

    def _post_reply(self, token: int, frame: bytes) -> bool:
        if threading.get_ident() == self._loop_ident:
            # Answered during dispatch: send now, so synchronous replies on one connection
            # keep request order and skip the outbox round trip.
            return self._send_reply(token, frame)
        return self._send_pipe((_TAG_REPLY, token, frame))

    def _send_pipe(self, entry: tuple[Any, ...]) -> bool:
        """Hand `entry` to the loop (any thread): onto the outbox, and a write to the loop's
        wake-up descriptor unless one is already on its way since the loop last looked."""
        with self._push_lock:
            wake = self._wake_fd
            if wake is None:
                return False
            self._outbox.append(entry)
            if entry[0] == _TAG_EVENT:
                self._events_put += 1
            if not self._signalled:
                self._signalled = True
                os.eventfd_write(wake, 1)  # never blocks: the counter is read to zero each time
            return True

    # -- binding -----------------------------------------------------------------------------

    def _bind_all(self) -> None:
        if self._curve is not None and any(
            needs_curve(e)
            for e in (*self._api_requested, *self._events_listen, *self._exact_requested)
        ):
            # Before any CURVE bind: without a ZAP handler libzmq would admit any client key.
            self._auth = start_authenticator(self._ctx, self._curve)
        # Owned from here on, so a failed bind below still closes it.
        with self._push_lock:
            self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, _CLOSE_LINGER_MS)
        self._router.setsockopt(zmq.MAXMSGSIZE, HARD_MAX_MESSAGE)
        self._router.setsockopt(zmq.SNDHWM, PEER_REPLY_HWM)
        self._router.setsockopt(zmq.RCVHWM, 0)
        # Mandatory routing: a full peer pipe answers EAGAIN (the reply goes to that peer's
        # backlog) and a vanished peer EHOSTUNREACH (dropped), never a silent drop or a block.
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._replies.router = self._router
        limits = self._connection_limits or ConnectionLimits.for_fd_limit(
            resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        )
        # Before the first bind: no connection is ever accepted into the reserve.
        accept_shim.set_reserve(limits.accept_reserve)
        replies = self._replies
        self._guard = guard = ConnectionGuard(
            self._ctx,
            limits,
            busy=replies.unread,
            unbind=lambda address: self._send_pipe((_TAG_UNBIND, address)),
        )
        # Watched before binding, so no connection is accepted uncounted.
        guard.watch(self._router, api=True)
        self._endpoints = self._binder.bind_each(self._router, self._api_requested)
        with self._xpub_lock:
            self._events.bind(
                self._ctx,
                self._binder,
                [self._events_requested, *self._events_listen],
                self._exact_requested,
                watch=lambda sock: guard.watch(sock, api=False),
            )

    # -- the transport loop ------------------------------------------------------------------

    def _run(self) -> None:
        assert self._router is not None and self._wake_fd is not None
        self._loop_ident = threading.get_ident()
        replies = self._replies
        router, wake, outbox = self._router, self._wake_fd, self._outbox
        # `zmq_poll` itself: `zmq.Poller.poll` only adds a Python call around it.
        items: list[tuple[Any, int]] = [(router, _POLLIN), (wake, _POLLIN)]
        # The XPUBs by their own descriptor (`zmq.FD`), not as sockets: a socket in the poll
        # set costs two `zmq.EVENTS` checks per wake-up, and subscriptions come rarely. The
        # descriptor signals commands for the socket; a send on it may take such a signal
        # while a subscription waits unread, so after events were sent each XPUB's
        # `zmq.EVENTS` is looked at before the loop blocks (`_events_sent`).
        xpub_lock = self._xpub_lock
        with xpub_lock:
            xpubs = {_getsockopt(sock, _FD): sock for sock in self._events.sockets}
        items += [(fd, _POLLIN) for fd in xpubs]
        self._events_sent = True  # look at each once before the first block
        try:
            while True:
                # Blocks until there is work; only a client's unread backlog sets a timeout,
                # and entries left in the outbox past a wake-up's bound make it not block.
                if self._events_sent:
                    self._events_sent = False
                    with xpub_lock:
                        for sock in xpubs.values():
                            if _getsockopt(sock, _EVENTS) & _POLLIN:
                                self._events_sent |= self._events.read_subscriptions(sock)
                if outbox and not self._signalled:
                    timeout = 0
                elif replies.backlog:
                    timeout = _BACKLOG_RETRY_MS
                else:
                    timeout = -1
                ready = _zmq_poll(items, timeout)
                self.wakeups += 1
                if replies.backlog:
                    replies.flush_backlogs()
                router_ready = False
                for sock, _ in ready:
                    if sock is router:
                        router_ready = True
                    elif sock == wake:
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(wake)  # to zero: poll saw it non-zero
                        # Cleared before the entries are taken: one handed over from here on
                        # sends a wake-up of its own.
                        self._signalled = False
                    else:
                        with xpub_lock:
                            self._events_sent |= self._events.read_subscriptions(xpubs[sock])
                if outbox and self._drain_pipe():
                    return
                if replies.backlog:
                    replies.flush_backlogs()
                if router_ready:
                    self._drain_router()
        except Exception:
            log.exception("transport loop failed")
        finally:
            self._shutdown()
            if self._term_in_loop:
                self._stop_authenticator()
                self._ctx.term()

    def _drain_pipe(self, limit: int = _OUTBOX_BOUND) -> bool:
        """Forward queued replies and events, `limit` entries at most; True when a stop was
        requested."""
        outbox = self._outbox
        send_event = self._events.send
        xpub_lock = self._xpub_lock
        stop = False
        for _ in range(limit):
            try:
                entry = outbox.popleft()
            except IndexError:
                break
            tag = entry[0]
            if tag == _TAG_REPLY:
                self._send_reply(entry[1], entry[2])
            elif tag == _TAG_EVENT:
                self._events_sent = True
                with xpub_lock:
                    for topic, payload in entry[1]:
                        send_event(topic, payload)
                # After the send: `publish_now` sends on its own thread only once every
                # event put before its look is sent (this thread alone moves the count).
                self._events_done += 1
            elif tag == _TAG_STOP:
                stop = True
            elif tag == _TAG_REBIND:
                self._events_sent = True  # the XPUBs' binds: their signals too
                self._rebind_missing()
            elif tag == _TAG_UNBIND:
                self._unbind_replaced(entry[1])
        return stop

    def _drain_router(self) -> None:
        # Bounded batch so replies from the outbox are not starved by a flood of requests.
        # Every request ready is taken in this one wakeup. The frames are read as zero-copy
        # Frames whose `more` ends the message, with an int flag, not `recv_multipart` (its
        # per-frame Python, RCVMORE getsockopt and flag enums are a measurable part of a point
        # read); a message's frames arrive together, so none is waited for. Poll said one is
        # there; after each, `zmq.EVENTS` says whether another is (a read that finds none
        # raises `zmq.Again`, and every read lets the interpreter go).
        router = self._router
        assert router is not None
        active = self._guard.active if self._guard is not None else None
        for _ in range(1000):
            try:
                part = _recv(router, _NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = [part.bytes]
            while part.more:
                part = _recv(router, _NOBLOCK, copy=False)
                frames.append(part.bytes)
            if active is not None:
                # The connection it came on is not idle (the guard sheds only idle ones).
                active(part.get(_SRCFD), frames[0])
            self._handle(frames)
            if not _getsockopt(router, _EVENTS) & _POLLIN:
                return

    def _handle(self, frames: list[bytes]) -> None:
        # Everything before the body is the routing envelope (identity, plus REQ's empty
        # delimiter); it is echoed unchanged so DEALER and REQ clients both get their reply.
        if len(frames) < 2 or len(frames) > _MAX_ENVELOPE_FRAMES:
            return  # cannot be routed back sensibly: dropped
        envelope, body = frames[:-1], frames[-1]
        try:
            request = decode_request(body)
        except HostError as exc:
            self._replies.send_now(envelope, encode_error(peek_id(body), exc))
            return
        if self._closing:
            self._replies.send_now(envelope, encode_error(request.id, _shutting_down()))
            return
        if len(self._in_flight) >= self._max_in_flight:
            overloaded = Unavailable(
                f"more than {self._max_in_flight} requests in flight",
                reason=WireReason.OVERLOADED,
            )
            self._replies.send_now(envelope, encode_error(request.id, overloaded))
            return
        peer = envelope[0]
        replies = self._replies
        if replies.peer_load(peer) >= self._max_per_client or replies.not_reading(peer):
            overloaded = Unavailable(
                f"more than {self._max_per_client} requests in flight or replies unread"
                " on this connection",
                reason=WireReason.OVERLOADED,
            )
            # Never backlogged: a client that does not read gets no further memory from us.
            replies.send_now(envelope, encode_error(request.id, overloaded), backlog=False)
            return
        token = self._next_token
        self._next_token += 1
        self._in_flight[token] = (envelope, request.id)
        replies.started(peer)
        responder = OneShotResponder(self._post_reply, token, request.id)
        try:
            self._dispatcher(request, responder)
        except HostError as exc:
            if not responder.error(exc):
                log.warning("dispatcher raised after answering %s: %r", request.id, exc)
        except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
            what = f"dispatching {request.method} {request.id}"
            responder.error(internal_error(exc, what, logger=log))

    def _send_reply(self, token: int, frame: bytes) -> bool:
        entry = self._in_flight.pop(token, None)
        if entry is None:
            return False  # already answered with shutting_down
        self._replies.finished(entry[0][0])
        self._replies.send_now(entry[0], frame)
        return True

    def _shutdown(self) -> None:
        self._closing = True
        try:
            # Replies already queued go out first; then the rest are told we are closing.
            self._drain_pipe(limit=1 << 62)
            self._drain_router()
            in_flight, self._in_flight = self._in_flight, {}
            for envelope, request_id in in_flight.values():
                self._replies.send_now(envelope, encode_error(request_id, _shutting_down()))
        finally:
            self._loop_ident = None  # a later thread may reuse the ident
            self._close_sockets()

    def _stop_authenticator(self) -> None:
        auth, self._auth = self._auth, None
        if auth is not None:
            try:
                auth.stop()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                log.exception("ZAP handler did not stop cleanly")

    def _close_sockets(self) -> None:
        # The guard's monitor sockets first: the context cannot terminate while they live.
        if self._guard is not None:
            self._guard.stop()
        with self._push_lock:
            wake, self._wake_fd = self._wake_fd, None
        if wake is not None:
            os.close(wake)
        if self._router is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._router.close()
        with self._xpub_lock:
            self._events.close()
        self._router = self._replies.router = None
        self._binder.remove_ipc_files()


def _shutting_down() -> Unavailable:
    return Unavailable("the daemon is shutting down", reason=WireReason.SHUTTING_DOWN)
