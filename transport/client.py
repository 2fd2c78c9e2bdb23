"""The Python client of the wire protocol: a thread-safe request client over one DEALER and a
subscriber for the events PUB socket.

A background thread owns the DEALER (zmq sockets are not thread-safe) and matches replies to
callers by `id`, so many calls from many threads can be in flight at once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Generic, NamedTuple, TypeVar, cast, overload

import zmq

from protocol.envelope import decode_event, decode_reply, encode_request, reply_outcome
from protocol.events import ClientEvent, EventTurn
from protocol.methods import Method
from protocol.objects import Error, JsonObject, Message, Turn
from transport.security import ClientCurve, needs_curve

P = TypeVar("P")
R = TypeVar("R")
MethodRef = Method[Any, Any] | str
"""A protocol method, or (tests, probes and `--json` passthrough only) a bare method name,
whose params and result are then `JsonObject`s: JSON, not `Any`."""

_TAG_SEND = b"S"
_TAG_STOP = b"X"
_UNMATCHED_KEEP = 10_000


class ApiError(Exception):
    """An error reply: the fields of PROTOCOL.md's `error` map plus the HTTP-like status."""

    def __init__(
        self,
        status: int,
        code: str,
        reason: str,
        message: str,
        retryable: bool = False,
        params: JsonObject | None = None,
    ) -> None:
        super().__init__(f"{status} {code}/{reason}: {message}")
        self.status = status
        self.code = code
        self.reason = reason
        self.message = message
        self.retryable = retryable
        self.params: JsonObject = dict(params or {})

    @classmethod
    def from_reply(cls, status: int, error: Error | Mapping[str, object]) -> ApiError:
        """The exception of an error reply's body (fields it lacks read as empty)."""
        body: Mapping[str, object] = error
        params = body.get("params")
        return cls(
            status,
            str(body.get("code", "")),
            str(body.get("reason", "")),
            str(body.get("message", "")),
            bool(body.get("retryable", False)),
            cast(JsonObject, params) if isinstance(params, dict) else None,
        )


class ClientTimeout(TimeoutError):
    """No reply arrived in time. The request may still have been executed (delivery unknown)."""


class ServerGone(ClientTimeout):
    """No reply will come: the caller's `gone` check said the server stopped or is stopping
    (its words are the message). The request may still have been executed."""


GONE_CHECK_S = 0.2
"""How often a call waiting for its reply asks the client's `gone` check."""


class ClientClosed(RuntimeError):
    """The client was closed before the reply arrived."""


class Reply(NamedTuple, Generic[R]):
    """`(status, body)` of one reply: `body` is the method's result below 400, its `Error`
    otherwise. A tuple, so `status, body = reply` reads it; `result()` narrows it."""

    status: int
    body: R | Error

    @property
    def ok(self) -> bool:
        return self.status < 400

    def result(self) -> R:
        """The result; raises `ApiError` for an error reply."""
        if self.status >= 400:
            raise ApiError.from_reply(self.status, cast(Error, self.body))
        return cast(R, self.body)

    def error(self) -> Error | None:
        """The error body of an error reply, else None."""
        return cast(Error, self.body) if self.status >= 400 else None


