"""The daemon's client-facing API server: one transport thread owns the ROUTER (API) and PUB
(events) sockets, decodes requests and hands each to a dispatcher with a one-shot responder.

It never blocks on work: replies and events from any thread reach the loop through an inproc
PUSH/PULL pipe, and every failure of a request becomes a typed error reply (law 7).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgpack
import zmq

from domain.errors import HostError, Unavailable, internal_error
from transport.security import (
    InsecureEndpoint,
    ServerCurve,
    bind_order,
    configure_bind,
    is_loopback,
    needs_curve,
    start_authenticator,
)
from transport.wire import (
    Request,
    WireReason,
    decode_request,
    encode_error,
    encode_result,
    peek_id,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 10_000
# Frames past this are dropped by libzmq with the peer's connection (a memory guard); frames
# between MAX_FRAME and this still get a proper 413 reply.
HARD_MAX_MESSAGE = 64 << 20
_MAX_ENVELOPE_FRAMES = 32
_CLOSE_LINGER_MS = 1000
_EVENTS_HWM = 1000
"""Events queued per subscriber that does not read (PUB drops beyond it; a reading one keeps
up with bursts of hundreds): with events capped at `MAX_EVENT_BYTES` a subscriber that never
reads holds at most 1000 × 256 KiB of the daemon, typically far less (issue 15 #6: 100,000
whole-Turn events took a daemon past 1 GB)."""
MAX_EVENT_BYTES = 256 << 10
PEER_REPLY_HWM = 32
"""Replies queued in ZeroMQ per client connection; past it, replies wait in a per-client
backlog counted in that client's in-flight budget."""
DEFAULT_MAX_IN_FLIGHT_PER_CLIENT = 1024
"""Requests in flight plus replies it has not read, per client connection: past it the
client is refused (503 `overloaded`, retryable)."""
MAX_UNREAD_BYTES = 16 << 20
"""Reply bytes kept for a client that does not read, beyond the 32 replies ZeroMQ queues:
while it has this much, its new requests are refused without being run, and a further reply
to it is dropped (it is not reading) — so its unread replies cannot grow the daemon (issue
15 #6: 5.9 GB from one DEALER sending `session.list` and never reading). A client that reads
only drains its backlog, bursts of small replies included."""

# Tags of the inproc pipe into the loop (first frame of each message).
_TAG_REPLY = b"R"
_TAG_EVENT = b"E"
_TAG_STOP = b"S"


class Responder(Protocol):
    """Answers one request, exactly once, from any thread."""

    def result(self, status: int, result: Mapping[str, Any]) -> bool: ...

    def error(self, error: HostError) -> bool: ...


Dispatcher = Callable[[Request, Responder], None]
"""Called on the transport thread for every decoded request; must not block. It answers
through the responder now or later (from any thread), or raises a HostError synchronously."""


class EndpointInUse(RuntimeError):
    """An ipc endpoint is already served by a live process (another daemon)."""


