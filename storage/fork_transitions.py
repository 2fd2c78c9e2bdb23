"""The guarded status transitions of an operation: each one `_write` transaction with
`UPDATE ... WHERE status = ?`, the status the row was known or read at, one of the sources taken
from domain.fork_states (so the UPDATE names the stage exactly when the move changes it: schema
v23); a repeat returns `changed=False`, a transition the state machine forbids raises
`InvalidTransition`.

The move to `provider_accepted` carries the provider's evidence (seed 000 §7): it is validated
(`validate_evidence`) and recorded by the one write of that move (`record_accepted`), which the
saga's dispatch and `fork.resolve`'s adopt (storage/fork_resolution.py) both make."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from domain.enums import ProviderStateBindingMode
from domain.errors import (
    ForkAcknowledgeConflict,
    ForkEvidenceRejected,
    ForkOperationNotFound,
    InvalidTransition,
)
from domain.fork_states import (
    BARRIER_RELEASE_SQL,
    SOURCES,
    ForkStatus,
    holds_barrier,
    stage_assignment,
)
from storage.base import Database
from storage.models import ForkOperation, ForkOperationChanged, ProviderForkEvidence, SessionChanged
from storage.rows import OP_COLUMNS, decode_op, json_column, load_op, op_from_row
from storage.sqlite import Tx, dumps, loads


class ForkTransitions:
    """dispatching, failed, unknown, provider_accepted, and the client ACK."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._submit = db.submit_write
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
        known: ForkOperation | None = None,
    ) -> tuple[ForkOperation, bool]:
        """`values`: column → value, each column a `ForkOperation` field of the same name, so
        the row written is returned as read plus what was written, without a re-read.
        `known`: the row as its caller last wrote or read it (the saga owning the operation).
        The move is then one UPDATE guarded by that very status, without reading the row
        first; a row not at that status (moved meanwhile) takes the reading path below, in
        the same transaction, so the answer and the checks are the same either way.

        `stamp`: the time column set to the transaction's own time (when the row is written,
        not when the caller asked: a write may wait its turn for seconds)."""
        sources = SOURCES[to]  # the state machine's, domain.fork_states
        # Leaving the barrier's set (`failed`) sets its flag in the same UPDATE; a step that
        # stays in it (dispatching, unknown) names no column of the barrier index (schema v22).
        release_barrier = "" if holds_barrier(to, client_observed=False) else BARRIER_RELEASE_SQL
        asked = values

        def body(tx: Tx) -> tuple[ForkOperation, bool]:
            values = {**asked, stamp: tx.now_ms}
            if (
                known is not None
                and known.operation_id == op_id
                and known.status in sources
                and known.status is not to
                and not release
                and known.workspace_mode == "shared"
            ):
                assignments = "".join(f", {column} = ?" for column in values)
                stage = stage_assignment(known.status, to)  # (schema v23)
                tx.execute(
                    f"UPDATE fork_operations SET status = ?{assignments}{release_barrier}{stage}"
                    " WHERE workspace_id = ? AND operation_id = ? AND status = ?",
                    (to.value, *values.values(), ws, op_id, known.status.value),
                )
                if tx.changes() == 1:
                    # The caller's row moved by this UPDATE: the row as written, carried by
                    # its change (the events thread publishes it without reading it back).
                    moved = replace(known, status=to, **values)
                    tx.emit(ForkOperationChanged(ws, op_id, row=moved, seq=tx.seq))
                    return moved, True
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
            assignments = ", ".join(f"{column} = ?" for column in values)
            # The stage as the row read in this transaction has it (schema v23); the guard
            # is that very status, so the assignment is the move's.
            stage = stage_assignment(op.status, to)
            tx.execute(
                f"UPDATE fork_operations SET status = ?, {assignments}{release_barrier}{stage}"
                " WHERE workspace_id = ? AND operation_id = ? AND status = ?",
                (to.value, *values.values(), ws, op_id, op.status.value),
            )
            if tx.changes() != 1:  # pragma: no cover - guarded by BEGIN IMMEDIATE above
                raise InvalidTransition(f"fork operation {op_id} changed concurrently")
            if to is ForkStatus.FAILED:
                # Reservation iff not failed: a failed attempt frees the target id (its only
                # reservation, found by the primary key: schema v21).
                tx.execute(DELETE_RESERVATION_SQL, (ws, op.target_session_id, op_id))
            tx.emit(ForkOperationChanged(ws, op_id))
            if release:
                tx.emit(SessionChanged(ws, op.source_session_id))
            # Never `committed` here, so the row needs no projection: what was read + written.
            return replace(op, status=to, **values), True

        return self._submit(body, ws)

    def mark_fork_dispatching(
        self, ws: str, op_id: str, *, known: ForkOperation | None = None
    ) -> tuple[ForkOperation, bool]:
        """The durable marker written before the provider call may leave the host (law 1).
        `known`: the caller's copy of the row (see `_transition`)."""
        return self._transition(
            ws,
            op_id,
            to=ForkStatus.DISPATCHING,
            values={},
            stamp="dispatched_at_ms",
            known=known,
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
        self,
        ws: str,
        op_id: str,
        evidence: ProviderForkEvidence,
        *,
        durable: bool = True,
        known: ForkOperation | None = None,
    ) -> tuple[ForkOperation, bool]:
        """Persist verified provider evidence; after this only the local commit is retried.

        `durable=False`, for a caller that commits the fork right after on the same thread:
        the row survives a killed process at once and a power loss with the commit's fsync
        (the WAL keeps COMMITs in order), so the commit never lands without it; a power loss
        before that fsync leaves `dispatching`, which a restart makes `unknown` — the seed's
        rule for a dispatch "without a durable provider result", never a second dispatch.

        `known`: the caller's `dispatching` row (the saga's): the evidence is checked against
        it and the row is not read first; `record_accepted`'s UPDATE is guarded by
        `dispatching`, and a row not there any more takes the reading path."""

        def body(tx: Tx) -> tuple[ForkOperation, bool]:
            if (
                known is not None
                and known.operation_id == op_id
                and known.status is ForkStatus.DISPATCHING
            ):
                validate_evidence(known, evidence)
                receipt = record_accepted(
                    tx, ws, op_id, evidence, from_status=ForkStatus.DISPATCHING
                )
                if tx.changes() == 1:
                    return _carried(tx, _accepted(known, evidence, tx.now_ms, receipt)), True
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
            receipt = record_accepted(tx, ws, op_id, evidence, from_status=ForkStatus.DISPATCHING)
            return _carried(tx, _accepted(op, evidence, tx.now_ms, receipt)), True

        return self._submit(body, ws, durable=durable)

    def acknowledge_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """Client-observed ACK: committed only; sets the time once and releases the barrier."""

        def body(tx: Tx) -> tuple[ForkOperation, bool]:
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
            if r[25] is not None:  # client_observed_at_ms: ACKed before
                return decode_op(tx.conn, r, projections=self._projections), False
            tx.execute(
                f"UPDATE fork_operations SET client_observed_at_ms = ?{BARRIER_RELEASE_SQL}"
                " WHERE workspace_id = ?"
                " AND operation_id = ? AND client_observed_at_ms IS NULL",
                (tx.now_ms, ws, op_id),
            )
            # The row as written, decoded once (not decoded, then copied with the time). No
            # change is emitted: the ACK sets `client_observed_at_ms` and releases the barrier,
            # neither of which the operation's projection (its `fork.operation` event, the
            # activity log's status and phase) shows — its event would repeat, byte for byte,
            # the commit's that every subscriber already heard (design/store.md, "The ACK
            # announces nothing").
            written = (*r[:25], tx.now_ms, *r[26:])
            return decode_op(tx.conn, written, projections=self._projections), True

        return self._submit(body, ws)