class Client:
    """Synchronous, thread-safe API client over one DEALER socket (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 10.0,
        context: zmq.Context[Any] | None = None,
        curve: ClientCurve | None = None,
        gone: Callable[[], str | None] | None = None,
    ) -> None:
        """`curve`: the keys of a connection file, needed on a tcp endpoint (a daemon drops a
        tcp client without an authorized key: its calls time out). `gone`: asked every
        `GONE_CHECK_S` while a call waits; words (the server stopped, or is stopping) end the
        wait at once (`ServerGone`), None waits on."""
        self.endpoint = endpoint
        self.timeout = timeout
        self._gone = gone
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._pending: dict[str, Future[Reply[Any]]] = {}
        self._pending_lock = threading.Lock()
        self._unmatched: deque[dict[str, object]] = deque(maxlen=_UNMATCHED_KEEP)
        self._unmatched_cond = threading.Condition()
        # Ids are unique per client; the prefix keeps them unique across clients on a socket.
        self._id_prefix = f"{os.getpid():x}-{id(self):x}-"
        self._counter = itertools.count(1)
        self._pipe_addr = f"inproc://agenthost-client-{id(self):x}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(self._pipe_addr)
        self._push_lock = threading.Lock()
        self._push: zmq.Socket[bytes] | None = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(self._pipe_addr)
        self._dealer = self._ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.SNDHWM, 0)
        self._dealer.setsockopt(zmq.RCVHWM, 0)
        if curve is not None and needs_curve(endpoint):  # ipc stays NULL on both ends
            curve.apply(self._dealer)
        self._dealer.connect(endpoint)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="agenthost-client", daemon=True)
        self._thread.start()

    # -- calls -------------------------------------------------------------------------------

    def new_id(self) -> str:
        return f"{self._id_prefix}{next(self._counter)}"

    @overload
    def submit(self, method: Method[P, R], params: P) -> Future[Reply[R]]: ...

    @overload
    def submit(
        self, method: str, params: JsonObject | None = None
    ) -> Future[Reply[JsonObject]]: ...

    def submit(self, method: MethodRef, params: Any = None) -> Future[Reply[Any]]:
        """Send a request now; the future resolves to its `Reply`, typed by `method` (a bare
        name: tests, probes and passthrough, with `JsonObject` params and result)."""
        return self._submit(method, params)[1]

    def _submit(
        self, method: MethodRef, params: Mapping[str, object] | None
    ) -> tuple[str, Future[Reply[Any]]]:
        request_id = self.new_id()
        if isinstance(method, Method):
            method = method.name
        frame = encode_request(request_id, method, params)
        future: Future[Reply[Any]] = Future()
        with self._pending_lock:
            if self._closed:
                raise ClientClosed("client is closed")
            self._pending[request_id] = future
        self._send_pipe([_TAG_SEND, frame])
        return request_id, future

    @overload
    def call_raw(
        self, method: Method[P, R], params: P, *, timeout: float | None = None
    ) -> Reply[R]: ...

    @overload
    def call_raw(
        self, method: str, params: JsonObject | None = None, *, timeout: float | None = None
    ) -> Reply[JsonObject]: ...

    def call_raw(
        self,
        method: MethodRef,
        params: Any = None,
        *,
        timeout: float | None = None,
    ) -> Reply[Any]:
        """The `Reply` (`(status, body)`) of one request, errors included; raises only
        `ClientTimeout`. Typed by `method` like `call`."""
        request_id, future = self._submit(method, params)
        return self._wait(request_id, future, timeout)

    @overload
    def call(self, method: Method[P, R], params: P, *, timeout: float | None = None) -> R: ...

    @overload
    def call(
        self,
        method: str,
        params: JsonObject | None = None,
        *,
        timeout: float | None = None,
    ) -> JsonObject: ...

    def call(
        self,
        method: MethodRef,
        params: Any = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """The `result` of one request; raises `ApiError` on an error reply. Called with a
        `protocol.methods` constant, its params and result are that method's types (build
        the params with their TypedDict, `SessionParams(workspaceId=…, …)`, so mypy can
        check them); with a bare name string (tests, probes, passthrough) both are
        `JsonObject`s."""
        return self.call_raw(method, params, timeout=timeout).result()

    def _wait(
        self, request_id: str, future: Future[Reply[Any]], timeout: float | None
    ) -> Reply[Any]:
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            step = left if self._gone is None else min(left, GONE_CHECK_S)
            try:
                return future.result(max(step, 0.0))
            except FutureTimeout:
                pass
            why = None if self._gone is None or step >= left else self._gone()
            if step < left and why is None:
                continue
            with self._pending_lock:
                self._pending.pop(request_id, None)
            if why is not None:
                raise ServerGone(why) from None
            raise ClientTimeout(f"no reply to {request_id} within {limit}s") from None

    # -- raw frames (tests, fuzzing) ---------------------------------------------------------

    def send_frame(self, frame: bytes) -> None:
        """Send one raw frame as a request body; its reply lands in `next_unmatched`."""
        self._send_pipe([_TAG_SEND, frame])

    def next_unmatched(self, timeout: float | None = None) -> dict[str, object] | None:
        """The next reply whose id matched no pending call (decoded), or None on timeout."""
        limit = self.timeout if timeout is None else timeout
        with self._unmatched_cond:
            if not self._unmatched_cond.wait_for(lambda: bool(self._unmatched), limit):
                return None
            return self._unmatched.popleft()

    def exchange_frame(self, frame: bytes, timeout: float | None = None) -> dict[str, object]:
        """Send a raw frame and return the next unmatched reply (the frame's, if sent alone)."""
        self.send_frame(frame)
        reply = self.next_unmatched(timeout)
        if reply is None:
            raise ClientTimeout("no reply to a raw frame")
        return reply

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the socket thread; pending calls fail with `ClientClosed`."""
        with self._pending_lock:
            if self._closed:
                return
            self._closed = True
        self._send_pipe([_TAG_STOP])
        self._thread.join(5.0)
        with self._push_lock:
            push, self._push = self._push, None
        if push is not None:
            push.close()
        if not self._thread.is_alive():
            self._pull.close()
            self._dealer.close()
            if self._own_context:
                self._ctx.term()
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ClientClosed("client closed before the reply"))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- socket thread -----------------------------------------------------------------------

    def _send_pipe(self, frames: list[bytes]) -> None:
        with self._push_lock:
            if self._push is None:
                raise ClientClosed("client is closed")
            self._push.send_multipart(frames)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._dealer, zmq.POLLIN)
        while True:
            events = dict(poller.poll())
            if self._pull in events:
                while True:
                    try:
                        frames = self._pull.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if frames[0] == _TAG_STOP:
                        return
                    with contextlib.suppress(zmq.ZMQError):
                        self._dealer.send(frames[1], zmq.NOBLOCK)
            if self._dealer in events:
                while True:
                    try:
                        frames = self._dealer.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_reply(frames[-1])

    def _on_reply(self, frame: bytes) -> None:
        reply = decode_reply(frame)
        request_id = reply.get("id")
        future = None
        if isinstance(request_id, str):
            with self._pending_lock:
                future = self._pending.pop(request_id, None)
        if future is None:
            with self._unmatched_cond:
                self._unmatched.append(reply)
                self._unmatched_cond.notify_all()
            return
        if not future.done():
            future.set_result(Reply(*reply_outcome(reply)))


class EventSubscriber:
    """A SUB socket on the events endpoint; use it from one thread.

    Each event is `{type, ...}` published under a topic (the workspace id), handed on decoded
    once into its `protocol.events` type, or as an `UnknownEvent` (a newer daemon's type, a
    malformed body) that says why. Subscriptions
    take a moment to reach the PUB side (ZeroMQ's slow joiner): events published before
    that are not delivered.

    `exact=True` is for the daemon's terminated-topic endpoint (`eventsExact` in the ready
    line and the connection file), whose topic frame is `workspaceId + "\0"`:
    the subscription is `ws + "\0"`, so ZeroMQ itself never delivers another workspace whose
    id merely starts with `ws`. Either way only the subscribed workspaces are kept, and the
    topic handed on is the bare workspace id (the NUL stripped).
    """

    def __init__(
        self,
        endpoint: str,
        topics: Iterable[str] = ("",),
        *,
        context: zmq.Context[Any] | None = None,
        curve: ClientCurve | None = None,
        exact: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.exact = exact
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        if curve is not None and needs_curve(endpoint):
            curve.apply(self._sub)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        topics = tuple(topics)
        # ZeroMQ topics are prefix matches: on the bare-id endpoint a subscription to workspace
        # `team` also receives `team-secret`'s events. Keep exactly the subscribed workspaces
        # ("" = all), on either endpoint.
        self._exact: frozenset[str] | None = None if "" in topics else frozenset(topics)
        for topic in topics:
            wire = topic + "\0" if exact and topic else topic
            self._sub.setsockopt(zmq.SUBSCRIBE, wire.encode("utf-8"))
        self._sub.connect(endpoint)

    def next_message(self, timeout: float | None = None) -> tuple[str, ClientEvent] | None:
        """`(topic, event)` of the next event, or None after `timeout` seconds (None: wait).
        `topic` is the bare workspace id on both endpoints."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            poll_ms = None if left is None else int(left * 1000)
            if not self._sub.poll(poll_ms, zmq.POLLIN):
                return None
            frames = self._sub.recv_multipart()
            raw = frames[0]
            if raw.endswith(b"\0"):
                # A terminated topic (workspace ids never hold NUL): the bare id is handed on,
                # and a subscriber built without `exact` on that endpoint still filters right.
                raw = raw[:-1]
            topic = raw.decode("utf-8", errors="replace")
            if self._exact is not None and topic not in self._exact:
                continue  # another workspace whose id merely starts with ours
            return topic, decode_event(frames[-1])

    def next(self, timeout: float | None = None) -> ClientEvent | None:
        """The next event, or None after `timeout` seconds (None: wait forever)."""
        message = self.next_message(timeout)
        return None if message is None else message[1]

    def __iter__(self) -> Iterator[ClientEvent]:
        while True:
            event = self.next(None)
            if event is not None:
                yield event

    def close(self) -> None:
        self._sub.close()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


TURN_EVENT_KEYS = ("messagesTruncated", "messageCount", "messagesFrom", "interactionsTruncated")
"""The fields a `turn.updated` adds to a Turn when it carries only some of its messages (or
some of its Interactions without their input and output)."""


def merge_turn(known: Turn | None, update: Turn | EventTurn) -> Turn | None:
    """The whole Turn after a `turn.updated` event's `turn` (`update`), merged by message id
    into the copy the client holds (`known`, a whole Turn or None).

    An update without `messagesTruncated` is the whole Turn. One with it carries every Turn
    field but only the messages at ordinals `messagesFrom`.. of `messageCount` (the messages
    added or changed since the Turn's previous event): each replaces the known message of its
    id or is appended. None when that cannot give the whole Turn (the client missed an event,
    joined late, a message was too big for an event, or an Interaction was and the event says
    `interactionsTruncated`): read it with `session.timeline`. The result never has the event
    fields, so it compares equal to the Turn `session.timeline` returns."""
    fields = cast(Mapping[str, object], update)
    turn = cast(Turn, {k: v for k, v in fields.items() if k not in TURN_EVENT_KEYS})
    carried = [m for m in update.get("messages") or [] if isinstance(m, Mapping)]
    if fields.get("interactionsTruncated"):
        return None  # an Interaction was too big for the event: only a read has it whole
    if not fields.get("messagesTruncated"):
        return turn
    count = fields.get("messageCount")
    if not isinstance(count, int):
        return None
    if known is None or known.get("turnId") != update.get("turnId"):
        return turn if count == len(carried) else None
    messages: list[Message] = [cast(Message, dict(m)) for m in known.get("messages") or []]
    where = {str(m.get("messageId")): i for i, m in enumerate(messages)}
    for message in carried:
        index = where.get(str(message.get("messageId")))
        if index is None:
            where[str(message.get("messageId"))] = len(messages)
            messages.append(cast(Message, dict(message)))
        else:
            messages[index] = cast(Message, dict(message))
    if len(messages) != count:
        return None
    turn["messages"] = messages
    return turn
