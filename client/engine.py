"""The client Engine: the single source of truth for fork mutations (seed 000 §8.3, §9) on top of
the transport client, plus the client-side session cache the GUI and CLI read.

It allocates and reuses request/target identities, reconciles accepted operations through
`fork.get` and `fork.operation` events, adopts the durable identity the daemon returns, and sends
the client-observed ACK with a deadline and capped backoff on an injectable scheduler.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from transport.client import ApiError, ClientClosed, EventSubscriber
from transport.security import ClientCurve

log = logging.getLogger(__name__)

Reply = tuple[int, dict[str, Any]]
BoundaryKey = tuple[str, str]
"""`(source agentSessionId, source turnId)`: one fork boundary, the unit of a mutation."""

ACK_DEADLINE_S = 10.0
ACK_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Delays before each ACK retry; the last one repeats (seed 000 §8.3: 1/2/5/10/30 s, capped)."""
CREATE_DEADLINE_S = 30.0
POLL_INTERVAL_S = 0.25
GET_DEADLINE_S = 10.0
MAX_SETTLED = 128
LATEST_SETTLED = "latestSettled"
"""The turn component of a full-Session fork's boundary key: `(source, LATEST_SETTLED)`. The
daemon resolves the real boundary (the newest settled Turn) at prepare; the record learns it
from the operation (`boundary_turn_id`). Turn ids are UUIDs, so it never names a Turn."""
THROUGH_TURN = "throughTurn"


# -- ports -----------------------------------------------------------------------------------


