"""Both ends of the host↔worker link: msgpack maps over ZeroMQ ipc, a PAIR at each end — one
frame per message, no peer identity (hello, req/res, evt, heartbeats; docs/design/internals.md).

This module owns the message shapes and the sockets; the supervisor and the worker main use
these ends and never touch msgpack or zmq framing themselves.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import msgpack
import zmq

from transport.zmq_options import install as _fast_options

_fast_options()  # the link's option looks (a delta's EVENTS) without an enum call

HEARTBEAT_INTERVAL_S = 0.5
"""Both ends send `{"t": "hb"}` this often; the worker's end leaves one out when it sent any
other frame since its last look (the host counts every frame as contact)."""

SILENCE_LIMIT_S = 5.0
"""The host declares a worker dead after this long without any message from it."""

MAX_LINK_FRAME = 64 << 20
"""Largest frame either end accepts; a turn event or fork receipt is far smaller."""

PROTOCOL_VERSION = 1

# The socket's own getsockopt with int constants (pyzmq's flag enums cost a construction each).
_getsockopt: Callable[..., Any] = zmq.backend.Socket.get
_recv: Callable[..., Any] = zmq.backend.Socket.recv
# The socket's own send with int flags: not pyzmq's Python `Socket.send` wrapper (a streamed
# delta's send on the provider's reader thread).
_send: Callable[..., Any] = zmq.backend.Socket.send
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)


class MsgType(StrEnum):
    """The `t` field of every link frame."""

    HELLO = "hello"
    REQ = "req"
    RES = "res"
    EVT = "evt"
    HB = "hb"


_TYPES = frozenset(t.value for t in MsgType)
"""The `t` values a frame may carry (looked up per frame: no set built each time)."""


class LinkProtocolError(ValueError):
    """A frame that is not a msgpack map with a known `t`; the receiver drops it."""


def encode(msg: Mapping[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(dict(msg), use_bin_type=True)
    return packed


def decode(frame: bytes) -> dict[str, Any]:
    if len(frame) > MAX_LINK_FRAME:
        raise LinkProtocolError("frame too large")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise LinkProtocolError(f"not msgpack: {exc}") from exc
    if not isinstance(msg, dict) or msg.get("t") not in _TYPES:
        raise LinkProtocolError("not a link map")
    return msg


def hello_msg(provider: str, pid: int, version: str) -> dict[str, Any]:
    return {"t": MsgType.HELLO.value, "provider": provider, "pid": pid, "version": version}


def req_msg(req_id: int, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"t": MsgType.REQ.value, "id": req_id, "method": method, "params": dict(params)}


def ok_msg(req_id: int, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"t": MsgType.RES.value, "id": req_id, "ok": True, "result": dict(result)}


def err_msg(req_id: int, error: Mapping[str, Any]) -> dict[str, Any]:
    return {"t": MsgType.RES.value, "id": req_id, "ok": False, "error": dict(error)}


def evt_msg(agent_session_id: str, event: Mapping[str, Any]) -> dict[str, Any]:
    return {"t": MsgType.EVT.value, "agentSessionId": agent_session_id, "event": dict(event)}


HB_MSG: dict[str, Any] = {"t": MsgType.HB.value}


def too_large_error(size: int) -> dict[str, Any]:
    """The error map (`domain.errors.HostError.to_wire`'s shape) a worker answers in place of a
    result whose frame of `size` bytes would pass `MAX_LINK_FRAME`: `provider_error` /
    `reply_too_large`, not retryable (the same request would be as large)."""
    return {
        "code": "provider_error",
        "reason": "reply_too_large",
        "message": (
            f"the worker's answer is {size} bytes, past the link's {MAX_LINK_FRAME}-byte frame"
        ),
        "retryable": False,
        "params": {"bytes": size, "maxBytes": MAX_LINK_FRAME},
    }


class _Packers(threading.local):
    """One msgpack `Packer` per thread: `msgpack.packb` builds (and frees) a `Packer` and its
    buffer at every call, a streamed delta's frame at each end of the link."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True)


_packers = _Packers()

_EVT = MsgType.EVT.value
# Plain ints: pyzmq's flag enums build an enum object at every `&` (a delta's send does one).
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None


class HostEnd:
    """The host's PAIR for exactly one worker incarnation; used from one thread only.

    A fresh endpoint per incarnation means a stale process of an earlier incarnation can never
    answer a request sent to its successor, and a PAIR takes one peer: ZeroMQ refuses any
    further connection to it. So a message is one frame, with no identity frame to read,
    check or send (a ROUTER's message was two frames, read as two `recv`s and a `RCVMORE`
    look, and a request was sent as two).
    """

    def __init__(self, ctx: zmq.Context[Any], endpoint: str) -> None:
        self.endpoint = endpoint
        self.socket: zmq.Socket[Any] = ctx.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_LINK_FRAME)
        path = ipc_path(endpoint)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.socket.bind(endpoint)
        if path is not None:
            os.chmod(path, 0o600)
        self.said_hello = False
        """The worker said hello: only then is a request sent, or another message taken."""
        self.fd: int = int(self.socket.getsockopt(zmq.FD))
        """ZeroMQ's notification descriptor: readable (edge-style) when the socket's state may
        have changed since the last operation on it; a reader polls it, then drains the socket
        until `more` says no."""
        self.unlooked = False
        """An operation (a send) touched the socket since the last `more`: a frame may wait
        whose signal it took, so the reader looks (`more`) before it sleeps on `fd`."""

    def recv(self) -> dict[str, Any] | None:
        """One decoded message, or None when nothing is ready or the frame was dropped.

        One socket call per message (the socket's own `recv`, int flags): a link message is
        one frame. A frame of a multipart message (nothing of ours sends one) is not a link
        map on its own, and is dropped like any other such frame."""
        try:
            frame: bytes = _recv(self.socket, _NOBLOCK)
        except zmq.Again:
            return None
        try:
            msg = decode(frame)
        except LinkProtocolError:
            return None
        if msg["t"] == MsgType.HELLO:
            self.said_hello = True
        elif not self.said_hello:
            return None  # nothing is taken before the worker's hello
        return msg

    def more(self) -> bool:
        """Whether another frame waits to be read (`zmq.EVENTS`): a drain ends on it rather
        than on a read that fails (a raised `zmq.Again` per drain, and a read that lets the
        interpreter go). A look that says no leaves the descriptor (`fd`) to signal the next
        frame."""
        self.unlooked = False
        return bool(_getsockopt(self.socket, _EVENTS) & _POLLIN)

    def send(self, msg: Mapping[str, Any]) -> bool:
        """Send to the worker; False when it never said hello or is gone (nothing was sent).
        Marks the end `unlooked`: the send may have taken the descriptor's signal of a frame
        that arrived meanwhile."""
        if not self.said_hello:
            return False
        self.unlooked = True
        frame: bytes = _packers.packer.pack(msg if type(msg) is dict else dict(msg))
        try:
            # The socket's own send with int flags, one frame: not pyzmq's `send_multipart`
            # (its Python per part: ~2–8 µs a request against ~0.6). A worker gone or
            # behind its high-water mark: `zmq.Again`, nothing sent.
            _send(self.socket, frame, _NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    def close(self) -> None:
        self.socket.close(0)
        path = ipc_path(self.endpoint)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


class Mailbox:
    """A thread-safe queue whose `put` wakes a poll loop through an eventfd (`fd`).

    zmq sockets are not thread-safe, so other threads never touch the loop's sockets: they
    enqueue here and the loop drains the queue when `fd` turns readable. The loop polls `fd`
    as a plain descriptor, beside its sockets' `zmq.FD`s.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.fd: int = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()  # no write to `fd` once closed (its number may be reused)
        self._closed = False

    def put(self, item: Any) -> None:
        self._queue.put(item)
        with self._lock:
            if not self._closed:
                # The wake-up is a hint: a counter at its maximum still wakes the loop.
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_write(self.fd, 1)

    def drain(self) -> list[Any]:
        """Called by the loop thread: clear the wake-up, then return every queued item in order
        (an item put after the clear wakes the loop again)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)
        items: list[Any] = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)


