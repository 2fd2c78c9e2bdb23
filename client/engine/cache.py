"""The Engine's state and its session/record cache: the records of fork mutations and the
bookkeeping around them (indexes, pruning of settled ones), the session cache, listeners and
`wait_for`, and the plain blocking requests that fill the cache (`request`, `load_sessions`).

The other Engine modules build on `EngineCache`; every change goes through the outbox and
`_flush`, which notifies listeners outside the lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from client.engine.ports import ApiPort, Reply, Scheduler, ThreadScheduler, Timer, _EventPump
from client.engine.values import (
    ACK_BACKOFF_S,
    ACK_DEADLINE_S,
    CREATE_DEADLINE_S,
    GET_DEADLINE_S,
    MAX_SETTLED,
    POLL_INTERVAL_S,
    BoundaryKey,
    ChangeKind,
    EngineChange,
    ForkMutation,
    Listener,
    MutationStatus,
)
from transport.client import ApiError, ClientClosed

log = logging.getLogger("client.engine")


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


class EngineCache:
    """The Engine's state (see `client.engine.Engine`), its selectors and its bookkeeping."""

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

    def _submit(self, method: str, params: Mapping[str, Any]) -> Future[Reply] | None:
        try:
            return self.api.submit(method, params)
        except ClientClosed:
            return None

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