_SCALARS = (str, int, type(None))
"""JSON values a round trip gives back equal and of the same type (bool is an int)."""


def _as_read(value: Any) -> Any:
    """`value` as a read decodes it after `dumps` (sorted keys): strings, whole numbers, booleans
    and nulls, in a list or a flat object of string keys, are rebuilt directly; anything else
    (a float, a nested container, a tuple in an object) takes the JSON round trip."""
    if isinstance(value, (list, tuple)) and all(_scalar(v) for v in value):
        return list(value)
    if isinstance(value, Mapping) and all(type(k) is str and _scalar(v) for k, v in value.items()):
        return {k: value[k] for k in sorted(value)}
    return loads(dumps(value))


def _scalar(value: Any) -> bool:
    return type(value) in _SCALARS or type(value) is bool


def _carried(tx: Tx, op: ForkOperation) -> ForkOperation:
    """`op`, the row as this transaction's last write of it left it, on its change (`Tx.emit`
    keeps the first one's place and takes what the last one carries)."""
    tx.emit(ForkOperationChanged(op.workspace_id, op.operation_id, row=op, seq=tx.seq))
    return op


def _accepted(
    op: ForkOperation, evidence: ProviderForkEvidence, now_ms: int, receipt_json: str
) -> ForkOperation:
    """The row as `record_accepted` wrote it, without a re-read: the columns it set, each as a
    read decodes it (JSON round trip included: `_as_read`; the receipt decoded from the very
    text written, `receipt_json`, not dumped a second time for its round trip)."""
    return replace(
        op,
        status=ForkStatus.PROVIDER_ACCEPTED,
        accepted_at_ms=now_ms,
        target_provider_session_id=evidence.child_provider_session_id,
        target_provider_turn_ids=tuple(_as_read(list(evidence.provider_turn_ids))),
        binding_receipt=_receipt_as_read(evidence.receipt, receipt_json),
    )


