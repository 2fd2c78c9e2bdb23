"""The fork mutation: the Fork click (`fork`, `fork_latest`) with its identities (new after a
confirmed outcome, reused after `unknown`, nothing sent while in flight), `fork.create` with
its deadline and reply, and `resolve` of an `unknown` operation (`fork.resolve`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Literal, cast

from client.engine.calls import WorkspaceCalls
from client.engine.changes import ChangeFeed
from client.engine.ports import Scheduler
from client.engine.reconcile import Reconciliation
from client.engine.records import MutationRecords, Slot
from client.engine.unknown import UnknownOperations
from client.engine.values import (
    LATEST_SETTLED,
    THROUGH_TURN,
    AckState,
    BoundaryKey,
    ForkMutation,
    MutationStatus,
    operation_key,
)
from protocol.methods import (
    FORK_CREATE,
    FORK_RESOLVE,
    ForkCreateParams,
    ForkResolveParams,
    ForkResolveResult,
    OperationResult,
)
from protocol.objects import ForkPoint, Operation, ResolveAction
from transport.client import ClientClosed, Reply

WorkspaceMode = Literal["shared", "worktree"]


class ForkRequests:
    """Starts, retries and resolves fork mutations; their news is merged by `Reconciliation`."""

    def __init__(
        self,
        feed: ChangeFeed,
        records: MutationRecords,
        unknown: UnknownOperations,
        reconciliation: Reconciliation,
        calls: WorkspaceCalls,
        scheduler: Scheduler,
        *,
        create_deadline: float,
        new_id: Callable[[], str],
    ) -> None:
        self._feed = feed
        self._records = records
        self._unknown = unknown
        self._reconciliation = reconciliation
        self._calls = calls
        self._scheduler = scheduler
        self.create_deadline = create_deadline
        self._new_id = new_id

    # -- the fork mutation -------------------------------------------------------------------

    def fork(self, source_session_id: str, turn_id: str, workspace: str = "shared") -> ForkMutation:
        """The Fork click on one boundary. Returns the record as the click left it (in flight,
        or the untouched record when nothing was sent); never blocks on the network.

        Identities: a first attempt, or one after a confirmed failure or an observed success,
        gets new request/target ids; a retry after `unknown` reuses them; while in flight or
        while an ACK is pending nothing is sent at all. `workspace="worktree"` gives the child
        a tree of its own holding the Turn's files (a retry keeps the first attempt's).
        """
        return self._fork(source_session_id, turn_id, THROUGH_TURN, workspace)

    def fork_latest(self, source_session_id: str, workspace: str = "shared") -> ForkMutation:
        """The Session-level Fork ("from where we are now"): `fork.create` with
        `point: {type: "latestSettled"}`. The same record, identities, replay, reconciliation and
        ACK rules as `fork`, on the boundary key `(source, LATEST_SETTLED)`; the daemon resolves
        and freezes the Turn, and a replay of the same request returns that original boundary
        even after new Turns. Read it back with `mutation(source, LATEST_SETTLED)`."""
        return self._fork(source_session_id, LATEST_SETTLED, LATEST_SETTLED, workspace)

    def _fork(
        self, source_session_id: str, turn_id: str, point: str, workspace: str = "shared"
    ) -> ForkMutation:
        key = (source_session_id, turn_id)
        with self._feed.lock:
            if self._feed.closed:
                raise ClientClosed("engine is closed")
            latest = self._records.get((source_session_id, LATEST_SETTLED))
            if (
                point == THROUGH_TURN
                and latest is not None
                and latest.boundary == turn_id
                and not latest.settled
            ):
                # The barrier is the boundary, not the point kind (law 8): a Turn Fork on the
                # Turn a live full-Session fork resolved to is that fork's click.
                key, point = latest.key, LATEST_SETTLED
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
                slot = self._records.slot_of(key)
                self._records.put(record)
            else:
                if record is not None:
                    self._records.forget(key)
                record = ForkMutation(
                    source_session_id=source_session_id,
                    turn_id=key[1],
                    request_id=self._new_id(),
                    target_session_id=self._new_id(),
                    status=MutationStatus.IN_FLIGHT,
                    create_attempts=1,
                    point=point,
                    workspace=workspace,
                )
                slot = self._records.open(record)
            self._send_create_locked(key, slot, record)
        self._feed.flush()
        # The record as this click left it: the create's reply may already have moved the live
        # one on (a replayed `unknown` operation answers at once); `mutation()` reads that.
        return record

    def resolve(
        self,
        operation_id: str,
        action: str,
        *,
        request_id: str | None = None,
        timeout: float = 30.0,
    ) -> ForkResolveResult:
        """`fork.resolve`, blocking: `inspect`, `adopt` or `abandon` an `unknown`
        operation; returns `{operation, evidence}` or raises `ApiError`/`TimeoutError`.

        The result goes through the fork machinery: an adopted (committed) operation becomes
        the succeeded mutation of its boundary, its child upserted and ACKed exactly as a fork
        commit; an abandoned one a confirmed failure (the boundary is free). Either is tracked
        even when another client started the fork.
        """
        result = self._calls.request(
            FORK_RESOLVE,
            ForkResolveParams(
                workspaceId=self._calls.workspace_id,
                operationId=operation_id,
                requestId=request_id or self._new_id(),
                # Sent as asked: the daemon refuses an action it does not know.
                action=cast(ResolveAction, action),
            ),
            timeout=timeout,
        )
        op = result.get("operation")
        if isinstance(op, dict):
            with self._feed.lock:
                if not self._feed.closed:
                    self._unknown.note_locked(op)
                    if op.get("status") in ("committed", "abandoned"):
                        self._track_resolved_locked(op)
            self._feed.flush()
        return result

    def _track_resolved_locked(self, op: Operation) -> None:
        key = operation_key(op)
        record = self._records.get(key)
        if record is not None and record.operation_id != op.get("operationId"):
            busy = record.status is MutationStatus.IN_FLIGHT or (
                record.status is MutationStatus.SUCCEEDED and record.ack is AckState.PENDING
            )
            if busy:
                return  # another fork of that boundary is live; events will settle ours
            self._records.forget(key)
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
            self._records.open(record)
        self._reconciliation.apply_to_key_locked(key, op, adopt=True)

    def _send_create_locked(self, key: BoundaryKey, slot: Slot, record: ForkMutation) -> None:
        slot.cancel_all()
        slot.attempt += 1
        attempt = slot.attempt
        point: ForkPoint = (
            {"type": "throughTurn", "turnId": record.turn_id}
            if record.point == THROUGH_TURN
            else {"type": "latestSettled"}
        )
        params = ForkCreateParams(
            workspaceId=self._calls.workspace_id,
            agentSessionId=record.source_session_id,
            requestId=record.request_id,
            targetAgentSessionId=record.target_session_id,
            point=point,
        )
        if record.workspace != "shared":
            # Sent as asked: the daemon refuses a mode it does not know with a typed error.
            params["workspace"] = cast(WorkspaceMode, record.workspace)
        slot.create_timer = self._scheduler.call_later(
            self.create_deadline, lambda: self._on_create_deadline(key, attempt)
        )
        future = self._calls.submit(FORK_CREATE, params)
        if future is not None:
            future.add_done_callback(lambda f: self._on_create_reply(key, attempt, f))

    def _on_create_deadline(self, key: BoundaryKey, attempt: int) -> None:
        with self._feed.lock:
            slot, record = self._records.slot(key), self._records.get(key)
            if slot is None or record is None or slot.attempt != attempt:
                return
            slot.create_timer = None
            if record.status is MutationStatus.IN_FLIGHT and record.operation_id is None:
                self._records.put(
                    replace(
                        record,
                        status=MutationStatus.UNKNOWN,
                        error=f"no reply to fork.create within {self.create_deadline:g} s",
                    )
                )
        self._feed.flush()

    def _on_create_reply(
        self, key: BoundaryKey, attempt: int, future: Future[Reply[OperationResult]]
    ) -> None:
        try:
            reply = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001 - a transport failure is delivery-unknown
            reply = Reply(
                599,
                {"code": "", "reason": "transport_error", "message": str(exc), "retryable": True},
            )
        status, error = reply.status, reply.error()
        with self._feed.lock:
            if self._feed.closed:
                return
            slot, record = self._records.slot(key), self._records.get(key)
            operation = reply.result().get("operation") if error is None else None
            current = slot is not None and record is not None and slot.attempt == attempt
            if not current:
                # A stale reply can still tell us about an operation we track.
                if isinstance(operation, dict):
                    self._reconciliation.apply_operation_locked(operation, adopt=False)
            else:
                assert slot is not None and record is not None
                if slot.create_timer is not None:
                    slot.create_timer.cancel()
                    slot.create_timer = None
                if isinstance(operation, dict):
                    self._reconciliation.apply_to_key_locked(key, operation, adopt=True)
                elif status < 400:
                    self._records.put(
                        replace(record, status=MutationStatus.UNKNOWN, error="malformed_reply")
                    )
                else:
                    assert error is not None
                    reason = str(error.get("reason", "")) or "error"
                    confirmed = status < 500 or reason == "agent_session_fork_failed"
                    if record.status is not MutationStatus.SUCCEEDED:
                        self._records.put(
                            replace(
                                record,
                                status=MutationStatus.FAILED
                                if confirmed
                                else MutationStatus.UNKNOWN,
                                error=reason,
                                error_detail={
                                    "status": status,
                                    "code": error.get("code"),
                                    "reason": reason,
                                    "message": error.get("message"),
                                    "params": dict(error.get("params") or {}),
                                },
                            )
                        )
                        if confirmed:
                            self._records.settle(key)
        self._feed.flush()