class ApiPort(Protocol):
    """What the Engine needs of `transport.client.Client`: non-blocking requests."""

    def submit(self, method: str, params: Mapping[str, Any] | None = None) -> Future[Reply]: ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """A clock plus delayed calls. Tests substitute a fake clock that runs timers on `advance`."""

    def now(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer: ...


class _ThreadTimer:
    __slots__ = ("cancelled", "due", "fn")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ThreadScheduler:
    """The real scheduler: one daemon thread runs due callbacks in order of their due time."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _ThreadTimer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = _ThreadTimer(self.now() + max(0.0, delay), fn)
        with self._cond:
            heapq.heappush(self._heap, (timer.due, next(self._seq), timer))
            self._cond.notify()
        return timer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._heap and self._heap[0][0] <= self.now():
                        break
                    wait = None if not self._heap else self._heap[0][0] - self.now()
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                try:
                    timer.fn()
                except Exception:  # noqa: BLE001 - one bad callback must not stop the clock
                    log.exception("scheduled callback failed")


# -- values ----------------------------------------------------------------------------------


class MutationStatus(StrEnum):
    """Where a fork mutation stands, as the GUI sees it (seed 000 §9)."""

    IN_FLIGHT = "inFlight"
    """Sent, or accepted by the daemon; a second click sends nothing."""
    SUCCEEDED = "succeeded"
    """Committed and adopted: the child is in the session cache; see `ack` for the ACK."""
    FAILED = "failed"
    """Confirmed failure: nothing was created, the boundary is free; a new click gets new ids."""
    UNKNOWN = "unknown"
    """Delivery unknown (durable `unknown`, timeout, lost reply): a retry reuses the same ids."""


class AckState(StrEnum):
    """The client-observed ACK of a committed operation (seed 000 §8.3)."""

    NONE = "none"
    """Not committed (yet); nothing to acknowledge."""
    PENDING = "pending"
    """Committed and adopted; the ACK has not succeeded yet and is being retried."""
    OBSERVED = "observed"
    """The daemon confirmed the ACK; the boundary barrier is released."""


@dataclass(frozen=True, slots=True)
class ForkMutation:
    """One fork mutation: the identities the Engine owns and what is known of its operation."""

    source_session_id: str
    turn_id: str
    request_id: str
    target_session_id: str
    status: MutationStatus
    operation_id: str | None = None
    phase: str | None = None
    ack: AckState = AckState.NONE
    ack_attempts: int = 0
    create_attempts: int = 0
    error: str | None = None
    child_session_id: str | None = None
    error_detail: Mapping[str, Any] | None = None
    """The daemon's error reply when `fork.create` was refused before any operation:
    `{status, code, reason, message, params}` (`params.forkBoundaryReason` says why)."""
    point: str = THROUGH_TURN
    """`throughTurn`, or `latestSettled` for a full-Session fork (`turn_id` is then
    `LATEST_SETTLED`)."""
    boundary_turn_id: str | None = None
    """The Turn the fork goes through: `turn_id` for `throughTurn`; for `latestSettled` the
    Turn the daemon resolved (from the operation's point), None until an operation is known."""

    @property
    def boundary(self) -> str | None:
        return self.turn_id if self.point == THROUGH_TURN else self.boundary_turn_id

    @property
    def key(self) -> BoundaryKey:
        return (self.source_session_id, self.turn_id)

    @property
    def settled(self) -> bool:
        """Nothing left to do: only settled records may be pruned (unknown/ACK pending never)."""
        return self.status is MutationStatus.FAILED or (
            self.status is MutationStatus.SUCCEEDED and self.ack is AckState.OBSERVED
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "sourceAgentSessionId": self.source_session_id,
            "turnId": self.turn_id,
            "requestId": self.request_id,
            "targetAgentSessionId": self.target_session_id,
            "operationId": self.operation_id,
            "status": self.status.value,
            "phase": self.phase,
            "ack": self.ack.value,
            "ackAttempts": self.ack_attempts,
            "createAttempts": self.create_attempts,
            "error": self.error,
            "childAgentSessionId": self.child_session_id,
            "errorDetail": None if self.error_detail is None else dict(self.error_detail),
            "point": self.point,
            "boundaryTurnId": self.boundary,
        }


class ChangeKind(StrEnum):
    MUTATION = "mutation"
    """A fork mutation changed (`key` names it)."""
    SESSION = "session"
    """A session was upserted into or removed from the cache (`session_id` names it)."""
    EVENT = "event"
    """A raw daemon event (`event`), e.g. `turn.updated`, for views that render it."""
    OPERATION = "operation"
    """The set of known `unknown` operations changed (`key` = source and boundary Turn)."""


@dataclass(frozen=True, slots=True)
class EngineChange:
    kind: ChangeKind
    key: BoundaryKey | None = None
    session_id: str | None = None
    event: Mapping[str, Any] | None = None


Listener = Callable[[EngineChange], None]


@dataclass(slots=True)
class _Slot:
    """Mutable bookkeeping of one record (timers, attempt counters); never leaves the Engine."""

    attempt: int = 0
    create_timer: Timer | None = None
    poll_timer: Timer | None = None
    ack_attempt: int = 0
    ack_handled: int = 0
    ack_failures: int = 0
    ack_timer: Timer | None = None
    ack_retry: Timer | None = None
    settled_seq: int = 0

    def cancel_all(self) -> None:
        for timer in (self.create_timer, self.poll_timer, self.ack_timer, self.ack_retry):
            if timer is not None:
                timer.cancel()
        self.create_timer = self.poll_timer = self.ack_timer = self.ack_retry = None


# -- the Engine ------------------------------------------------------------------------------


class Engine:
    """Owns every fork mutation of one workspace for one client (see the module docstring).

    Thread-safe. Network calls are non-blocking (`ApiPort.submit`); replies are handled on the
    client's socket thread and timers on the scheduler, so no method blocks except
    `request`/`load_sessions`/`wait_for`, which must not run on the client's socket thread.
    """

    def __init__(
        self,
        api: ApiPort,
        workspace_id: str,
        *,
        scheduler: Scheduler | None = None,
        ack_deadline: float = ACK_DEADLINE_S,
        ack_backoff: tuple[float, ...] = ACK_BACKOFF_S,
        create_deadline: float = CREATE_DEADLINE_S,
        poll_interval: float = POLL_INTERVAL_S,
        get_deadline: float = GET_DEADLINE_S,
        max_settled: int = MAX_SETTLED,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.api = api
        self.workspace_id = workspace_id
        self._own_scheduler = scheduler is None
        self.scheduler: Scheduler = scheduler if scheduler is not None else ThreadScheduler()
        self.ack_deadline = ack_deadline
        self.ack_backoff = ack_backoff
        self.create_deadline = create_deadline
        self.poll_interval = poll_interval
        self.get_deadline = get_deadline
        self.max_settled = max_settled
        self._new_id = new_id
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._records: dict[BoundaryKey, ForkMutation] = {}
        self._slots: dict[BoundaryKey, _Slot] = {}
        self._by_operation: dict[str, BoundaryKey] = {}
        self._by_target: dict[str, BoundaryKey] = {}
        self._sessions: dict[str, dict[str, Any]] = {}
        self._removed: set[str] = set()
        self._unknown: dict[str, dict[str, Any]] = {}
        self._listeners: list[Listener] = []
        self._settled_seq = itertools.count(1)
        self._outbox: list[EngineChange] = []
        self._closed = False
        self._pump: _EventPump | None = None
        self._owned_client: Any = None

    # -- construction helpers ----------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        api_endpoint: str,
        events_endpoint: str | None,
        workspace_id: str,
        *,
        timeout: float = 10.0,
        curve: ClientCurve | None = None,
        events_exact: bool = False,
        **kwargs: Any,
    ) -> Engine:
        """An Engine that owns its Client and, if `events_endpoint` is given, an event pump.
        `curve`: the keys of a connection file, for tcp endpoints; `events_exact`: the
        endpoint is the daemon's terminated-topic one (`eventsExact`)."""
        from transport.client import Client

        client = Client(api_endpoint, timeout=timeout, curve=curve)
        engine = cls(client, workspace_id, **kwargs)
        engine._owned_client = client
        if events_endpoint:
            engine.attach_events(events_endpoint, curve=curve, exact=events_exact)
        return engine

    def attach_events(
        self, events_endpoint: str, *, curve: ClientCurve | None = None, exact: bool = False
    ) -> None:
        """Follow the daemon's events (`fork.operation`, `session.*`, `turn.updated`);
        `exact`: `events_endpoint` is the terminated-topic endpoint (`eventsExact`)."""
        with self._lock:
            if self._pump is None:
                self._pump = _EventPump(
                    events_endpoint, self.workspace_id, self.handle_event, curve=curve, exact=exact
                )

    # -- selectors ---------------------------------------------------------------------------

    def mutation(self, source_session_id: str, turn_id: str) -> ForkMutation | None:
        with self._lock:
            return self._records.get((source_session_id, turn_id))

    def mutations(self) -> list[ForkMutation]:
        with self._lock:
            return list(self._records.values())

    def is_fork_pending(self, source_session_id: str, turn_id: str) -> bool:
        """The GUI's pending selector: true while that exact Turn's fork is in flight."""
        record = self.mutation(source_session_id, turn_id)
        return record is not None and record.status is MutationStatus.IN_FLIGHT

    def unknown_operations(self, source_session_id: str) -> dict[str, dict[str, Any]]:
        """The `unknown` fork operations of a source this Engine has seen (its own forks'
        replies, any client's `fork.operation` events, `fork.resolve` results), by boundary
        Turn id: the Turns a view marks and offers Inspect / Adopt / Abandon for."""
        with self._lock:
            return {
                str((op.get("point") or {}).get("turnId")): dict(op)
                for op in self._unknown.values()
                if op.get("sourceAgentSessionId") == source_session_id
            }

    def session(self, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            value = self._sessions.get(session_id)
            return None if value is None else dict(value)

    def sessions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(s) for s in self._sessions.values()]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Block until `predicate()` is truthy (re-checked on every Engine change)."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    # -- plain requests (blocking) -----------------------------------------------------------

    def request(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """One request in this workspace; raises `ApiError`, or `TimeoutError` without a reply."""
        body = dict(params or {})
        if method != "host.status":
            body.setdefault("workspaceId", self.workspace_id)
        future = self.api.submit(method, body)
        try:
            status, result = future.result(timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"no reply to {method} within {timeout} s") from exc
        if status >= 400:
            raise ApiError.from_reply(status, result)
        return result

    def load_sessions(self) -> list[dict[str, Any]]:
        """Fill the session cache from `session.list` (every page)."""
        cursor: str | None = None
        loaded: list[dict[str, Any]] = []
        while True:
            params: dict[str, Any] = {"limit": 200}
            if cursor:
                params["cursor"] = cursor
            page = self.request("session.list", params)
            loaded.extend(page["sessions"])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        for session in loaded:
            self.upsert_session(session)
        return loaded

    def upsert_session(self, session: Mapping[str, Any]) -> None:
        with self._lock:
            self._upsert_locked(session)
        self._flush()

    # -- the fork mutation -------------------------------------------------------------------

    def fork(self, source_session_id: str, turn_id: str) -> ForkMutation:
        """The Fork click on one boundary. Returns the record; never blocks on the network.

        Identities: a first attempt, or one after a confirmed failure or an observed success,
        gets new request/target ids; a retry after `unknown` reuses them; while in flight or
        while an ACK is pending nothing is sent at all.
        """
        return self._fork(source_session_id, turn_id, THROUGH_TURN)

    def fork_latest(self, source_session_id: str) -> ForkMutation:
        """The Session-level Fork ("from where we are now", issue 21 §2): `fork.create` with
        `point: {type: "latestSettled"}`. The same record, identities, replay, reconciliation and
        ACK rules as `fork`, on the boundary key `(source, LATEST_SETTLED)`; the daemon resolves
        and freezes the Turn, and a replay of the same request returns that original boundary
        even after new Turns. Read it back with `mutation(source, LATEST_SETTLED)`."""
        return self._fork(source_session_id, LATEST_SETTLED, LATEST_SETTLED)

    def _fork(self, source_session_id: str, turn_id: str, point: str) -> ForkMutation:
        key = (source_session_id, turn_id)
        with self._lock:
            if self._closed:
                raise ClientClosed("engine is closed")
            record = self._records.get(key)
            if record is not None and (
                record.status is MutationStatus.IN_FLIGHT
                or (
                    record.status is MutationStatus.SUCCEEDED
                    and record.ack is not AckState.OBSERVED
                )
            ):
                return record
            if record is not None and record.status is MutationStatus.UNKNOWN:
                # The first request may have happened: only the same identity is safe to resend.
                record = replace(
                    record,
                    status=MutationStatus.IN_FLIGHT,
                    error=None,
                    create_attempts=record.create_attempts + 1,
                )
                slot = self._slots[key]
            else:
                if record is not None:
                    self._forget_locked(key)
                record = ForkMutation(
                    source_session_id=source_session_id,
                    turn_id=turn_id,
                    request_id=self._new_id(),
                    target_session_id=self._new_id(),
                    status=MutationStatus.IN_FLIGHT,
                    create_attempts=1,
                    point=point,
                )
                slot = _Slot()
                self._slots[key] = slot
            self._put_locked(record)
            self._send_create_locked(key, slot, record)
        self._flush()
        return self.mutation(source_session_id, turn_id) or record

    def resolve(
        self,
        operation_id: str,
        action: str,
        *,
        request_id: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """`fork.resolve` (issue 21 §1), blocking: `inspect`, `adopt` or `abandon` an `unknown`
        operation; returns `{operation, evidence}` or raises `ApiError`/`TimeoutError`.

        The result goes through the fork machinery: an adopted (committed) operation becomes
        the succeeded mutation of its boundary, its child upserted and ACKed exactly as a fork
        commit; an abandoned one a confirmed failure (the boundary is free). Either is tracked
        even when another client started the fork.
        """
        result = self.request(
            "fork.resolve",
            {
                "operationId": operation_id,
                "requestId": request_id or self._new_id(),
                "action": action,
            },
            timeout=timeout,
        )
        op = result.get("operation")
        if isinstance(op, dict):
            with self._lock:
                if not self._closed:
                    self._note_operation_locked(op)
                    if op.get("status") in ("committed", "abandoned"):
                        self._track_resolved_locked(op)
            self._flush()
        return result

    def _track_resolved_locked(self, op: Mapping[str, Any]) -> None:
        key = operation_key(op)
        record = self._records.get(key)
        if record is not None and record.operation_id != op.get("operationId"):
            busy = record.status is MutationStatus.IN_FLIGHT or (
                record.status is MutationStatus.SUCCEEDED and record.ack is AckState.PENDING
            )
            if busy:
                return  # another fork of that boundary is live; events will settle ours
            self._forget_locked(key)
            record = None
        if record is None:
            point = op.get("point") or {}
            record = ForkMutation(
                source_session_id=key[0],
                turn_id=key[1],
                request_id=str(op.get("requestId")),
                target_session_id=str(op.get("targetAgentSessionId")),
                status=MutationStatus.UNKNOWN,
                operation_id=str(op.get("operationId")),
                phase=op.get("phase"),
                point=str(point.get("type") or THROUGH_TURN),
                boundary_turn_id=str(point.get("turnId")),
            )
            self._slots[key] = _Slot()
            self._put_locked(record)
        self._apply_to_key_locked(key, op, adopt=True)

    def _send_create_locked(self, key: BoundaryKey, slot: _Slot, record: ForkMutation) -> None:
        slot.cancel_all()
        slot.attempt += 1
        attempt = slot.attempt
        params = {
            "workspaceId": self.workspace_id,
            "agentSessionId": record.source_session_id,
            "requestId": record.request_id,
            "targetAgentSessionId": record.target_session_id,
            "point": {"type": "throughTurn", "turnId": record.turn_id}
            if record.point == THROUGH_TURN
            else {"type": LATEST_SETTLED},
        }
        slot.create_timer = self.scheduler.call_later(
            self.create_deadline, lambda: self._on_create_deadline(key, attempt)
        )
        future = self._submit("fork.create", params)
        if future is not None:
            future.add_done_callback(lambda f: self._on_create_reply(key, attempt, f))

    def _submit(self, method: str, params: Mapping[str, Any]) -> Future[Reply] | None:
        try:
            return self.api.submit(method, params)
        except ClientClosed:
            return None

    def _on_create_deadline(self, key: BoundaryKey, attempt: int) -> None:
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if slot is None or record is None or slot.attempt != attempt:
                return
            slot.create_timer = None
            if record.status is MutationStatus.IN_FLIGHT and record.operation_id is None:
                self._put_locked(
                    replace(
                        record,
                        status=MutationStatus.UNKNOWN,
                        error=f"no reply to fork.create within {self.create_deadline:g} s",
                    )
                )
        self._flush()

    def _on_create_reply(self, key: BoundaryKey, attempt: int, future: Future[Reply]) -> None:
        try:
            status, body = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001 - a transport failure is delivery-unknown
            status, body = 599, {"reason": "transport_error", "message": str(exc)}
        with self._lock:
            if self._closed:
                return
            slot, record = self._slots.get(key), self._records.get(key)
            operation = body.get("operation") if status < 400 else None
            current = slot is not None and record is not None and slot.attempt == attempt
            if not current:
                # A stale reply can still tell us about an operation we track.
                if isinstance(operation, dict):
                    self._apply_operation_locked(operation, adopt=False)
            else:
                assert slot is not None and record is not None
                if slot.create_timer is not None:
                    slot.create_timer.cancel()
                    slot.create_timer = None
                if isinstance(operation, dict):
                    self._apply_to_key_locked(key, operation, adopt=True)
                elif status < 400:
                    self._put_locked(
                        replace(record, status=MutationStatus.UNKNOWN, error="malformed_reply")
                    )
                else:
                    reason = str(body.get("reason", "")) or "error"
                    confirmed = status < 500 or reason == "agent_session_fork_failed"
                    if record.status is not MutationStatus.SUCCEEDED:
                        self._put_locked(
                            replace(
                                record,
                                status=MutationStatus.FAILED
                                if confirmed
                                else MutationStatus.UNKNOWN,
                                error=reason,
                                error_detail={
                                    "status": status,
                                    "code": body.get("code"),
                                    "reason": reason,
                                    "message": body.get("message"),
                                    "params": dict(body.get("params") or {}),
                                },
                            )
                        )
                        if confirmed:
                            self._settle_locked(key)
        self._flush()

    # -- reconciliation ----------------------------------------------------------------------

    def _schedule_poll_locked(self, key: BoundaryKey) -> None:
        slot = self._slots[key]
        if slot.poll_timer is not None:
            return
        slot.poll_timer = self.scheduler.call_later(self.poll_interval, lambda: self._poll(key))

    def _poll(self, key: BoundaryKey) -> None:
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if self._closed or slot is None or record is None:
                return
            slot.poll_timer = None
            if record.status is not MutationStatus.IN_FLIGHT or record.operation_id is None:
                return
            op_id, attempt = record.operation_id, slot.attempt
            done = threading.Event()
            slot.poll_timer = self.scheduler.call_later(
                self.get_deadline, lambda: self._on_poll_failed(key, attempt, done, "timeout")
            )
            future = self._submit(
                "fork.get", {"workspaceId": self.workspace_id, "operationId": op_id}
            )
        if future is not None:
            future.add_done_callback(lambda f: self._on_poll_reply(key, attempt, done, f))

    def _on_poll_reply(
        self, key: BoundaryKey, attempt: int, done: threading.Event, future: Future[Reply]
    ) -> None:
        try:
            status, body = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001
            self._on_poll_failed(key, attempt, done, str(exc))
            return
        operation = body.get("operation") if status < 400 else None
        if not isinstance(operation, dict):
            self._on_poll_failed(key, attempt, done, str(body.get("reason", "error")))
            return
        with self._lock:
            if done.is_set():
                self._apply_operation_locked(operation, adopt=False)
            else:
                done.set()
                slot = self._slots.get(key)
                if slot is not None and slot.poll_timer is not None:
                    slot.poll_timer.cancel()
                    slot.poll_timer = None
                if slot is not None and slot.attempt == attempt:
                    self._apply_to_key_locked(key, operation, adopt=False)
                else:
                    self._apply_operation_locked(operation, adopt=False)
        self._flush()

    def _on_poll_failed(
        self, key: BoundaryKey, attempt: int, done: threading.Event, why: str
    ) -> None:
        with self._lock:
            if done.is_set():
                return
            done.set()
            slot, record = self._slots.get(key), self._records.get(key)
            if slot is None or record is None or slot.attempt != attempt:
                return
            slot.poll_timer = None
            if record.status is MutationStatus.IN_FLIGHT:
                # Seed 000 §8.2: a failed reconciliation hands delivery-unknown to the Engine;
                # events may still complete it, and a retry reuses the identity.
                self._put_locked(
                    replace(record, status=MutationStatus.UNKNOWN, error=f"fork.get failed: {why}")
                )
        self._flush()

    # -- events ------------------------------------------------------------------------------

    def handle_event(self, event: Mapping[str, Any]) -> None:
        """Apply one daemon event (the event pump calls this; tests may too)."""
        kind = event.get("type")
        with self._lock:
            if self._closed:
                return
            if kind == "fork.operation" and isinstance(event.get("operation"), dict):
                self._apply_operation_locked(event["operation"], adopt=False)
            elif kind == "session.upserted" and isinstance(event.get("session"), dict):
                session = event["session"]
                self._upsert_locked(session)
                self._adopt_from_session_locked(session)
            elif kind == "session.removed" and isinstance(event.get("agentSessionId"), str):
                # A removal only leaves the cache: it does not revoke an observation or
                # cancel a pending ACK (seed 000 §8.3).
                sid = event["agentSessionId"]
                self._removed.add(sid)
                if self._sessions.pop(sid, None) is not None:
                    self._outbox.append(EngineChange(ChangeKind.SESSION, session_id=sid))
            self._outbox.append(EngineChange(ChangeKind.EVENT, event=event))
        self._flush()

    def _key_for_operation_locked(self, op: Mapping[str, Any]) -> BoundaryKey | None:
        op_id = op.get("operationId")
        if isinstance(op_id, str) and op_id in self._by_operation:
            return self._by_operation[op_id]
        key = operation_key(op)
        record = self._records.get(key)
        if record is None or record.operation_id is not None:
            return None
        same_identity = record.request_id == op.get("requestId") or (
            record.target_session_id == op.get("targetAgentSessionId")
        )
        return key if same_identity else None

    def _note_operation_locked(self, op: Mapping[str, Any]) -> None:
        """Keep the index of `unknown` operations (any client's, from replies and events) that
        views mark on their boundary Turn; a later copy in another status drops it."""
        op_id = op.get("operationId")
        if not isinstance(op_id, str):
            return
        point = op.get("point") or {}
        where = (str(op.get("sourceAgentSessionId")), str(point.get("turnId")))
        if op.get("status") == "unknown":
            if self._unknown.get(op_id) != op:
                self._unknown[op_id] = dict(op)
                self._outbox.append(EngineChange(ChangeKind.OPERATION, key=where))
        elif self._unknown.pop(op_id, None) is not None:
            self._outbox.append(EngineChange(ChangeKind.OPERATION, key=where))

    def _apply_operation_locked(self, op: Mapping[str, Any], *, adopt: bool) -> None:
        self._note_operation_locked(op)
        key = self._key_for_operation_locked(op)
        if key is not None:
            self._apply_to_key_locked(key, op, adopt=adopt)

    def _apply_to_key_locked(self, key: BoundaryKey, op: Mapping[str, Any], *, adopt: bool) -> None:
        self._note_operation_locked(op)
        record = self._records.get(key)
        if record is None:
            return
        point = op.get("point") or {}
        if operation_key(op) != key:
            self._put_locked(
                replace(record, status=MutationStatus.UNKNOWN, error="mismatched_operation")
            )
            return
        if record.point != THROUGH_TURN and record.boundary_turn_id != point.get("turnId"):
            # A full-Session fork learns the Turn the daemon resolved and froze.
            record = replace(record, boundary_turn_id=str(point.get("turnId")))
        if record.status is MutationStatus.SUCCEEDED:
            return  # adopted once; later copies of the operation change nothing
        if record.operation_id is not None and op.get("operationId") != record.operation_id:
            return
        if adopt or record.operation_id is None:
            # The daemon may return the durable operation of an earlier identity on this
            # boundary (barrier): that identity, not ours, is the truth from now on.
            record = replace(
                record,
                request_id=str(op.get("requestId") or record.request_id),
                target_session_id=str(op.get("targetAgentSessionId") or record.target_session_id),
                operation_id=str(op.get("operationId")),
            )
            self._index_locked(record)
        status = op.get("status")
        slot = self._slots[key]
        if status == "accepted":
            if record.status is MutationStatus.FAILED:
                return
            self._put_locked(
                replace(record, status=MutationStatus.IN_FLIGHT, phase=op.get("phase"), error=None)
            )
            self._schedule_poll_locked(key)
        elif status == "committed":
            self._adopt_committed_locked(record, op.get("session"), op.get("lineage"))
        elif status in ("failed", "abandoned"):
            # `abandoned` (fork.resolve, issue 21) frees the boundary exactly as `failed` does.
            slot.cancel_all()
            self._put_locked(
                replace(
                    record,
                    status=MutationStatus.FAILED,
                    phase=op.get("phase"),
                    error=str(op.get("error") or "failed"),
                )
            )
            self._settle_locked(key)
        elif status == "unknown":
            slot.cancel_all()
            self._put_locked(
                replace(
                    record,
                    status=MutationStatus.UNKNOWN,
                    phase=op.get("phase"),
                    error=str(op.get("error") or "delivery unknown"),
                )
            )
        else:
            self._put_locked(replace(record, status=MutationStatus.UNKNOWN, error="bad_status"))

    def _adopt_from_session_locked(self, session: Mapping[str, Any]) -> None:
        """A canonical child upsert completes its mutation even before any reply (seed 000 §9)."""
        lineage = session.get("forkedFrom")
        if not isinstance(lineage, dict):
            return
        key = self._by_operation.get(str(lineage.get("operationId")))
        if key is None:
            key = self._by_target.get(str(session.get("agentSessionId")))
        record = None if key is None else self._records.get(key)
        if record is None or record.status is MutationStatus.SUCCEEDED:
            return
        if record.target_session_id != session.get("agentSessionId"):
            return
        if record.operation_id is None:
            record = replace(record, operation_id=str(lineage.get("operationId")))
            self._index_locked(record)
        self._adopt_committed_locked(record, session, lineage)

    def _adopt_committed_locked(self, record: ForkMutation, session: Any, lineage: Any) -> None:
        key = record.key
        valid = (
            isinstance(session, dict)
            and isinstance(lineage, dict)
            and session.get("agentSessionId") == record.target_session_id
            and lineage.get("operationId") == record.operation_id
            and lineage.get("sourceAgentSessionId") == record.source_session_id
        )
        if not valid:
            self._put_locked(
                replace(record, status=MutationStatus.UNKNOWN, error="invalid_committed_result")
            )
            return
        if record.point != THROUGH_TURN and record.boundary_turn_id is None:
            record = replace(record, boundary_turn_id=str(lineage.get("sourceTurnId")))
        slot = self._slots[key]
        slot.cancel_all()
        # Upsert first: the ACK must only go out once the child is in the canonical cache.
        self._upsert_locked(session)
        self._put_locked(
            replace(
                record,
                status=MutationStatus.SUCCEEDED,
                phase="committed",
                ack=AckState.PENDING,
                error=None,
                child_session_id=record.target_session_id,
            )
        )
        self._send_ack_locked(key)

    # -- ACK ---------------------------------------------------------------------------------

    def _send_ack_locked(self, key: BoundaryKey) -> None:
        slot, record = self._slots[key], self._records[key]
        slot.ack_attempt += 1
        attempt = slot.ack_attempt
        self._put_locked(replace(record, ack_attempts=record.ack_attempts + 1))
        slot.ack_timer = self.scheduler.call_later(
            self.ack_deadline,
            lambda: self._on_ack_failed(key, attempt, f"no reply within {self.ack_deadline:g} s"),
        )
        future = self._submit(
            "fork.acknowledge",
            {"workspaceId": self.workspace_id, "operationId": record.operation_id},
        )
        if future is not None:
            future.add_done_callback(lambda f: self._on_ack_reply(key, attempt, f))

    def _on_ack_reply(self, key: BoundaryKey, attempt: int, future: Future[Reply]) -> None:
        try:
            status, body = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001
            self._on_ack_failed(key, attempt, str(exc))
            return
        if status >= 400:
            self._on_ack_failed(key, attempt, str(body.get("reason", status)))
            return
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if slot is None or record is None or record.ack is AckState.OBSERVED:
                return
            # Any successful ACK of this operation (even a late one) is an observation.
            for timer in (slot.ack_timer, slot.ack_retry):
                if timer is not None:
                    timer.cancel()
            slot.ack_timer = slot.ack_retry = None
            self._put_locked(replace(record, ack=AckState.OBSERVED, error=None))
            self._settle_locked(key)
        self._flush()

    def _on_ack_failed(self, key: BoundaryKey, attempt: int, why: str) -> None:
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if self._closed or slot is None or record is None:
                return
            # The deadline and a late error reply of one attempt must schedule one retry only.
            if record.ack is not AckState.PENDING or attempt != slot.ack_attempt:
                return
            if slot.ack_handled >= attempt:
                return
            slot.ack_handled = attempt
            if slot.ack_timer is not None:
                slot.ack_timer.cancel()
                slot.ack_timer = None
            delay = self.ack_backoff[min(slot.ack_failures, len(self.ack_backoff) - 1)]
            slot.ack_failures += 1
            slot.ack_retry = self.scheduler.call_later(delay, lambda: self._retry_ack(key))
            self._put_locked(replace(record, error=f"ack failed: {why}"))
        self._flush()

    def _retry_ack(self, key: BoundaryKey) -> None:
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if self._closed or slot is None or record is None or record.ack is not AckState.PENDING:
                return
            slot.ack_retry = None
            self._send_ack_locked(key)
        self._flush()

    def next_ack_retry_delay(self, source_session_id: str, turn_id: str) -> float | None:
        """The backoff the next ACK failure of this record would wait (for tests and views)."""
        with self._lock:
            slot = self._slots.get((source_session_id, turn_id))
            if slot is None:
                return None
            return self.ack_backoff[min(slot.ack_failures, len(self.ack_backoff) - 1)]

    # -- bookkeeping -------------------------------------------------------------------------

    def _put_locked(self, record: ForkMutation) -> None:
        if self._records.get(record.key) == record:
            return
        self._records[record.key] = record
        self._index_locked(record)
        self._outbox.append(EngineChange(ChangeKind.MUTATION, key=record.key))

    def _index_locked(self, record: ForkMutation) -> None:
        if record.operation_id is not None:
            self._by_operation[record.operation_id] = record.key
        self._by_target[record.target_session_id] = record.key

    def _forget_locked(self, key: BoundaryKey) -> None:
        record = self._records.pop(key, None)
        slot = self._slots.pop(key, None)
        if slot is not None:
            slot.cancel_all()
        if record is not None:
            if (
                record.operation_id is not None
                and self._by_operation.get(record.operation_id) == key
            ):
                del self._by_operation[record.operation_id]
            if self._by_target.get(record.target_session_id) == key:
                del self._by_target[record.target_session_id]

    def _settle_locked(self, key: BoundaryKey) -> None:
        """Stamp a settled record and prune the oldest settled ones beyond `max_settled`."""
        slot = self._slots.get(key)
        if slot is not None and slot.settled_seq == 0:
            slot.settled_seq = next(self._settled_seq)
        settled = [(self._slots[k].settled_seq, k) for k, r in self._records.items() if r.settled]
        excess = len(settled) - self.max_settled
        if excess > 0:
            for _, old in sorted(settled)[:excess]:
                self._forget_locked(old)
                self._outbox.append(EngineChange(ChangeKind.MUTATION, key=old))

    def _upsert_locked(self, session: Mapping[str, Any]) -> None:
        sid = str(session.get("agentSessionId"))
        if sid in self._removed:
            return  # a stale copy (e.g. an operation's snapshot) must not resurrect it
        current = self._sessions.get(sid)
        if current is not None and int(current.get("updatedAtUnixMs") or 0) > int(
            session.get("updatedAtUnixMs") or 0
        ):
            return
        self._sessions[sid] = dict(session)
        self._outbox.append(EngineChange(ChangeKind.SESSION, session_id=sid))

    def _flush(self) -> None:
        """Notify listeners outside the lock, in order, and wake `wait_for` callers."""
        with self._lock:
            changes, self._outbox = self._outbox, []
            listeners = list(self._listeners)
            self._cond.notify_all()
        for change in changes:
            for listener in listeners:
                try:
                    listener(change)
                except Exception:  # noqa: BLE001 - a view's bug must not break the Engine
                    log.exception("engine listener failed")

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every timer (ACK retries included) and the event pump; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for slot in self._slots.values():
                slot.cancel_all()
            pump, self._pump = self._pump, None
            self._cond.notify_all()
        if pump is not None:
            pump.close()
        if self._own_scheduler and isinstance(self.scheduler, ThreadScheduler):
            self.scheduler.close()
        if self._owned_client is not None:
            self._owned_client.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def operation_key(op: Mapping[str, Any]) -> BoundaryKey:
    """The boundary key of a wire operation: `(source, turnId)` for `throughTurn`,
    `(source, LATEST_SETTLED)` for a full-Session fork."""
    point = op.get("point") or {}
    source = str(op.get("sourceAgentSessionId"))
    if point.get("type") == LATEST_SETTLED:
        return (source, LATEST_SETTLED)
    return (source, str(point.get("turnId")))


class _EventPump:
    """A thread reading the events socket for one workspace and handing events to the Engine."""

    def __init__(
        self,
        endpoint: str,
        workspace_id: str,
        sink: Callable[[Mapping[str, Any]], None],
        *,
        curve: ClientCurve | None = None,
        exact: bool = False,
    ) -> None:
        self._workspace_id = workspace_id
        self._sink = sink
        self._stop = threading.Event()
        self._subscriber = EventSubscriber(endpoint, (workspace_id,), curve=curve, exact=exact)
        self._thread = threading.Thread(target=self._run, name="engine-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                message = self._subscriber.next_message(0.1)
                if message is None:
                    continue
                topic, event = message
                if topic != self._workspace_id:
                    continue  # SUB topics are prefixes: "ws" would also match "ws2"
                try:
                    self._sink(event)
                except Exception:  # noqa: BLE001
                    log.exception("event handling failed")
        finally:
            self._subscriber.close()

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)
