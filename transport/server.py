"""The daemon's client-facing API server: one transport thread owns the ROUTER (API) and the
events sockets, decodes requests and hands each to a dispatcher with a one-shot responder.

It never blocks on work: replies and events from any thread reach the loop through an inproc
PUSH/PULL pipe, and every failure of a request becomes a typed error reply (law 7). A reply
given during dispatch (the point reads, every validation error) is sent at once, without the
pipe. The loop blocks in one `zmq.Poller.poll` with no timeout while there is nothing to do
(it wakes on a request, a reply or event from another thread, or a subscription); only a
client with unread replies backlogged makes it retry every 50 ms.

The parts, by concern: `transport.replies` (the responder, each client's reply budget and
backlog), `transport.events` (the XPUB sockets and who is subscribed), `transport.endpoints`
(ipc files, bind order), `transport.security` (CURVE, ZAP), `transport.wire` (the envelope).
"""

from __future__ import annotations

import contextlib
import logging
import resource
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import zmq

from domain.errors import HostError, Unavailable, internal_error
from protocol.envelope import Request, encode_event, peek_id
from protocol.events import Event
from transport.connections import ConnectionGuard, ConnectionLimits
from transport.endpoints import Binder, EndpointInUse, rebind_missing
from transport.events import EVENTS_HWM, MAX_EVENT_BYTES, EventSockets
from transport.replies import (
    MAX_UNREAD_BYTES,
    PEER_REPLY_HWM,
    OneShotResponder,
    ReplyRouter,
    Responder,
)
from transport.security import ServerCurve, needs_curve, start_authenticator
from transport.wire import WireReason, decode_request, encode_error

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

