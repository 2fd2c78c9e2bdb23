"""`serve -v`: one log line per request, per Turn transition and per fork transition, each
with the Session (and operation, Turn) ids, on the `agenthost.activity` logger.

The logger is quiet (WARNING) unless `-v` turns it on, so a daemon without `-v` pays one
`isEnabledFor` per request and per store write. Transitions are read on the store's
change notifications: a Turn's `phase`/`outcome` and an operation's
`status`/`phase`; a Turn's new messages are not transitions and log nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from domain.errors import HostError
from protocol.envelope import Request
from storage.models import ForkOperationChanged, SessionChanged, TurnChanged
from storage.store import Store
from transport.server import Responder

log = logging.getLogger("agenthost.activity")
log.setLevel(logging.WARNING)

_REMEMBERED = 10_000  # Turns/operations whose last state is kept to tell a transition


def enable(on: bool = True) -> None:
    log.setLevel(logging.INFO if on else logging.WARNING)


def enabled() -> bool:
    return log.isEnabledFor(logging.INFO)


def _ids(params: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> str:
    parts = []
    session = params.get("agentSessionId")
    if session:
        parts.append(f"session={session}")
    op = params.get("operationId")
    turn = params.get("turnId")
    if result:
        op = op or (result.get("operation") or {}).get("operationId")
        turn = turn or (result.get("turn") or {}).get("turnId")
        if not session and result.get("session"):
            parts.append(f"session={result['session'].get('agentSessionId')}")
    if turn:
        parts.append(f"turn={turn}")
    if op:
        parts.append(f"op={op}")
    return " ".join(parts)


class LoggedResponder:
    """Wraps a request's responder: the answer is logged as one line when it is sent."""

    __slots__ = ("_inner", "_request", "_started")

    def __init__(self, inner: Responder, request: Request) -> None:
        self._inner = inner
        self._request = request
        self._started = time.monotonic()

    def _line(self, outcome: str, result: Mapping[str, Any] | None = None) -> None:
        req = self._request
        params = req.params if isinstance(req.params, Mapping) else {}
        ms = (time.monotonic() - self._started) * 1000
        ids = _ids(params, result)
        log.info(
            "request %s id=%s ws=%s%s -> %s (%.0f ms)",
            req.method,
            req.id,
            params.get("workspaceId", "-"),
            f" {ids}" if ids else "",
            outcome,
            ms,
        )

    def result(self, status: int, result: Mapping[str, Any]) -> bool:
        sent = self._inner.result(status, result)
        if sent:
            self._line(str(status), result)
        return sent

    def error(self, error: HostError) -> bool:
        sent = self._inner.error(error)
        if sent:
            self._line(f"{error.status} {error.reason}")
        return sent


class Transitions:
    """Logs a Turn or fork operation when its state changes (not on every update).

    Subscribed to the store, so it runs on the writer's thread right after each COMMIT and
    reads the state that commit made: fast transitions (an operation's `frozen` then
    `dispatching`) are each seen, not folded into one by a later read.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[Any, ...]] = {}

    def __call__(self, change: Any) -> None:
        if not enabled():
            return
        # HostError: gone before we read it back (e.g. a released reservation).
        with contextlib.suppress(HostError):
            self._observe(change)

    def _observe(self, change: Any) -> None:
        store = self._store
        if isinstance(change, TurnChanged):
            turn = store.turns.get_turn(change.workspace_id, change.session_id, change.turn_id)
            if self._changed(f"t:{turn.turn_id}", (turn.phase, turn.outcome)):
                log.info(
                    "turn %s%s session=%s turn=%s seq=%s%s",
                    turn.phase,
                    f" {turn.outcome}" if turn.outcome else "",
                    change.session_id,
                    turn.turn_id,
                    turn.sequence,
                    f" error={turn.error!r}" if turn.error else "",
                )
        elif isinstance(change, ForkOperationChanged):
            op = store.fork_queries.get_fork_operation(change.workspace_id, change.operation_id)
            status, phase = op.public_status.value, op.phase.value
            if self._changed(f"f:{op.operation_id}", (status, phase)):
                log.info(
                    "fork %s/%s op=%s session=%s target=%s turn=%s%s",
                    status,
                    phase,
                    op.operation_id,
                    op.source_session_id,
                    op.target_session_id,
                    op.source_turn_id,
                    f" error={op.error!r}" if op.error else "",
                )
        elif isinstance(change, SessionChanged) and change.removed:
            log.info("session removed session=%s", change.session_id)

    def _changed(self, key: str, state: tuple[Any, ...]) -> bool:
        with self._lock:
            if self._seen.get(key) == state:
                return False
            self._seen.pop(key, None)
            self._seen[key] = state  # newest last, so the oldest are dropped first
            if len(self._seen) > _REMEMBERED:
                del self._seen[next(iter(self._seen))]
            return True
