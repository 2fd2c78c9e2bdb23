"""Merging what the daemon says about fork operations into the Engine's records: daemon events
(`fork.operation`, `session.*`, `turn.updated`), `fork.get` polls of accepted operations and
the adoption of a committed child (upserted into the cache, then ACKed).

Every source of news about an operation (a reply, a poll, an event, a child's upsert) ends in
`apply_to_key_locked`, the one place a record's status moves.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import replace

from client.engine.acks import Acknowledgements
from client.engine.cache import SessionCache
from client.engine.calls import WorkspaceCalls
from client.engine.changes import ChangeFeed
from client.engine.ports import Scheduler
from client.engine.records import MutationRecords
from client.engine.unknown import UnknownOperations
from client.engine.values import (
    LATEST_SETTLED,
    THROUGH_TURN,
    AckState,
    BoundaryKey,
    ChangeKind,
    EngineChange,
    ForkMutation,
    MutationStatus,
    operation_key,
    same_boundary,
)
from protocol.events import (
    FORK_OPERATION,
    SESSION_REMOVED,
    SESSION_UPSERTED,
    ClientEvent,
    UnknownEvent,
)
from protocol.methods import FORK_GET, OperationParams, OperationResult
from protocol.objects import Lineage, Operation, Session
from transport.client import ClientClosed, Reply


class Reconciliation:
    """Applies events, poll replies and committed results to the records and the cache."""

    def __init__(
        self,
        feed: ChangeFeed,
        records: MutationRecords,
        sessions: SessionCache,
        unknown: UnknownOperations,
        acks: Acknowledgements,
        calls: WorkspaceCalls,
        scheduler: Scheduler,
        *,
        poll_interval: float,
        get_deadline: float,
    ) -> None:
        self._feed = feed
        self._records = records
        self._sessions = sessions
        self._unknown = unknown
        self._acks = acks
        self._calls = calls
        self._scheduler = scheduler
        self.poll_interval = poll_interval
        self.get_deadline = get_deadline

    # -- events ------------------------------------------------------------------------------

    def handle_event(self, event: ClientEvent) -> None:
        """Apply one daemon event (the event pump calls this; tests may too). An
        `UnknownEvent` changes no record; it is still published for views that log it."""
        with self._feed.lock:
            if self._feed.closed:
                return
            if isinstance(event, UnknownEvent):
                pass
            elif event["type"] == FORK_OPERATION:
                self.apply_operation_locked(event["operation"], adopt=False)
            elif event["type"] == SESSION_UPSERTED:
                session = event["session"]
                self._sessions.upsert_locked(session)
                self._adopt_from_session_locked(session)
            elif event["type"] == SESSION_REMOVED:
                # A removal only leaves the cache: it does not revoke an observation or
                # cancel a pending ACK (seed 000 §8.3).
                self._sessions.remove_locked(event["agentSessionId"])
            self._feed.publish(EngineChange(ChangeKind.EVENT, event=event))
        self._feed.flush()

    # -- polls -------------------------------------------------------------------------------

    def _schedule_poll_locked(self, key: BoundaryKey) -> None:
        slot = self._records.slot_of(key)
        if slot.poll_timer is not None:
            return
        slot.poll_timer = self._scheduler.call_later(self.poll_interval, lambda: self._poll(key))

    def _poll(self, key: BoundaryKey) -> None:
        with self._feed.lock:
            slot, record = self._records.slot(key), self._records.get(key)
            if self._feed.closed or slot is None or record is None:
                return
            slot.poll_timer = None
            if record.status is not MutationStatus.IN_FLIGHT or record.operation_id is None:
                return
            op_id, attempt = record.operation_id, slot.attempt
            done = threading.Event()
            slot.poll_timer = self._scheduler.call_later(
                self.get_deadline, lambda: self._on_poll_failed(key, attempt, done, "timeout")
            )
            future = self._calls.submit(
                FORK_GET, OperationParams(workspaceId=self._calls.workspace_id, operationId=op_id)
            )
        if future is not None:
            future.add_done_callback(lambda f: self._on_poll_reply(key, attempt, done, f))

    def _on_poll_reply(
        self,
        key: BoundaryKey,
        attempt: int,
        done: threading.Event,
        future: Future[Reply[OperationResult]],
    ) -> None:
        try:
            reply = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001
            self._on_poll_failed(key, attempt, done, str(exc))
            return
        error = reply.error()
        operation = None if error is not None else reply.result().get("operation")
        if not isinstance(operation, dict):
            why = "error" if error is None else str(error.get("reason", "error"))
            self._on_poll_failed(key, attempt, done, why)
            return
        with self._feed.lock:
            if done.is_set():
                self.apply_operation_locked(operation, adopt=False)
            else:
                done.set()
                slot = self._records.slot(key)
                if slot is not None and slot.poll_timer is not None:
                    slot.poll_timer.cancel()
                    slot.poll_timer = None
                if slot is not None and slot.attempt == attempt:
                    self.apply_to_key_locked(key, operation, adopt=False)
                else:
                    self.apply_operation_locked(operation, adopt=False)
        self._feed.flush()

    def _on_poll_failed(
        self, key: BoundaryKey, attempt: int, done: threading.Event, why: str
    ) -> None:
        with self._feed.lock:
            if done.is_set():
                return
            done.set()
            slot, record = self._records.slot(key), self._records.get(key)
            if slot is None or record is None or slot.attempt != attempt:
                return
            slot.poll_timer = None
            if record.status is MutationStatus.IN_FLIGHT:
                # Seed 000 §8.2: a failed reconciliation hands delivery-unknown to the Engine;
                # events may still complete it, and a retry reuses the identity.
                self._records.put(
                    replace(record, status=MutationStatus.UNKNOWN, error=f"fork.get failed: {why}")
                )
        self._feed.flush()

    # -- merging an operation into its record -----------------------------------------------

    def _keys_for_operation_locked(self, op: Operation) -> list[BoundaryKey]:
        """Every record tracking this operation. One boundary (source + Turn) has one operation
        whatever point kind asked (law 8), so a `throughTurn` record and a `latestSettled` one
        that the daemon's barrier answered with the same operation both follow it."""
        op_id = op.get("operationId")
        keys = self._records.tracking(op_id)
        if keys or not isinstance(op_id, str):
            return keys
        point = op.get("point") or {}
        source = str(op.get("sourceAgentSessionId"))
        for key in dict.fromkeys(
            (operation_key(op), (source, str(point.get("turnId"))), (source, LATEST_SETTLED))
        ):
            record = self._records.get(key)
            if record is None or record.operation_id is not None:
                continue
            same_identity = record.request_id == op.get("requestId") or (
                record.target_session_id == op.get("targetAgentSessionId")
            )
            if same_identity:
                return [key]
        return []

    def apply_operation_locked(self, op: Operation, *, adopt: bool) -> None:
        """Apply a copy of an operation to every record that tracks it (any may)."""
        self._unknown.note_locked(op)
        for key in self._keys_for_operation_locked(op):
            self.apply_to_key_locked(key, op, adopt=adopt)

    def apply_to_key_locked(self, key: BoundaryKey, op: Operation, *, adopt: bool) -> None:
        """Apply a copy of an operation to the record of `key`; `adopt`: take the operation's
        identity (a reply to this record's own request, or a resolve result)."""
        self._unknown.note_locked(op)
        record = self._records.get(key)
        if record is None:
            return
        if (
            record.status is MutationStatus.FAILED
            and record.operation_id == op.get("operationId")
            and self._unknown.is_stale_locked(op)
        ):
            # Older than the terminal copy that settled this record (an `unknown` event read back
            # before an Abandon committed, taken off the socket after its reply): it moves
            # nothing back.
            return
        point = op.get("point") or {}
        if not same_boundary(record, op):
            self._records.put(
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
            self._records.index(record)
        status = op.get("status")
        slot = self._records.slot_of(key)
        if status == "accepted":
            if record.status is MutationStatus.FAILED:
                return
            self._records.put(
                replace(record, status=MutationStatus.IN_FLIGHT, phase=op.get("phase"), error=None)
            )
            self._schedule_poll_locked(key)
        elif status == "committed":
            self._adopt_committed_locked(record, op.get("session"), op.get("lineage"))
        elif status in ("failed", "abandoned"):
            # `abandoned` (fork.resolve) frees the boundary exactly as `failed` does.
            slot.cancel_all()
            self._records.put(
                replace(
                    record,
                    status=MutationStatus.FAILED,
                    phase=op.get("phase"),
                    error=str(op.get("error") or "failed"),
                )
            )
            self._records.settle(key)
        elif status == "unknown":
            slot.cancel_all()
            self._records.put(
                replace(
                    record,
                    status=MutationStatus.UNKNOWN,
                    phase=op.get("phase"),
                    error=str(op.get("error") or "delivery unknown"),
                    recorded_unknown=True,
                )
            )
        else:
            self._records.put(replace(record, status=MutationStatus.UNKNOWN, error="bad_status"))

    def _adopt_from_session_locked(self, session: Session) -> None:
        """A canonical child upsert completes its mutation even before any reply (seed 000 §9)."""
        lineage = session.get("forkedFrom")
        if not isinstance(lineage, dict):
            return
        key = self._records.by_operation(str(lineage.get("operationId")))
        if key is None:
            key = self._records.by_target(str(session.get("agentSessionId")))
        record = None if key is None else self._records.get(key)
        if record is None or record.status is MutationStatus.SUCCEEDED:
            return
        if record.target_session_id != session.get("agentSessionId"):
            return
        if record.operation_id is None:
            record = replace(record, operation_id=str(lineage.get("operationId")))
            self._records.index(record)
        self._adopt_committed_locked(record, session, lineage)

    def _adopt_committed_locked(
        self, record: ForkMutation, session: Session | None, lineage: Lineage | None
    ) -> None:
        key = record.key
        if (
            not isinstance(session, dict)
            or not isinstance(lineage, dict)
            or session.get("agentSessionId") != record.target_session_id
            or lineage.get("operationId") != record.operation_id
            or lineage.get("sourceAgentSessionId") != record.source_session_id
        ):
            self._records.put(
                replace(record, status=MutationStatus.UNKNOWN, error="invalid_committed_result")
            )
            return
        if record.point != THROUGH_TURN and record.boundary_turn_id is None:
            record = replace(record, boundary_turn_id=str(lineage.get("sourceTurnId")))
        slot = self._records.slot_of(key)
        slot.cancel_all()
        # Upsert first: the ACK must only go out once the child is in the canonical cache.
        self._sessions.upsert_locked(session)
        self._records.put(
            replace(
                record,
                status=MutationStatus.SUCCEEDED,
                phase="committed",
                ack=AckState.PENDING,
                error=None,
                child_session_id=record.target_session_id,
            )
        )
        self._acks.send_locked(key)