# Tags of the inproc pipe into the loop (first frame of each message).
_TAG_REPLY = b"R"
_TAG_EVENT = b"E"
_TAG_STOP = b"S"
_TAG_REBIND = b"B"
_TAG_UNBIND = b"U"


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
        self._pipe_addr = f"inproc://agenthost-api-{id(self):x}"
        self._push_lock = threading.Lock()
        self._push: zmq.Socket[bytes] | None = None
        self._pull: zmq.Socket[bytes] | None = None
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
                self._send_pipe([_TAG_STOP])
                return
            if thread is not None:
                self._send_pipe([_TAG_STOP])
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
        frames = [_TAG_EVENT]
        for topic, event in events:
            frames.append(topic.encode("utf-8"))
            frames.append(encode_event(event))
        return self._send_pipe(frames)

    def wants(self, topic: str) -> bool:
        """Whether a connected subscriber would receive an event under `topic` (any thread):
        a publisher may skip building an event nobody receives (`transport.events`)."""
        return self._events.wants(topic)

    def rebind_missing_ipc(self) -> Future[list[str]]:
        """Bind again, on the loop thread, every ipc endpoint whose file has gone (its directory
        removed and made again); the result: those endpoints (`endpoints.rebind_missing`)."""
        fut: Future[list[str]] = Future()
        self._rebinds.append(fut)
        if not self._send_pipe([_TAG_REBIND]):
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
                with self._guard.binding():
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
            self._binder.unbind(address)
        except zmq.ZMQError as exc:
            log.warning("unbinding the replaced listener %s failed: %s", address, exc)

    def _post_reply(self, token: int, frame: bytes) -> bool:
        if threading.get_ident() == self._loop_ident:
            # Answered during dispatch: send now, so synchronous replies on one connection
            # keep request order and skip the pipe round trip.
            return self._send_reply(token, frame)
        return self._send_pipe([_TAG_REPLY, token.to_bytes(8, "big"), frame])

    def _send_pipe(self, frames: list[bytes]) -> bool:
        # zmq sockets are not thread-safe: every producer thread shares one PUSH under a lock.
        # HWM 0 on both ends, so a send never blocks (the loop may be the sender itself).
        with self._push_lock:
            if self._push is None:
                return False
            self._push.send_multipart(frames, copy=len(frames[-1]) < 65536)
            return True

    # -- binding -----------------------------------------------------------------------------

    def _bind_all(self) -> None:
        if self._curve is not None and any(
            needs_curve(e)
            for e in (*self._api_requested, *self._events_listen, *self._exact_requested)
        ):
            # Before any CURVE bind: without a ZAP handler libzmq would admit any client key.
            self._auth = start_authenticator(self._ctx, self._curve)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(self._pipe_addr)
        push = self._ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 0)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._pipe_addr)
        # Owned from here on, so a failed bind below still closes it (else term() hangs).
        with self._push_lock:
            self._push = push
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
        replies = self._replies
        self._guard = guard = ConnectionGuard(
            self._ctx,
            limits,
            busy=replies.unread,
            unbind=lambda address: self._send_pipe([_TAG_UNBIND, address.encode()]),
        )
        # Watched before binding, so no connection is accepted uncounted.
        guard.watch(self._router, api=True)
        self._endpoints = self._binder.bind_each(self._router, self._api_requested)
        self._events.bind(
            self._ctx,
            self._binder,
            [self._events_requested, *self._events_listen],
            self._exact_requested,
            watch=lambda sock: guard.watch(sock, api=False),
        )

    # -- the transport loop ------------------------------------------------------------------

    def _run(self) -> None:
        assert self._router is not None and self._pull is not None
        self._loop_ident = threading.get_ident()
        replies = self._replies
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        for sock in self._events.sockets:
            poller.register(sock, zmq.POLLIN)
        try:
            while True:
                # Blocks until there is work; only a client's unread backlog sets a timeout.
                ready = poller.poll(_BACKLOG_RETRY_MS if replies.backlog else None)
                self.wakeups += 1
                if replies.backlog:
                    replies.flush_backlogs()
                router_ready = False
                for sock, _ in ready:
                    if sock is self._pull:
                        if self._drain_pipe():
                            return
                    elif sock is self._router:
                        router_ready = True
                    else:
                        self._events.read_subscriptions(sock)
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

    def _drain_pipe(self, limit: int = 10_000) -> bool:
        """Forward queued replies and events; True when a stop was requested."""
        assert self._pull is not None
        stop = False
        for _ in range(limit):
            try:
                frames = self._pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            tag = frames[0]
            if tag == _TAG_REPLY:
                self._send_reply(int.from_bytes(frames[1], "big"), frames[2])
            elif tag == _TAG_EVENT:
                for i in range(1, len(frames) - 1, 2):
                    self._events.send(frames[i], frames[i + 1])
            elif tag == _TAG_STOP:
                stop = True
            elif tag == _TAG_REBIND:
                self._rebind_missing()
            elif tag == _TAG_UNBIND:
                self._unbind_replaced(frames[1].decode())
        return stop

    def _drain_router(self) -> None:
        # Bounded batch so replies from the pipe are not starved by a flood of requests.
        # Every request ready is taken in this one wakeup. The frames are read as zero-copy
        # Frames whose `more` ends the message, with an int flag, not `recv_multipart` (its
        # per-frame Python, RCVMORE getsockopt and flag enums are a measurable part of a point
        # read); a message's frames arrive together, so none is waited for.
        router = self._router
        assert router is not None
        recv = router.recv
        active = self._guard.active if self._guard is not None else None
        for _ in range(1000):
            try:
                part = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = [part.bytes]
            while part.more:
                part = recv(_NOBLOCK, copy=False)
                frames.append(part.bytes)
            if active is not None:
                # The connection it came on is not idle (the guard sheds only idle ones).
                active(part.get(_SRCFD), frames[0])
            self._handle(frames)

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
            push, self._push = self._push, None
        for sock in (push, self._pull, self._router):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close()
        self._events.close()
        self._pull = self._router = self._replies.router = None
        self._binder.remove_ipc_files()


def _shutting_down() -> Unavailable:
    return Unavailable("the daemon is shutting down", reason=WireReason.SHUTTING_DOWN)