class WorkerEnd:
    """The worker's PAIR: says hello, heartbeats, hands requests to `on_request`, and sends
    results and events from any thread, each on the calling thread itself.

    One lock guards the socket (a zmq socket may move between threads behind a full memory
    barrier, which the lock is). A sender encodes outside it, then sends without blocking: a
    streamed delta goes from the provider's reader thread straight to ZeroMQ's I/O thread,
    with no thread of the link's woken in between. When the socket cannot take a frame at
    once (the high-water mark, a link not yet started) or frames already wait, it joins the
    backlog, which the link's thread sends in order as the socket frees: frames leave in the
    order their senders took the lock, so a `turn.start` result still follows the events its
    driver sent before returning it. The link's thread owns the reading and the heartbeats;
    it sleeps in `poll` on the socket's notification descriptor (`zmq.FD`, edge-triggered,
    polled outside the lock) and on a wake-up pipe. Every socket operation may consume that
    descriptor's edge, so each ends with a look at `zmq.EVENTS`, and a sender that finds a
    frame waiting to be read wakes the thread through the pipe.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        provider: str,
        version: str,
        on_request: Callable[[dict[str, Any]], None],
        ctx: zmq.Context[Any] | None = None,
    ) -> None:
        self._ctx = ctx or zmq.Context.instance()
        self._endpoint = endpoint
        self._provider = provider
        self._version = version
        self._on_request = on_request
        self._lock = threading.Lock()
        self._sock: zmq.Socket[Any] | None = None
        """Set (hello sent) by `start`; None again once the link stopped (under `_lock`)."""
        self._backlog: collections.deque[bytes] = collections.deque()
        """Frames waiting for the link's thread, in send order (under `_lock`)."""
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pipe_open = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-link", daemon=True)
        self.last_host_contact = time.monotonic()
        self.sent_direct = 0
        """Frames a sender put on the socket itself (tests read it)."""
        self.sent_backlog = 0
        """Frames the link's thread sent from the backlog (tests read it)."""
        self.heartbeats = 0
        """Heartbeats sent (tests read it): one a `HEARTBEAT_INTERVAL_S` in which no other
        frame was sent."""

    def start(self) -> None:
        sock: zmq.Socket[Any] = self._ctx.socket(zmq.PAIR)
        sock.setsockopt(zmq.LINGER, 1000)  # let the last results reach the host on close
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_LINK_FRAME)
        sock.connect(self._endpoint)
        sock.send(encode(hello_msg(self._provider, os.getpid(), self._version)))
        with self._lock:
            self._sock = sock
            self._wake()  # anything queued before the start leaves from the thread, in order
        self._thread.start()

    def send(self, msg: Mapping[str, Any]) -> None:
        """Thread-safe: send one message to the host now, or queue it behind earlier ones."""
        self._send_frame(encode(msg))

    def send_result(self, req_id: int, result: Mapping[str, Any]) -> None:
        """The request's result; one whose frame would pass `MAX_LINK_FRAME` (the host's end
        would drop it, and the link with it) is answered as a typed error instead
        (`too_large_error`), so the host hears an answer at once."""
        frame = encode(ok_msg(req_id, result))
        if len(frame) > MAX_LINK_FRAME:
            frame = encode(err_msg(req_id, too_large_error(len(frame))))
        self._send_frame(frame)

    def send_error(self, req_id: int, error: Mapping[str, Any]) -> None:
        self.send(err_msg(req_id, error))

    def send_event(self, agent_session_id: str, event: dict[str, Any]) -> None:
        """`evt_msg(agent_session_id, event)` sent; `event` is packed now, as given (the
        caller's map is not copied first: it must not change it during the call)."""
        frame: bytes = _packers.packer.pack(
            {"t": _EVT, "agentSessionId": agent_session_id, "event": event}
        )
        self._send_frame(frame)

    def close(self, flush_timeout: float = 1.0) -> None:
        self._stop.set()
        with self._lock:
            self._wake()
        if self._thread.ident is not None:
            self._thread.join(flush_timeout + 1.0)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the link stops; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _send_frame(self, frame: bytes) -> None:
        with self._lock:
            sock = self._sock
            if self._closed:
                return  # the link stopped: as a mailbox nobody drains, nothing leaves
            if sock is None or self._backlog:
                self._backlog.append(frame)
                if sock is not None:
                    self._wake()
                return
            try:
                _send(sock, frame, _NOBLOCK)
                self.sent_direct += 1
                # The send may have taken the descriptor's edge of a frame that waits: look
                # (inline: this runs for every streamed delta).
                waiting = _getsockopt(sock, _EVENTS) & _POLLIN
            except zmq.Again:
                self._backlog.append(frame)
                self._wake()
                return
            except zmq.ZMQError:
                return  # the context is going away
            if waiting:
                self._wake()

    def _wake(self) -> None:
        """Under `_lock` (the pipe is closed under it): wake the link's thread. A hint: a full
        pipe already wakes it."""
        if not self._pipe_open:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        with self._lock:
            fd = int(sock.getsockopt(zmq.FD))
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        next_hb = time.monotonic() + HEARTBEAT_INTERVAL_S
        sent_at_hb = 0  # frames counted at the last look (the hello is not counted)
        wake_r = self._wake_r
        busy = True  # look at the socket before the first sleep
        try:
            while True:
                # The wake-up pipe is read only when it woke the poll (or none was made): a wake
                # by the socket's descriptor alone made a `read` that found nothing.
                if busy or any(ready_fd == wake_r for ready_fd, _ in self._sleep(poller, next_hb)):
                    self._drain_wakes()
                stop = self._stop.is_set()
                frames: list[bytes] = []
                with self._lock:
                    events = self._read_all(sock, frames)
                    if self._backlog:
                        self._flush(sock)
                        events = None  # a send may have taken the descriptor's edge: look again
                    now = time.monotonic()
                    if now >= next_hb:
                        # A frame sent since the last look already told the host this worker
                        # lives (any frame is contact to it): no heartbeat on top of a stream.
                        sent = self.sent_direct + self.sent_backlog
                        if sent == sent_at_hb and not self._backlog:
                            with contextlib.suppress(zmq.Again):
                                sock.send(encode(HB_MSG), zmq.NOBLOCK)
                            self.heartbeats += 1
                            events = None
                        sent_at_hb = sent
                        next_hb = now + HEARTBEAT_INTERVAL_S
                    if events is None:
                        events = int(_getsockopt(sock, _EVENTS))
                    busy = bool(events & zmq.POLLIN) or bool(self._backlog and events & zmq.POLLOUT)
                    if stop:
                        self._closed = True
                for frame in frames:
                    self._dispatch(frame)
                if stop:
                    self._final_flush(sock)
                    return
        finally:
            with self._lock:
                self._closed = True
                self._sock = None
                self._pipe_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)
            sock.close()

    def _drain_wakes(self) -> None:
        while True:
            try:
                if not os.read(self._wake_r, 4096):
                    return
            except (BlockingIOError, OSError):
                return

    def _flush(self, sock: zmq.Socket[Any]) -> None:
        """Under `_lock`: send the backlog in order, as far as the socket takes it now."""
        backlog = self._backlog
        while backlog:
            try:
                sock.send(backlog[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            backlog.popleft()
            self.sent_backlog += 1

    def _final_flush(self, sock: zmq.Socket[Any]) -> None:
        """The link stops (`_closed`: no sender touches the socket again): what is still in
        the backlog leaves, each frame waiting up to the linger for room."""
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        with contextlib.suppress(zmq.ZMQError):
            while self._backlog:
                sock.send(self._backlog.popleft())
                self.sent_backlog += 1

    @staticmethod
    def _sleep(poller: select.poll, next_hb: float) -> list[tuple[int, int]]:
        """Until the socket's descriptor or the wake-up pipe turns readable, or the next
        heartbeat is due: what woke it."""
        return poller.poll(max(0, int((next_hb - time.monotonic()) * 1000)))

    def _read_all(self, sock: zmq.Socket[Any], frames: list[bytes]) -> int | None:
        """Under `_lock`: every frame the host sent that is ready now. Returns the socket's
        `zmq.EVENTS` as looked at after the last frame read — the look that ends the reading,
        no `recv` that fails with `zmq.Again` after it (each socket call is a look at the
        socket's mailbox: a `getpid` and a `poll` in libzmq, and a raised `Again` is a Python
        exception built) — or None when nothing was ready (the caller looks)."""
        while True:
            try:
                frames.append(_recv(sock, _NOBLOCK))
            except zmq.Again:
                return None
            events: int = _getsockopt(sock, _EVENTS)
            if not events & _POLLIN:
                return events

    def _dispatch(self, frame: bytes) -> None:
        try:
            msg = decode(frame)
        except LinkProtocolError:
            return
        self.last_host_contact = time.monotonic()
        if msg["t"] == MsgType.REQ:
            self._on_request(msg)