def _receipt_as_read(receipt: Mapping[str, Any], written: str) -> Any:
    """`_as_read(dict(receipt))`, whose JSON round trip (a receipt is nested) would dump the
    receipt again: `written` is that dump, so it is only decoded."""
    if all(type(k) is str and _scalar(v) for k, v in receipt.items()):
        return {k: receipt[k] for k in sorted(receipt)}
    return json_column(written)


DELETE_RESERVATION_SQL = (
    "DELETE FROM session_reservations WHERE workspace_id = ? AND session_id = ?"
    " AND operation_id = ?"
)
"""A fork operation's reservation of its target id, freed when it leaves for `failed` or
`abandoned` (parameters: workspace, target Session, operation): found by the table's primary
key (workspace, target; schema v21), the operation id guarding that it is this one's."""


# -- The provider evidence of `provider_accepted` (seed 000 §7) ------------------------------


def record_accepted(
    tx: Tx, ws: str, op_id: str, evidence: ProviderForkEvidence, *, from_status: ForkStatus
) -> str:
    """Writes `from_status → provider_accepted` with the provider's evidence (the saga's
    dispatch, or `fork.resolve` adopting an `unknown` operation, which also clears its outcome).
    Returns the `binding_receipt` text written."""
    bindings = None
    if evidence.turn_bindings is not None:
        bindings = {k: [v[0], v[1]] for k, v in evidence.turn_bindings.items()}
    clear = ", error = NULL, completed_at_ms = NULL" if from_status is ForkStatus.UNKNOWN else ""
    clear += stage_assignment(from_status, ForkStatus.PROVIDER_ACCEPTED)  # adopt: 1 → 2
    receipt = dumps(dict(evidence.receipt))
    tx.execute(
        "UPDATE fork_operations SET status = 'provider_accepted', accepted_at_ms = ?,"
        " target_provider_session_id = ?, target_provider_turn_ids = ?,"
        f" target_turn_bindings = ?, binding_receipt = ?{clear}"
        " WHERE workspace_id = ? AND operation_id = ? AND status = ?",
        (
            tx.now_ms,
            evidence.child_provider_session_id,
            dumps(list(evidence.provider_turn_ids)),
            None if bindings is None else dumps(bindings),
            receipt,
            ws,
            op_id,
            from_status.value,
        ),
    )
    tx.emit(ForkOperationChanged(ws, op_id))
    return receipt


def validate_evidence(op: ForkOperation, ev: ProviderForkEvidence) -> None:
    """Seed 000 §7: `accepted` only with typed evidence that proves an independent child."""

    def reject(why: str) -> None:
        raise ForkEvidenceRejected(f"provider evidence rejected: {why}", params={"why": why})

    if not ev.child_provider_session_id:
        reject("no child provider session id")
    if ev.child_provider_session_id == op.source_provider_session_id:
        reject("child provider session id equals the source")
    if ev.binding_mode != op.binding_mode:
        reject(f"binding mode {ev.binding_mode!r} differs from frozen {op.binding_mode!r}")
    if not isinstance(ev.receipt, Mapping) or not ev.receipt:
        reject("no binding receipt")
    forked_from = receipt_forked_from(ev.receipt)
    if forked_from is not None and forked_from != op.source_provider_session_id:
        reject("receipt forkedFromId does not name the source provider session")
    if ev.binding_mode == ProviderStateBindingMode.HOST_COPY:
        if tuple(ev.provider_turn_ids) != op.source_provider_turn_ids:
            reject("child provider turns are not exactly the frozen ordered prefix")
    else:
        if not ev.turn_bindings or op.source_turn_id not in ev.turn_bindings:
            reject("provider_owned evidence lacks a binding for the selected turn")
    for source_turn, value in (ev.turn_bindings or {}).items():
        if (
            not isinstance(value, (tuple, list))
            or len(value) != 2
            or not isinstance(value[0], str)
            or not value[0]
            or not (value[1] is None or isinstance(value[1], str))
        ):
            reject(f"malformed binding for turn {source_turn!r}")


def receipt_forked_from(receipt: Mapping[str, Any]) -> str | None:
    for key in ("forkedFromId", "forked_from_id", "sourceProviderSessionId"):
        value = receipt.get(key)
        if isinstance(value, str):
            return value
    return None
