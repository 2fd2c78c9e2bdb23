"""The durable side of `fork.resolve`: settle an `unknown` fork operation with
evidence — adopt its one verified provider child, or abandon it.

One `fork_resolutions` row per operation records the winning request (`requestId`), its action
and its state: `started` (durable before any worker call), `done` (the operation reached its
end), `rolled_back` (start-up recovery found it half done with the operation still `unknown`;
a new resolve may start over). Transitions, each one guarded transaction:

- adopt:   begin → `unknown → provider_accepted` with the evidence (`adopt_unknown_fork`) →
           the ordinary `commit_fork` → `finish_resolution`.
- abandon: begin → (worker quarantine) → `unknown → abandoned` + resolution done, releasing
           the barrier and the target reservation in the same transaction (`abandon_fork`).

A second request while one is `started` gets 409 `agent_session_fork_resolve_in_progress`
(retryable); after `done`, the same action gets the result, another 409
`agent_session_fork_resolve_conflict`.
"""

from __future__ import annotations

from typing import Any

from domain.errors import (
    ForkBoundaryError,
    ForkBoundaryReason,
    ForkResolveConflict,
    ForkResolveInProgress,
)
from domain.fork_states import (
    BARRIER_RELEASE_SQL,
    STAGE_A_FORK_SQL,
    ForkStatus,
    stage_assignment,
)
from storage.base import Database
from storage.fork_snapshot import source_blockers
from storage.fork_transitions import DELETE_RESERVATION_SQL, record_accepted, validate_evidence
from storage.models import (
    ForkOperation,
    ForkOperationChanged,
    ForkResolution,
    ProviderForkEvidence,
    SessionChanged,
)
from storage.rows import load_op, require_session
from storage.sqlite import Tx, dumps, loads

# What a source is, not what runs on it: an adopt does not re-check these.
_STATIC = frozenset(
    {ForkBoundaryReason.SOURCE_NOT_ROOT, ForkBoundaryReason.SOURCE_PROVIDER_SESSION_MISSING}
)


_COLUMNS = (
    "workspace_id, operation_id, request_id, action, state, child_id, evidence_json, result_json"
)


def _resolution(r: Any) -> ForkResolution:
    return ForkResolution(r[0], r[1], r[2], r[3], r[4], r[5], loads(r[6]), loads(r[7]))


_SELECT = f"SELECT {_COLUMNS} FROM fork_resolutions WHERE workspace_id = ? AND operation_id = ?"


def _load(tx: Tx, ws: str, op_id: str) -> ForkResolution | None:
    r = tx.one(_SELECT, (ws, op_id))
    return None if r is None else _resolution(r)


def _require_started(tx: Tx, ws: str, op: ForkOperation, action: str, doing: str) -> None:
    """The operation is `unknown` under a started resolution of `action`, else a 409 saying
    it is not being `doing` (adopted, abandoned)."""
    current = _load(tx, ws, op.operation_id)
    if (
        op.status is not ForkStatus.UNKNOWN
        or current is None
        or (current.action, current.state) != (action, "started")
    ):
        raise ForkResolveConflict(
            f"fork operation {op.operation_id} is not being {doing}",
            params={"operationId": op.operation_id, "status": op.public_status.value},
        )


_STARTED_SQL = (
    "SELECT r.workspace_id, r.operation_id, o.status FROM fork_resolutions r"
    " JOIN fork_operations o ON o.workspace_id = r.workspace_id"
    " AND o.operation_id = r.operation_id"
)
"""A resolution with its operation's status (`recover_fork_resolutions`,
`end_stale_resolution`)."""