class _Responder:
    """The responder handed to the dispatcher; the first answer wins, later ones are ignored."""

    __slots__ = ("_server", "_token", "_request_id", "_answered", "_lock")

    def __init__(self, server: ApiServer, token: int, request_id: str) -> None:
        self._server = server
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
        return self._server._post_reply(self._token, frame)

    def error(self, error: HostError) -> bool:
        """Send an error reply. Returns False if this request was already answered."""
        if not self._claim():
            log.warning("request %s answered twice; ignoring the second answer", self._request_id)
            return False
        return self._server._post_reply(self._token, encode_error(self._request_id, error))


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
    ) -> None:
        """`events_listen`: further endpoints of the events PUB socket. With `curve`, every
        non-ipc endpoint (API or events) is a CURVE server behind a ZAP handler."""
        if not api_endpoints:
            raise ValueError("at least one API endpoint is required")
        self._api_requested = list(api_endpoints)
        self._events_requested = events_endpoint
        self._events_listen = list(events_listen)
        self._curve = curve
        self._auth: Any = None
        self._dispatcher = dispatcher
        self._max_in_flight = max_in_flight
        self._max_per_client = max_in_flight_per_client
        # Per client identity: requests in flight, and replies ZeroMQ could not queue yet.
        self._peer_in_flight: dict[bytes, int] = {}
        self._backlog: dict[bytes, list[tuple[list[bytes], bytes]]] = {}
        self._backlog_bytes: dict[bytes, int] = {}
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._pipe_addr = f"inproc://agenthost-api-{id(self):x}"
        self._push_lock = threading.Lock()
        self._push: zmq.Socket[bytes] | None = None
        self._pull: zmq.Socket[bytes] | None = None
        self._router: zmq.Socket[bytes] | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None
        self._term_in_loop = False
        self._endpoints: list[str] = []
        self._events_endpoint = ""
        self._events_endpoints: list[str] = []
        self._ipc_files: list[str] = []
        # token -> (routing envelope, request id) of every request not yet answered.
        self._in_flight: dict[int, tuple[list[bytes], str]] = {}
        self._next_token = 0
        self._closing = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """The bound API endpoints (tcp wildcard ports resolved)."""
        return list(self._endpoints)

    @property
    def events_endpoint(self) -> str:
        return self._events_endpoint

    @property
    def events_endpoints(self) -> list[str]:
        """Every bound events endpoint: `events_endpoint` first, then `events_listen`."""
        return list(self._events_endpoints)

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

    def publish(self, topic: str, event: Mapping[str, Any]) -> bool:
        """Publish one event (topic frame + msgpack map) from any thread.

        Returns False if the server is not running. Raises TypeError if `event` cannot be
        encoded, in the caller's thread, so a bad event never reaches the loop.
        """
        payload = msgpack.packb(dict(event), use_bin_type=True)
        return self._send_pipe([_TAG_EVENT, topic.encode("utf-8"), payload])

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
            needs_curve(e) for e in (*self._api_requested, *self._events_listen)
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
        self._endpoints = self._bind_each(self._router, self._api_requested)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, _EVENTS_HWM)
        self._events_endpoints = self._bind_each(
            self._pub, [self._events_requested, *self._events_listen]
        )
        self._events_endpoint = self._events_endpoints[0]

    def _bind_each(self, sock: zmq.Socket[bytes], endpoints: list[str]) -> list[str]:
        """Bind every endpoint (NULL ones first, see `configure_bind`); the bound addresses in
        the order given."""
        bound = list(endpoints)
        for i in bind_order(endpoints):
            bound[i] = self._bind(sock, endpoints[i])
        return bound

    def _bind(self, sock: zmq.Socket[bytes], endpoint: str) -> str:
        path = _ipc_path(endpoint)
        if path is not None:
            _prepare_ipc_path(path)
        if self._curve is None and needs_curve(endpoint) and not is_loopback(endpoint):
            # `allow_remote` is only ever honoured behind CURVE (issue 14 §2).
            raise InsecureEndpoint(f"{endpoint}: a non-loopback endpoint needs CURVE keys")
        configure_bind(sock, endpoint, self._curve)
        sock.bind(endpoint)
        if path is not None:
            self._ipc_files.append(path)
            # The run dir is already 0700; the socket file gets 0600 as the contract says.
            os.chmod(path, 0o600)
            return endpoint
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        return last.decode() if isinstance(last, bytes) else str(last)

    # -- the transport loop ------------------------------------------------------------------

    def _run(self) -> None:
        assert self._router is not None and self._pull is not None
        self._loop_ident = threading.get_ident()
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        try:
            while True:
                # While some client has unread replies backlogged, retry them now and then.
                events = dict(poller.poll(50 if self._backlog else None))
                if self._backlog:
                    self._flush_backlogs()
                if self._pull in events and self._drain_pipe():
                    break
                if self._backlog:
                    self._flush_backlogs()
                if self._router in events:
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
                self._send_event(frames[1], frames[2])
            elif tag == _TAG_STOP:
                stop = True
        return stop

    def _drain_router(self) -> None:
        # Bounded batch so replies from the pipe are not starved by a flood of requests.
        assert self._router is not None
        for _ in range(1000):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
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
            self._send_now(envelope, encode_error(peek_id(body), exc))
            return
        if self._closing:
            self._send_now(envelope, encode_error(request.id, _shutting_down()))
            return
        if len(self._in_flight) >= self._max_in_flight:
            overloaded = Unavailable(
                f"more than {self._max_in_flight} requests in flight",
                reason=WireReason.OVERLOADED,
            )
            self._send_now(envelope, encode_error(request.id, overloaded))
            return
        peer = envelope[0]
        if (
            self._peer_load(peer) >= self._max_per_client
            or self._backlog_bytes.get(peer, 0) >= MAX_UNREAD_BYTES
        ):
            overloaded = Unavailable(
                f"more than {self._max_per_client} requests in flight or replies unread"
                " on this connection",
                reason=WireReason.OVERLOADED,
            )
            # Never backlogged: a client that does not read gets no further memory from us.
            self._send_now(envelope, encode_error(request.id, overloaded), backlog=False)
            return
        token = self._next_token
        self._next_token += 1
        self._in_flight[token] = (envelope, request.id)
        self._peer_in_flight[peer] = self._peer_in_flight.get(peer, 0) + 1
        responder = _Responder(self, token, request.id)
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
        peer = entry[0][0]
        left = self._peer_in_flight.get(peer, 1) - 1
        if left > 0:
            self._peer_in_flight[peer] = left
        else:
            self._peer_in_flight.pop(peer, None)
        self._send_now(entry[0], frame)
        return True

    def _peer_load(self, peer: bytes) -> int:
        """What counts against a client's budget: its requests in flight and its replies
        that ZeroMQ could not queue because it does not read."""
        return self._peer_in_flight.get(peer, 0) + len(self._backlog.get(peer, ()))

    def _send_now(self, envelope: list[bytes], frame: bytes, *, backlog: bool = True) -> None:
        assert self._router is not None
        peer = envelope[0]
        pending = self._backlog.get(peer)
        if pending is not None:
            if backlog and self._backlog_bytes.get(peer, 0) < MAX_UNREAD_BYTES:
                pending.append((envelope, frame))  # keep the connection's reply order
                self._backlog_bytes[peer] = self._backlog_bytes.get(peer, 0) + len(frame)
            elif backlog:
                log.warning("a client that does not read: reply dropped (%d unread)", len(pending))
            return
        try:
            self._router.send_multipart([*envelope, frame], zmq.NOBLOCK)
        except zmq.Again:
            if backlog:
                self._backlog[peer] = [(envelope, frame)]
                self._backlog_bytes[peer] = len(frame)
        except zmq.ZMQError as exc:
            # A vanished peer must never take the loop down.
            log.debug("reply dropped: %s", exc)

    def _flush_backlogs(self) -> None:
        assert self._router is not None
        for peer, pending in list(self._backlog.items()):
            while pending:
                envelope, frame = pending[0]
                try:
                    self._router.send_multipart([*envelope, frame], zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    pending.clear()  # the peer is gone: its replies have no reader
                    break
                pending.pop(0)
                self._backlog_bytes[peer] = self._backlog_bytes.get(peer, 0) - len(frame)
            if not pending:
                del self._backlog[peer]
                self._backlog_bytes.pop(peer, None)

    def _send_event(self, topic: bytes, payload: bytes) -> None:
        assert self._pub is not None
        try:
            self._pub.send_multipart([topic, payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("event dropped: %s", exc)

    def _shutdown(self) -> None:
        self._closing = True
        try:
            # Replies already queued go out first; then the rest are told we are closing.
            self._drain_pipe(limit=1 << 62)
            self._drain_router()
            in_flight, self._in_flight = self._in_flight, {}
            for envelope, request_id in in_flight.values():
                self._send_now(envelope, encode_error(request_id, _shutting_down()))
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
        with self._push_lock:
            push, self._push = self._push, None
        for sock in (push, self._pull, self._router, self._pub):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close()
        self._pull = self._router = self._pub = None
        for path in self._ipc_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._ipc_files.clear()


def _shutting_down() -> Unavailable:
    return Unavailable("the daemon is shutting down", reason=WireReason.SHUTTING_DOWN)


def _ipc_path(endpoint: str) -> str | None:
    if not endpoint.startswith("ipc://"):
        return None
    path = endpoint[len("ipc://") :]
    if not path or path.startswith("@"):
        return None  # abstract namespace: no file
    return path


def _prepare_ipc_path(path: str) -> None:
    """Create the run dir 0700 and refuse to steal a socket a live process still serves."""
    run_dir = os.path.dirname(os.path.abspath(path))
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)  # makedirs' mode is masked by umask; the contract says 0700
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise EndpointInUse(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            os.unlink(path)  # stale socket of a process that died
            return
        raise
    finally:
        probe.close()
    raise EndpointInUse(f"{path} is served by another live process")
