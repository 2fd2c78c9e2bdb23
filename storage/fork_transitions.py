"""The guarded status transitions of an operation: each one `_write` transaction with
`UPDATE ... WHERE status IN (sources)`, the sources taken from domain.fork_states; a repeat
returns `changed=False`, a transition the state machine forbids raises `InvalidTransition`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from domain.errors import ForkAcknowledgeConflict, ForkOperationNotFound, InvalidTransition
from domain.fork_states import ForkStatus, sources_of
from storage.base import Database
from storage.fork_evidence import record_accepted, validate_evidence
from storage.fork_rows import OP_COLUMNS, decode_op, load_op, op_from_row
from storage.models import ForkOperation, ForkOperationChanged, ProviderForkEvidence, SessionChanged
from storage.sqlite import dumps, loads


class ForkTransitions:
    """dispatching, failed, unknown, provider_accepted, and the client ACK."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self.now_ms = db.now_ms
        self._projections = db.projections

    def _transition(
        self,
        ws: str,
        op_id: str,
        *,
        to: ForkStatus,
        values: Mapping[str, Any],
        stamp: str,
        release: bool = False,
    ) -> tuple[ForkOperation, bool]:
        """`values`: column → value, each column a `ForkOperation` field of the same name, so
        the row written is returned as read plus what was written, without a re-read.
        `stamp`: the time column set to the transaction's own time (when the row is written,
        not when the caller asked: a write may wait its turn for seconds)."""
        sources = sources_of(to)  # the state machine's, domain.fork_states
        with self._write(ws) as tx:
            values = {**values, stamp: tx.now_ms}
            op = load_op(tx.conn, ws, op_id, project=False)
            if op.status is to:
                return load_op(tx.conn, ws, op_id, projections=self._projections), False
            if (
                to is ForkStatus.DISPATCHING
                and op.workspace_mode == "worktree"
                and op.worktree_state != "made"
            ):
                # The child's tree is whole and recorded before the provider call may leave.
                raise InvalidTransition(
                    f"fork operation {op_id} cannot dispatch before its worktree is recorded",
                    params={"operationId": op_id, "status": op.status.value, "to": to.value},
                )
            if op.status not in sources:
                raise InvalidTransition(
                    f"fork operation {op_id} cannot go from {op.status} to {to}",
                    params={"operationId": op_id, "status": op.status.value, "to": to.value},
                )
            marks = ",".join("?" * len(sources))
            assignments = ", ".join(f"{column} = ?" for column in values)
            tx.execute(
                f"UPDATE fork_operations SET status = ?, {assignments}"
                f" WHERE workspace_id = ? AND operation_id = ? AND status IN ({marks})",
                (to.value, *values.values(), ws, op_id, *(s.value for s in sources)),
            )
            if tx.changes() != 1:  # pragma: no cover - guarded by BEGIN IMMEDIATE above
                raise InvalidTransition(f"fork operation {op_id} changed concurrently")
            if to is ForkStatus.FAILED:
                # Reservation iff not failed: a failed attempt frees the target id.
                tx.execute(
                    "DELETE FROM session_reservations WHERE workspace_id = ? AND operation_id = ?",
                    (ws, op_id),
                )
            tx.emit(ForkOperationChanged(ws, op_id))
            if release:
                tx.emit(SessionChanged(ws, op.source_session_id))
            # Never `committed` here, so the row needs no projection: what was read + written.
            return replace(op, status=to, **values), True

    def mark_fork_dispatching(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """The durable marker written before the provider call may leave the host (law 1)."""
        return self._transition(
            ws, op_id, to=ForkStatus.DISPATCHING, values={}, stamp="dispatched_at_ms"
        )

    def mark_fork_failed(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]:
        return self._transition(
            ws,
            op_id,
            to=ForkStatus.FAILED,
            values={"error": str(error)},
            stamp="completed_at_ms",
            release=True,
        )

    def mark_fork_unknown(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]:
        """Permanent: an unknown delivery keeps its barrier and is never redispatched."""
        return self._transition(
            ws,
            op_id,
            to=ForkStatus.UNKNOWN,
            values={"error": str(error)},
            stamp="completed_at_ms",
            release=True,
        )

    def mark_fork_provider_accepted(
        self, ws: str, op_id: str, evidence: ProviderForkEvidence, *, durable: bool = True
    ) -> tuple[ForkOperation, bool]:
        """Persist verified provider evidence; after this only the local commit is retried.

        `durable=False`, for a caller that commits the fork right after on the same thread:
        the row survives a killed process at once and a power loss with the commit's fsync
        (the WAL keeps COMMITs in order), so the commit never lands without it; a power loss
        before that fsync leaves `dispatching`, which a restart makes `unknown` — the seed's
        rule for a dispatch "without a durable provider result", never a second dispatch."""
        with self._write(ws, durable=durable) as tx:
            op = load_op(tx.conn, ws, op_id, project=False)
            if op.status in (ForkStatus.PROVIDER_ACCEPTED, ForkStatus.COMMITTED):
                if op.target_provider_session_id != evidence.child_provider_session_id:
                    raise InvalidTransition(
                        f"fork operation {op_id} already accepted a different provider child",
                        params={"operationId": op_id, "status": op.status.value},
                    )
                return load_op(tx.conn, ws, op_id, projections=self._projections), False
            if op.status is not ForkStatus.DISPATCHING:
                raise InvalidTransition(
                    f"fork operation {op_id} cannot go from {op.status} to provider_accepted",
                    params={"operationId": op_id, "status": op.status.value},
                )
            validate_evidence(op, evidence)
            record_accepted(tx, ws, op_id, evidence, from_status=ForkStatus.DISPATCHING)
            # The row as written, without a re-read: the columns record_accepted set, each
            # as a read decodes it (JSON round trip included).
            return replace(
                op,
                status=ForkStatus.PROVIDER_ACCEPTED,
                accepted_at_ms=tx.now_ms,
                target_provider_session_id=evidence.child_provider_session_id,
                target_provider_turn_ids=tuple(loads(dumps(list(evidence.provider_turn_ids)))),
                binding_receipt=loads(dumps(dict(evidence.receipt))),
            ), True

    def acknowledge_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """Client-observed ACK: committed only; sets the time once and releases the barrier."""
        with self._write(ws) as tx:
            # One read of the row: the answer is it, projected, plus the time set.
            r = tx.one(
                f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND operation_id = ?",
                (ws, op_id),
            )
            if r is None:
                raise ForkOperationNotFound(f"fork operation {op_id} not found")
            status = ForkStatus(r[19])
            if status is not ForkStatus.COMMITTED:
                public = op_from_row(r).public_status
                raise ForkAcknowledgeConflict(
                    f"fork operation {op_id} is {public}, only committed can be ACKed",
                    params={"operationId": op_id, "status": public.value},
                )
            op = decode_op(tx.conn, r, projections=self._projections)
            if op.client_observed_at_ms is not None:
                return op, False
            tx.execute(
                "UPDATE fork_operations SET client_observed_at_ms = ? WHERE workspace_id = ?"
                " AND operation_id = ? AND client_observed_at_ms IS NULL",
                (tx.now_ms, ws, op_id),
            )
            tx.emit(ForkOperationChanged(ws, op_id))
            return replace(op, client_observed_at_ms=tx.now_ms), True