class ResolutionStore:
    """Mixed into `storage.Store`."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._read = db.read
        self._rows = db.rows
        self._projections = db.projections

    def get_fork_resolution(self, ws: str, op_id: str) -> ForkResolution | None:
        with self._read() as conn:
            r = conn.execute(_SELECT, (ws, op_id)).fetchone()
            return None if r is None else _resolution(r)

    def begin_resolution(
        self,
        ws: str,
        op_id: str,
        *,
        request_id: str,
        action: str,
        child_id: str | None,
        evidence: Any,
    ) -> tuple[ForkResolution, bool]:
        """Record the resolution durably before anything moves; `(row, created)`. A replay of
        the winning request returns its row; any other request while it runs is a 409."""
        with self._write(ws) as tx:
            op = load_op(tx.conn, ws, op_id, project=False)
            current = _load(tx, ws, op_id)
            if current is not None and current.state != "rolled_back":
                if current.request_id == request_id and current.action == action:
                    return current, False
                if current.state == "started":
                    raise ForkResolveInProgress(
                        f"fork operation {op_id} is being resolved by request {current.request_id}",
                        params={"operationId": op_id, "action": current.action},
                    )
                raise ForkResolveConflict(
                    f"fork operation {op_id} was already resolved ({current.action})",
                    params={"operationId": op_id, "status": op.public_status.value},
                )
            if op.status is not ForkStatus.UNKNOWN:
                raise ForkResolveConflict(
                    f"fork operation {op_id} is {op.public_status}; only unknown is resolved",
                    params={"operationId": op_id, "status": op.public_status.value},
                )
            tx.execute(
                "INSERT INTO fork_resolutions (workspace_id, operation_id, request_id, action,"
                " state, child_id, evidence_json, result_json, created_at_ms, updated_at_ms)"
                " VALUES (?, ?, ?, ?, 'started', ?, ?, NULL, ?, ?)"
                " ON CONFLICT (workspace_id, operation_id) DO UPDATE SET"
                " request_id = excluded.request_id, action = excluded.action,"
                " state = 'started', child_id = excluded.child_id,"
                " evidence_json = excluded.evidence_json, result_json = NULL,"
                " updated_at_ms = excluded.updated_at_ms",
                (ws, op_id, request_id, action, child_id, dumps(evidence), tx.now_ms, tx.now_ms),
            )
            tx.emit(ForkOperationChanged(ws, op_id))
            row = _load(tx, ws, op_id)
            assert row is not None
            return row, True

    def adopt_unknown_fork(
        self, ws: str, op_id: str, evidence: ProviderForkEvidence
    ) -> tuple[ForkOperation, bool]:
        """`unknown → provider_accepted` under a started adopt; the evidence passes the same
        gate as a fork's. Afterwards `commit_fork` (or start-up recovery) commits it."""
        with self._write(ws) as tx:
            op = load_op(tx.conn, ws, op_id, project=False)
            if op.status in (ForkStatus.PROVIDER_ACCEPTED, ForkStatus.COMMITTED):
                if op.target_provider_session_id != evidence.child_provider_session_id:
                    raise ForkResolveConflict(
                        f"fork operation {op_id} already adopted another provider child",
                        params={"operationId": op_id},
                    )
                return load_op(tx.conn, ws, op_id, projections=self._projections), False
            _require_started(tx, ws, op, "adopt", "adopted")
            validate_evidence(op, evidence)
            # `provider_accepted` fences the source again: never while something runs on it
            # (a Turn claimed while the operation was `unknown` would find its own writes
            # refused mid-Turn). Checked here, in the accept's transaction (law 3).
            source = require_session(tx.conn, ws, op.source_session_id)
            running = [r for r in source_blockers(tx.conn, ws, source) if r not in _STATIC]
            if running:
                raise ForkBoundaryError(
                    running[0],
                    f"fork operation {op_id} cannot be adopted while its source is not quiet"
                    f" ({running[0].value}); adopt again once it is",
                )
            record_accepted(tx, ws, op_id, evidence, from_status=ForkStatus.UNKNOWN)
            return load_op(tx.conn, ws, op_id, projections=self._projections), True

    def abandon_fork(self, ws: str, op_id: str, result: Any) -> tuple[ForkOperation, bool]:
        """`unknown → abandoned` + the resolution done, in one transaction: releases the
        barrier (abandoned is not in it) and the target reservation."""
        with self._write(ws) as tx:
            op = load_op(tx.conn, ws, op_id, project=False)
            if op.status is ForkStatus.ABANDONED:
                return load_op(tx.conn, ws, op_id, projections=self._projections), False
            _require_started(tx, ws, op, "abandon", "abandoned")
            tx.execute(
                f"UPDATE fork_operations SET status = 'abandoned', completed_at_ms = ?"
                f"{BARRIER_RELEASE_SQL}{stage_assignment(ForkStatus.UNKNOWN, ForkStatus.ABANDONED)}"
                " WHERE workspace_id = ? AND operation_id = ? AND status = 'unknown'",
                (tx.now_ms, ws, op_id),
            )
            tx.execute(DELETE_RESERVATION_SQL, (ws, op.target_session_id, op_id))
            self._set_state(tx, ws, op_id, "done", result)
            tx.emit(ForkOperationChanged(ws, op_id))
            tx.emit(SessionChanged(ws, op.source_session_id))
            return load_op(tx.conn, ws, op_id, projections=self._projections), True

    def finish_resolution(self, ws: str, op_id: str, result: Any) -> ForkResolution | None:
        with self._write(ws) as tx:
            current = _load(tx, ws, op_id)
            if current is not None and current.state == "started":
                self._set_state(tx, ws, op_id, "done", result)
            return _load(tx, ws, op_id)

    def rollback_resolution(self, ws: str, op_id: str) -> None:
        """A worker step failed with the operation still `unknown`: a new resolve may start."""
        with self._write(ws) as tx:
            tx.execute(
                "UPDATE fork_resolutions SET state = 'rolled_back', updated_at_ms = ?"
                " WHERE workspace_id = ? AND operation_id = ? AND state = 'started'",
                (tx.now_ms, ws, op_id),
            )

    def recover_fork_resolutions(self) -> tuple[int, int]:
        """Start-up (after fork recovery): a `started` resolution whose operation moved on is
        finished; one whose operation is still `unknown` is rolled back (nothing of the
        operation changed; a quarantined child stays in quarantine). Returns (done, rolled)."""
        done = rolled = 0
        with self._write(None) as tx:
            rows = tx.conn.execute(f"{_STARTED_SQL} WHERE r.state = 'started'").fetchall()
            for r in rows:
                if self._end_started(tx, str(r[0]), str(r[1]), str(r[2])):
                    rolled += 1
                else:
                    done += 1
        return done, rolled

    def end_stale_resolution(self, ws: str, op_id: str) -> None:
        """The start-up rule for one `started` resolution no resolve of this daemon runs (its
        rollback or finish met a busy store): rolled back, or done if the operation moved on.
        A resolution that is not `started` is left as it is."""
        with self._write(ws) as tx:
            row = tx.conn.execute(
                f"{_STARTED_SQL} WHERE r.workspace_id = ? AND r.operation_id = ?"
                " AND r.state = 'started'",
                (ws, op_id),
            ).fetchone()
            if row is not None:
                self._end_started(tx, ws, op_id, str(row[2]))
                tx.emit(ForkOperationChanged(ws, op_id))

    def _end_started(self, tx: Tx, ws: str, op_id: str, status: str) -> bool:
        """End a `started` resolution by the operation's `status`: True if rolled back."""
        if status == ForkStatus.UNKNOWN:
            self._set_state(tx, ws, op_id, "rolled_back", None)
            return True
        self._set_state(tx, ws, op_id, "done", {"status": status})
        return False

    @staticmethod
    def _set_state(tx: Tx, ws: str, op_id: str, state: str, result: Any) -> None:
        tx.execute(
            "UPDATE fork_resolutions SET state = ?, result_json = ?, updated_at_ms = ?"
            " WHERE workspace_id = ? AND operation_id = ?",
            (state, dumps(result), tx.now_ms, ws, op_id),
        )

    def other_fork_prefixes(
        self, ws: str, source_session_id: str, operation_id: str
    ) -> list[tuple[str, ...]]:
        """The frozen provider Turn prefixes of the source's other operations that may own a
        provider child (every status but failed and abandoned): what attributes a child."""
        rows = self._rows(
            "SELECT source_provider_turn_ids FROM fork_operations WHERE workspace_id = ?"
            f" AND source_session_id = ? AND operation_id != ? AND {STAGE_A_FORK_SQL}",
            (ws, source_session_id, operation_id),
        )
        return [tuple(str(t) for t in (loads(str(r[0])) or ())) for r in rows]

    def claimed_provider_children(self, ws: str, source_session_id: str) -> list[str]:
        """Provider children other operations of this source recorded (never this op's)."""
        rows = self._rows(
            "SELECT target_provider_session_id FROM fork_operations WHERE workspace_id = ?"
            " AND source_session_id = ? AND target_provider_session_id IS NOT NULL",
            (ws, source_session_id),
        )
        return [str(r[0]) for r in rows]
