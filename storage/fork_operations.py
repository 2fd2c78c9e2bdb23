"""The durable fork operation: prepare (idempotency, barrier, reservation, boundary, snapshot),
the guarded status transitions, commit from the snapshot, ACK, and the recovery queries.

Every transition is one `_write` transaction with `UPDATE ... WHERE status = from`; a repeat
returns `changed=False` and a transition the state machine forbids raises `InvalidTransition`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import apsw

from domain.fork_states import ACTIVE_SQL, BARRIER_SQL, after_restart, sources_of
from storage.base import Row, StoreBase, Tx, dumps, loads
from storage.canonical import load_session, load_turn, require_session
from storage.errors import (
    ForkAcknowledgeConflict,
    ForkBoundaryError,
    ForkBoundaryReason,
    ForkConflict,
    ForkEvidenceRejected,
    ForkOperationNotFound,
    ForkRequestConflict,
    ForkSnapshotCorrupt,
    InvalidArgument,
    InvalidTransition,
)
from storage.fork_points import UNRESOLVED, latest_settled_turn_id, resolve_or_block
from storage.fork_snapshot import (
    ChildPlan,
    build_child,
    freeze_snapshot,
    load_boundary,
    load_snapshot,
    project_child,
    request_hash,
    source_blockers,
)
from storage.fork_titles import child_title
from storage.models import (
    ForkOperation,
    ForkOperationChanged,
    ForkPointKind,
    ForkPrepareRequest,
    ForkReadiness,
    ForkStatus,
    Lineage,
    ProviderForkEvidence,
    ProviderStateBindingMode,
    Session,
    SessionChanged,
)

log = logging.getLogger(__name__)

_OP_COLUMNS = (
    "workspace_id, operation_id, request_id, request_hash, source_session_id,"
    " target_session_id, point_kind, source_turn_id, source_provider_session_id,"
    " source_provider_turn_id, source_provider_turn_ids, target_provider_session_id,"
    " target_provider_turn_ids, target_turn_id, driver_kind, driver_version, binding_mode,"
    " binding_receipt, snapshot_hash, status, error, created_at_ms, dispatched_at_ms,"
    " accepted_at_ms, completed_at_ms, client_observed_at_ms, target_title,"
    " target_turn_bindings, op_seq"
)
# Generated from the state machine (domain.fork_states): the active set, and the barrier of
# seed 000 §6.1 (active, unknown, or committed but not yet observed by a client).
_ACTIVE_SQL = ACTIVE_SQL
_BARRIER_SQL = BARRIER_SQL


def _op_from_row(r: Row, committed: tuple[Any, Lineage] | None = None) -> ForkOperation:
    target_turns = loads(r[12])
    return ForkOperation(
        workspace_id=r[0],
        operation_id=r[1],
        request_id=r[2],
        request_hash=r[3],
        source_session_id=r[4],
        target_session_id=r[5],
        point_kind=r[6],
        source_turn_id=r[7],
        source_provider_session_id=r[8],
        source_provider_turn_id=r[9],
        source_provider_turn_ids=tuple(loads(r[10])),
        target_provider_session_id=r[11],
        target_provider_turn_ids=None if target_turns is None else tuple(target_turns),
        target_turn_id=r[13],
        driver_kind=r[14],
        driver_version=r[15],
        binding_mode=r[16],
        binding_receipt=loads(r[17]),
        snapshot_hash=r[18],
        status=ForkStatus(r[19]),
        error=r[20],
        created_at_ms=r[21],
        dispatched_at_ms=r[22],
        accepted_at_ms=r[23],
        completed_at_ms=r[24],
        client_observed_at_ms=r[25],
        committed_session=None if committed is None else committed[0],
        lineage=None if committed is None else committed[1],
        target_title=r[26],
    )


def _committed_projection(conn: apsw.Connection, r: Row) -> tuple[Session, Lineage]:
    """Rebuild the committed child's Session and lineage purely from the snapshot and the
    operation row (law 4), so the projection survives deletion of the child."""
    text_row = conn.execute(
        "SELECT snapshot_json FROM fork_operations WHERE op_seq = ?", (r[28],)
    ).fetchone()
    assert text_row is not None
    snapshot = load_snapshot(text_row[0], r[18])
    return project_child(snapshot, child_provider_session_id=r[11], committed_at_ms=r[24])


def _load_op(conn: apsw.Connection, ws: str, op_id: str, *, project: bool = True) -> ForkOperation:
    r = conn.execute(
        f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ? AND operation_id = ?",
        (ws, op_id),
    ).fetchone()
    if r is None:
        raise ForkOperationNotFound(f"fork operation {op_id} not found")
    return _decode(conn, r, project=project)


def _decode(conn: apsw.Connection, r: Row, *, project: bool = True) -> ForkOperation:
    if project and r[19] == ForkStatus.COMMITTED:
        return _op_from_row(r, _committed_projection(conn, r))
    return _op_from_row(r)


def _validate_request(req: ForkPrepareRequest) -> None:
    for field, value in (
        ("agentSessionId", req.source_session_id),
        ("requestId", req.request_id),
        ("targetAgentSessionId", req.target_session_id),
        ("point.turnId", req.turn_id),
        ("driverKind", req.driver_kind),
    ):
        if field == "point.turnId" and req.point_kind == ForkPointKind.LATEST_SETTLED:
            continue  # resolved inside the prepare transaction (storage/fork_points.py)
        if not isinstance(value, str) or not value:
            raise InvalidArgument(field, f"{field} must be a non-empty string")
    if req.point_kind not in (ForkPointKind.THROUGH_TURN, ForkPointKind.LATEST_SETTLED):
        raise InvalidArgument("point.type", f"unsupported fork point {req.point_kind!r}")
    if req.binding_mode not in ProviderStateBindingMode.__members__.values():
        raise InvalidArgument("bindingMode", f"unknown binding mode {req.binding_mode!r}")
    if not isinstance(req.runtime_identity, Mapping):
        raise InvalidArgument("runtimeIdentity", "runtime identity must be a map")


def _record_accepted(
    tx: Tx, ws: str, op_id: str, evidence: ProviderForkEvidence, *, from_status: ForkStatus
) -> None:
    """Writes `from_status → provider_accepted` with the provider's evidence (the saga's
    dispatch, or `fork.resolve` adopting an `unknown` operation, which also clears its outcome)."""
    bindings = None
    if evidence.turn_bindings is not None:
        bindings = {k: [v[0], v[1]] for k, v in evidence.turn_bindings.items()}
    clear = ", error = NULL, completed_at_ms = NULL" if from_status is ForkStatus.UNKNOWN else ""
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
            dumps(dict(evidence.receipt)),
            ws,
            op_id,
            from_status.value,
        ),
    )
    tx.emit(ForkOperationChanged(ws, op_id))


def _validate_evidence(op: ForkOperation, ev: ProviderForkEvidence) -> None:
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
    forked_from = _forked_from(ev.receipt)
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


def _forked_from(receipt: Mapping[str, Any]) -> str | None:
    for key in ("forkedFromId", "forked_from_id", "sourceProviderSessionId"):
        value = receipt.get(key)
        if isinstance(value, str):
            return value
    return None


class ForkStore(StoreBase):
    """The fork contract of seed 000 §3–§6, §8.3, §10; mixed into `storage.Store`."""

    # -- fence ---------------------------------------------------------------------------------

    def check_fence(self, ws: str, sid: str) -> None:
        """Raise `ForkInProgress` if `sid` is fenced now (advisory; writes re-check in-tx)."""
        with self._read() as conn:
            tx = Tx(conn, ws, 0)
            tx.check_fence(sid)

    def fence_holder(self, ws: str, sid: str) -> ForkOperation | None:
        """The active operation holding `sid`'s fence, if any."""
        r = self._one(
            f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
            f" AND source_session_id = ? AND status IN {_ACTIVE_SQL} LIMIT 1",
            (ws, sid),
        )
        return None if r is None else _op_from_row(r)

    # -- prepare -------------------------------------------------------------------------------

    def existing_fork(
        self,
        ws: str,
        *,
        source_session_id: str,
        request_id: str,
        target_session_id: str,
        turn_id: str,
        point_kind: str = ForkPointKind.THROUGH_TURN.value,
    ) -> ForkOperation | None:
        """The operation a `prepare_fork` of this request would return without creating one —
        a replay of `request_id` or the holder of the `source + point` barrier — or None.
        A pure read, so a replay never needs a provider runtime; `prepare_fork` re-checks
        both inside its transaction."""
        digest = request_hash(source_session_id, target_session_id, point_kind, turn_id)
        with self._read() as conn:
            existing = conn.execute(
                f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND request_id = ?",
                (ws, request_id),
            ).fetchone()
            if existing is not None:
                if existing[3] != digest:
                    raise ForkRequestConflict(
                        f"request {request_id} was used for a different fork",
                        params={"operationId": existing[1]},
                    )
                return _decode(conn, existing)
            if point_kind == ForkPointKind.LATEST_SETTLED:
                turn_id = latest_settled_turn_id(conn, ws, source_session_id) or UNRESOLVED
            held = conn.execute(
                f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND source_session_id = ? AND point_kind = ? AND source_turn_id = ?"
                f" AND {_BARRIER_SQL} ORDER BY op_seq LIMIT 1",
                (ws, source_session_id, point_kind, turn_id),
            ).fetchone()
            return None if held is None else _decode(conn, held)

    def prepare_fork(
        self,
        ws: str,
        req: ForkPrepareRequest,
        *,
        turn_forkable: Callable[[str | None, str | None], bool] | None = None,
    ) -> tuple[ForkOperation, bool]:
        """Create the operation, fence and reservation and freeze the snapshot in one
        transaction; a replay or a held barrier returns the original with `created=False`.

        `turn_forkable(root_provider_turn_id, provider_turn_binding_json)` is the provider's
        per-Turn hook (seed 000 §3.2 `CanForkProviderTurn`): the store never parses a
        provider's binding JSON; the selected Turn is accepted only when the hook says so,
        inside this transaction."""
        _validate_request(req)
        digest = request_hash(
            req.source_session_id, req.target_session_id, req.point_kind, req.turn_id
        )
        with self._write(ws) as tx:
            existing = tx.one(
                f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND request_id = ?",
                (ws, req.request_id),
            )
            if existing is not None:
                if existing[3] != digest:
                    raise ForkRequestConflict(
                        f"request {req.request_id} was used for a different fork",
                        params={"operationId": existing[1]},
                    )
                return _decode(tx.conn, existing), False
            source = require_session(tx.conn, ws, req.source_session_id)
            # latestSettled: resolved here, in the same transaction, and frozen on the row.
            turn_id = resolve_or_block(tx.conn, ws, source, req.point_kind, req.turn_id)
            held = tx.one(
                f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND source_session_id = ? AND point_kind = ? AND source_turn_id = ?"
                f" AND {_BARRIER_SQL} ORDER BY op_seq LIMIT 1",
                (ws, req.source_session_id, req.point_kind, turn_id),
            )
            if held is not None:
                return _decode(tx.conn, held), False
            tx.check_fence(req.source_session_id)  # another fork on this source: retryable
            self._check_target_free(tx, ws, req)
            blockers = source_blockers(tx.conn, ws, source)
            # Static source facts first, then whether the Turn is a settled Turn of this source,
            # then quiescence, then the boundary's content (load_boundary).
            static = {
                ForkBoundaryReason.SOURCE_NOT_ROOT,
                ForkBoundaryReason.SOURCE_PROVIDER_SESSION_MISSING,
            }
            for reason in blockers:
                if reason in static:
                    raise ForkBoundaryError(reason)
            boundary = load_boundary(tx.conn, ws, req.source_session_id, turn_id)
            if blockers:
                raise ForkBoundaryError(blockers[0])
            selected = boundary.selected
            if turn_forkable is not None and not turn_forkable(
                selected["root_provider_turn_id"], selected["provider_turn_binding_json"]
            ):
                raise ForkBoundaryError(ForkBoundaryReason.PROVIDER_TURN_NOT_BOUND)
            count_row = tx.one(
                "SELECT COUNT(*) FROM fork_operations WHERE workspace_id = ?"
                " AND source_session_id = ? AND status != 'failed'",
                (ws, req.source_session_id),
            )
            ordinal = (int(count_row[0]) if count_row else 0) + 2
            title = child_title(tx.conn, ws, source.title, source.lineage is not None, ordinal)
            op_id = str(uuid.uuid4())
            snapshot, snapshot_text, snapshot_hash = freeze_snapshot(
                operation_id=op_id,
                workspace_id=ws,
                source=source,
                target_session_id=req.target_session_id,
                target_title=title,
                point_kind=req.point_kind,
                boundary=boundary,
                runtime_identity=req.runtime_identity,
            )
            # Prove now that commit can rewrite every reference (fail closed before dispatch).
            build_child(
                snapshot,
                child_provider_session_id="prepare-dry-run",
                binding_mode=req.binding_mode,
                turn_bindings=None,
                committed_at_ms=tx.now_ms,
                snapshot_hash=snapshot_hash,
            )
            assert source.provider_session_id is not None
            tx.execute(
                "INSERT INTO fork_operations (workspace_id, operation_id, request_id,"
                " request_hash, source_session_id, target_session_id, point_kind,"
                " source_turn_id, source_provider_session_id, source_provider_turn_id,"
                " source_provider_turn_ids, target_title, driver_kind, driver_version,"
                " binding_mode, snapshot_json, snapshot_hash, status, created_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'prepared', ?)",
                (
                    ws,
                    op_id,
                    req.request_id,
                    digest,
                    req.source_session_id,
                    req.target_session_id,
                    req.point_kind,
                    turn_id,
                    source.provider_session_id,
                    boundary.selected["root_provider_turn_id"],
                    dumps(list(boundary.provider_turn_ids)),
                    title,
                    req.driver_kind,
                    req.driver_version,
                    req.binding_mode,
                    snapshot_text,
                    snapshot_hash,
                    tx.now_ms,
                ),
            )
            tx.execute(
                "INSERT INTO session_reservations (workspace_id, session_id, operation_id)"
                " VALUES (?, ?, ?)",
                (ws, req.target_session_id, op_id),
            )
            tx.emit(ForkOperationChanged(ws, op_id))
            tx.emit(SessionChanged(ws, req.source_session_id))
            return _load_op(tx.conn, ws, op_id), True

    @staticmethod
    def _check_target_free(tx: Tx, ws: str, req: ForkPrepareRequest) -> None:
        if req.target_session_id == req.source_session_id:
            raise ForkConflict(
                ForkBoundaryReason.TARGET_EQUALS_SOURCE,
                "the fork target must differ from the source",
                params={"field": "targetAgentSessionId"},
            )
        taken = tx.one(
            "SELECT 'session' FROM sessions WHERE workspace_id = ? AND session_id = ?"
            " UNION ALL SELECT 'reserved' FROM session_reservations WHERE workspace_id = ?"
            " AND session_id = ?",
            (ws, req.target_session_id, ws, req.target_session_id),
        )
        if taken is not None:
            raise ForkConflict(
                ForkBoundaryReason.TARGET_SESSION_EXISTS
                if taken[0] == "session"
                else ForkBoundaryReason.TARGET_SESSION_RESERVED,
                f"target session id {req.target_session_id} is already {taken[0]}",
                params={"field": "targetAgentSessionId"},
            )

    # -- transitions ---------------------------------------------------------------------------

    def _transition(
        self,
        ws: str,
        op_id: str,
        *,
        to: ForkStatus,
        sources: tuple[ForkStatus, ...],
        assignments: str,
        params: tuple[Any, ...],
        release: bool = False,
    ) -> tuple[ForkOperation, bool]:
        with self._write(ws) as tx:
            op = _load_op(tx.conn, ws, op_id, project=False)
            if op.status is to:
                return _load_op(tx.conn, ws, op_id), False
            if op.status not in sources:
                raise InvalidTransition(
                    f"fork operation {op_id} cannot go from {op.status} to {to}",
                    params={"operationId": op_id, "status": op.status.value, "to": to.value},
                )
            marks = ",".join("?" * len(sources))
            tx.execute(
                f"UPDATE fork_operations SET status = ?, {assignments}"
                f" WHERE workspace_id = ? AND operation_id = ? AND status IN ({marks})",
                (to.value, *params, ws, op_id, *(s.value for s in sources)),
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
            return _load_op(tx.conn, ws, op_id), True

    def settle_leftover_fork_operations(
        self, ops: Sequence[ForkOperation], *, prepared_error: str, dispatching_error: str
    ) -> tuple[int, int]:
        """Start-up recovery of one page in one transaction: `prepared` → failed (reservation
        released), `dispatching` → unknown. Each row is still guarded by its status, so a row
        that moved on is left alone. Returns (failed, unknown)."""
        failed = unknown = 0
        with self._write(None) as tx:
            for op in ops:
                ws, op_id = op.workspace_id, op.operation_id
                # The restart rule lives in domain.fork_states; the commit of a
                # provider_accepted leftover is not a pure status change (commit_fork does it).
                source, to = op.status, after_restart(op.status)
                if to is ForkStatus.FAILED:
                    error = prepared_error
                elif to is ForkStatus.UNKNOWN:
                    error = dispatching_error
                else:
                    continue
                tx.execute(
                    "UPDATE fork_operations SET status = ?, error = ?, completed_at_ms = ?"
                    " WHERE workspace_id = ? AND operation_id = ? AND status = ?",
                    (to.value, error, tx.now_ms, ws, op_id, source.value),
                )
                if tx.changes() != 1:
                    continue
                if to is ForkStatus.FAILED:
                    tx.execute(
                        "DELETE FROM session_reservations"
                        " WHERE workspace_id = ? AND operation_id = ?",
                        (ws, op_id),
                    )
                    failed += 1
                else:
                    unknown += 1
                tx.emit(ForkOperationChanged(ws, op_id))
                tx.emit(SessionChanged(ws, op.source_session_id))
        return failed, unknown

    def mark_fork_dispatching(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """The durable marker written before the provider call may leave the host (law 1)."""
        now = self.now_ms()
        return self._transition(
            ws,
            op_id,
            to=ForkStatus.DISPATCHING,
            sources=sources_of(ForkStatus.DISPATCHING),
            assignments="dispatched_at_ms = ?",
            params=(now,),
        )

    def mark_fork_failed(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]:
        now = self.now_ms()
        return self._transition(
            ws,
            op_id,
            to=ForkStatus.FAILED,
            sources=sources_of(ForkStatus.FAILED),
            assignments="error = ?, completed_at_ms = ?",
            params=(str(error), now),
            release=True,
        )

    def mark_fork_unknown(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]:
        """Permanent: an unknown delivery keeps its barrier and is never redispatched."""
        now = self.now_ms()
        return self._transition(
            ws,
            op_id,
            to=ForkStatus.UNKNOWN,
            sources=sources_of(ForkStatus.UNKNOWN),
            assignments="error = ?, completed_at_ms = ?",
            params=(str(error), now),
            release=True,
        )

    def mark_fork_provider_accepted(
        self, ws: str, op_id: str, evidence: ProviderForkEvidence
    ) -> tuple[ForkOperation, bool]:
        """Persist verified provider evidence; after this only the local commit is retried."""
        with self._write(ws) as tx:
            op = _load_op(tx.conn, ws, op_id, project=False)
            if op.status in (ForkStatus.PROVIDER_ACCEPTED, ForkStatus.COMMITTED):
                if op.target_provider_session_id != evidence.child_provider_session_id:
                    raise InvalidTransition(
                        f"fork operation {op_id} already accepted a different provider child",
                        params={"operationId": op_id, "status": op.status.value},
                    )
                return _load_op(tx.conn, ws, op_id), False
            if op.status is not ForkStatus.DISPATCHING:
                raise InvalidTransition(
                    f"fork operation {op_id} cannot go from {op.status} to provider_accepted",
                    params={"operationId": op_id, "status": op.status.value},
                )
            _validate_evidence(op, evidence)
            _record_accepted(tx, ws, op_id, evidence, from_status=ForkStatus.DISPATCHING)
            return _load_op(tx.conn, ws, op_id), True

    def commit_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """Law 2: child, cloned history, lineage and `committed` in one transaction, computed
        from the snapshot only; a replay returns the same result with `changed=False`."""
        with self._write(ws) as tx:
            return self._commit_in(tx, ws, op_id)

    def commit_fork_operations(self, ops: Sequence[ForkOperation]) -> tuple[int, int]:
        """Start-up recovery: commit many `provider_accepted` operations in one transaction
        (one fsync), each inside its own savepoint so a bad one is rolled back alone.
        Returns (committed, errors)."""
        committed = errors = 0
        with self._write(None) as tx:
            for op in ops:
                tx.execute("SAVEPOINT recover_commit")
                try:
                    _, changed = self._commit_in(tx, op.workspace_id, op.operation_id)
                except Exception:  # noqa: BLE001 - recovery goes on with the next row
                    log.exception("recovery commit of fork operation %s failed", op.operation_id)
                    tx.execute("ROLLBACK TO recover_commit")
                    errors += 1
                else:
                    committed += int(changed)
                tx.execute("RELEASE recover_commit")
        return committed, errors

    def _commit_in(self, tx: Tx, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        r = tx.one(
            f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
            " AND operation_id = ?",
            (ws, op_id),
        )
        if r is None:
            raise ForkOperationNotFound(f"fork operation {op_id} not found")
        status = ForkStatus(r[19])
        if status is ForkStatus.COMMITTED:
            return _decode(tx.conn, r), False
        if status is not ForkStatus.PROVIDER_ACCEPTED:
            raise InvalidTransition(
                f"fork operation {op_id} cannot commit from {status}",
                params={"operationId": op_id, "status": status.value},
            )
        text_row = tx.one("SELECT snapshot_json FROM fork_operations WHERE op_seq = ?", (r[28],))
        assert text_row is not None
        snapshot = load_snapshot(text_row[0], r[18])
        self._reprove_identity(tx, ws, r, snapshot)
        plan = build_child(
            snapshot,
            child_provider_session_id=r[11],
            binding_mode=r[16],
            turn_bindings=loads(r[27]),
            committed_at_ms=tx.now_ms,
            snapshot_hash=r[18],
        )
        self._insert_child(tx, plan)
        tx.execute(
            "UPDATE fork_operations SET status = 'committed', target_turn_id = ?,"
            " completed_at_ms = ? WHERE workspace_id = ? AND operation_id = ?"
            " AND status = 'provider_accepted'",
            (plan.lineage.target_turn_id, tx.now_ms, ws, op_id),
        )
        tx.emit(ForkOperationChanged(ws, op_id))
        tx.emit(SessionChanged(ws, plan.session.session_id))
        tx.emit(SessionChanged(ws, r[4]))
        return _load_op(tx.conn, ws, op_id), True

    @staticmethod
    def _reprove_identity(tx: Tx, ws: str, r: Row, snapshot: Mapping[str, Any]) -> None:
        """Commit re-proves the source provider identity from the snapshot and the evidence."""
        source = snapshot["source"]
        if (
            snapshot["operation_id"] != r[1]
            or snapshot["workspace_id"] != ws
            or source["session_id"] != r[4]
            or snapshot["target"]["session_id"] != r[5]
            or snapshot["point"]["turn_id"] != r[7]
        ):
            raise ForkSnapshotCorrupt("snapshot does not belong to this operation")
        if source["provider_session_id"] != r[8]:
            raise ForkSnapshotCorrupt("snapshot source provider session differs from operation")
        if tuple(snapshot["provider_turn_ids"]) != tuple(loads(r[10])):
            raise ForkSnapshotCorrupt("snapshot provider turn prefix differs from operation")
        receipt = loads(r[17]) or {}
        forked_from = _forked_from(receipt)
        if forked_from is not None and forked_from != source["provider_session_id"]:
            raise ForkSnapshotCorrupt("evidence forkedFromId does not name the source")
        if not r[11] or r[11] == source["provider_session_id"]:
            raise ForkSnapshotCorrupt("provider child identity is not independent of the source")
        reserved = tx.one(
            "SELECT operation_id FROM session_reservations WHERE workspace_id = ?"
            " AND session_id = ?",
            (ws, r[5]),
        )
        if reserved is None or reserved[0] != r[1]:
            raise ForkSnapshotCorrupt("target session id is not reserved by this operation")
        if tx.one("SELECT 1 FROM sessions WHERE workspace_id = ? AND session_id = ?", (ws, r[5])):
            raise ForkSnapshotCorrupt("target session already exists before commit")

    @staticmethod
    def _insert_child(tx: Tx, plan: ChildPlan) -> None:
        s = plan.session
        tx.execute(
            "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
            " title, cwd, settings_json, runtime_context_json, model, pinned, deleted, goal,"
            " parent_session_id, parent_turn_id, rail_placement, visibility, created_at_ms,"
            " updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, NULL, NULL, ?,"
            " ?, ?, ?)",
            (
                s.workspace_id,
                s.session_id,
                s.kind,
                s.provider,
                s.provider_session_id,
                s.title,
                s.cwd,
                dumps(dict(s.settings)),
                dumps(dict(s.runtime_context)),
                s.model,
                s.rail_placement,
                s.visibility,
                s.created_at_ms,
                s.updated_at_ms,
            ),
        )
        tx.executemany(
            "INSERT INTO turns (workspace_id, session_id, turn_id, sequence, sequence_provenance,"
            " phase, outcome, root_provider_turn_id, provider_turn_binding_json,"
            " final_assistant_message_id, error, created_at_ms, settled_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            plan.turn_rows,
        )
        tx.executemany(
            "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
            " payload_json, version, position, created_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            plan.message_rows,
        )
        tx.executemany(
            "INSERT INTO interactions (workspace_id, session_id, interaction_id, request_id,"
            " turn_id, kind, status, input_json, output_json, created_at_ms, resolved_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            plan.interaction_rows,
        )
        lin = plan.lineage
        tx.execute(
            "INSERT INTO fork_lineage (workspace_id, target_session_id, source_session_id,"
            " source_turn_id, target_turn_id, operation_id, forked_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                s.workspace_id,
                lin.target_session_id,
                lin.source_session_id,
                lin.source_turn_id,
                lin.target_turn_id,
                lin.operation_id,
                lin.forked_at_ms,
            ),
        )
        # No event per cloned Turn (issue 20): the child is new, so no client holds any of its
        # Turns; `_commit_in`'s `SessionChanged` for it announces the whole child (a client
        # reads its Turns with `session.timeline`). A 1,000-Turn fork used to publish 1,000
        # `turn.updated`, each re-read from the store, past a subscriber's 1,000-event queue.

    def acknowledge_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """Client-observed ACK: committed only; sets the time once and releases the barrier."""
        with self._write(ws) as tx:
            op = _load_op(tx.conn, ws, op_id, project=False)
            if op.status is not ForkStatus.COMMITTED:
                raise ForkAcknowledgeConflict(
                    f"fork operation {op_id} is {op.public_status}, only committed can be ACKed",
                    params={"operationId": op_id, "status": op.public_status.value},
                )
            if op.client_observed_at_ms is not None:
                return _load_op(tx.conn, ws, op_id), False
            tx.execute(
                "UPDATE fork_operations SET client_observed_at_ms = ? WHERE workspace_id = ?"
                " AND operation_id = ? AND client_observed_at_ms IS NULL",
                (tx.now_ms, ws, op_id),
            )
            tx.emit(ForkOperationChanged(ws, op_id))
            return _load_op(tx.conn, ws, op_id), True

    # -- queries -------------------------------------------------------------------------------

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation:
        """A pure read; a committed operation carries its child rebuilt from the snapshot."""
        with self._read() as conn:
            return _load_op(conn, ws, op_id)

    def find_fork_operation_by_request(self, ws: str, request_id: str) -> ForkOperation | None:
        with self._read() as conn:
            r = conn.execute(
                f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND request_id = ?",
                (ws, request_id),
            ).fetchone()
            return None if r is None else _decode(conn, r)

    def recoverable_fork_operations(
        self, *, after: str | None = None, limit: int = 500
    ) -> tuple[list[ForkOperation], str | None]:
        """Operations needing start-up recovery, across workspaces, by a stable cursor."""
        if not 1 <= limit <= 10_000:
            raise InvalidArgument("limit", "limit must be between 1 and 10000")
        try:
            after_seq = int(after) if after is not None else 0
        except ValueError:
            raise InvalidArgument("cursor", "malformed cursor") from None
        rows = self._all(
            f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE status IN {_ACTIVE_SQL}"
            " AND op_seq > ? ORDER BY op_seq LIMIT ?",
            (after_seq, limit + 1),
        )
        ops = [_op_from_row(r) for r in rows[:limit]]
        cursor = str(rows[limit - 1][28]) if len(rows) > limit else None
        return ops, cursor

    def lineage_of(self, ws: str, sid: str) -> Lineage | None:
        session = self._with_conn(lambda c: load_session(c, ws, sid, include_deleted=True))
        return None if session is None else session.lineage

    def fork_operations_of(self, ws: str, sid: str) -> list[ForkOperation]:
        """Every operation whose source is `sid`, oldest first (without projections)."""
        rows = self._all(
            f"SELECT {_OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
            " AND source_session_id = ? ORDER BY op_seq",
            (ws, sid),
        )
        return [_op_from_row(r) for r in rows]

    def fork_readiness(self, ws: str, sid: str, turn_id: str | None = None) -> ForkReadiness:
        """Why a fork of `sid` (through `turn_id`) would be rejected now; inputs for
        capability/availability resolution. Never writes."""
        with self._read() as conn:
            session = require_session(conn, ws, sid)
            blocking = [r.value for r in source_blockers(conn, ws, session)]
            turn = None
            if turn_id is not None:
                turn = load_turn(conn, ws, sid, turn_id)
                try:
                    load_boundary(conn, ws, sid, turn_id)
                except ForkBoundaryError as exc:
                    blocking.append(exc.boundary_reason.value)
            active = conn.execute(
                "SELECT operation_id FROM fork_operations WHERE workspace_id = ?"
                f" AND source_session_id = ? AND status IN {_ACTIVE_SQL} LIMIT 1",
                (ws, sid),
            ).fetchone()
            return ForkReadiness(
                session=session,
                turn=turn,
                blocking=tuple(dict.fromkeys(blocking)),
                active_operation_id=None if active is None else active[0],
            )


__all__ = ["ForkEvidenceRejected", "ForkSnapshotCorrupt", "ForkStore"]
