"""Start-up recovery's store side: the operations left to commit by a stop, by key, and the
restart rule's pure status changes (domain.fork_states.after_restart) applied
to the whole store at once."""

from __future__ import annotations

from domain.fork_states import (
    ACTIVE,
    BARRIER_RELEASE_SQL,
    BARRIER_SQL,
    ForkStatus,
    after_restart,
    stage_assignment,
)
from storage.base import Database
from storage.fork_transitions import DELETE_RESERVATION_SQL
from storage.models import ForkOperationChanged, LeftoverCommit, SessionChanged

# Every active operation holds its barrier, so the barrier's partial index holds them all (with
# the few `unknown` and un-ACKed committed ones); no index leads with `status` (schema v19). The
# rule's predicate is repeated so the index may be used; the status is a literal, not bound.
_BY_BARRIER = "fork_operations INDEXED BY fork_operations_barrier_held"


def _leftover(status: ForkStatus) -> str:
    """`WHERE` for the operations left in `status` (an active one) by a stop."""
    return f"WHERE status = '{status.value}' AND {BARRIER_SQL}"


class ForkRecovery:
    """Pages of leftovers, and the settlement of those that are not commits."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._all = db.rows

    def leftover_commits(self) -> list[LeftoverCommit]:
        """Every `provider_accepted` operation (the restart rule's commits), oldest first, by
        its key alone: a start lists thousands of them after the status changes, and the
        commit reads each row again in its own transaction, so no row is decoded here."""
        rows = self._all(
            f"SELECT workspace_id, operation_id FROM {_BY_BARRIER}"
            f" {_leftover(ForkStatus.PROVIDER_ACCEPTED)} ORDER BY op_seq"
        )
        return [LeftoverCommit(str(ws), str(op_id)) for ws, op_id in rows]

    def settle_leftover_fork_statuses(
        self, *, prepared_error: str, dispatching_error: str
    ) -> tuple[int, int]:
        """Start-up recovery's pure status changes over the whole store, in one transaction
        (one fsync), set-based: one UPDATE per status the restart rule (`after_restart`) moves
        to `failed` (the reservation released) or `unknown`, no operation row decoded — a
        page-at-a-time settle pays a COMMIT per page and a decode per row, for changes that
        need neither. Only rows still in the status are changed (the UPDATE's own guard).
        Returns (failed, unknown)."""
        failed = unknown = 0
        with self._write(None) as tx:
            for source in sorted(ACTIVE, key=lambda s: s.value):
                to = after_restart(source)
                if to is ForkStatus.FAILED:
                    error = prepared_error
                elif to is ForkStatus.UNKNOWN:
                    error = dispatching_error
                else:
                    continue  # provider_accepted: its commit is not a status change
                # `failed` leaves the barrier's set: its flag in the same UPDATE (schema v22).
                release = "" if to is ForkStatus.UNKNOWN else BARRIER_RELEASE_SQL
                release += stage_assignment(source, to)  # 2 → 0 or 1 (schema v23)
                moved = tx.all(
                    f"UPDATE {_BY_BARRIER} SET status = ?, error = ?, completed_at_ms = ?{release}"
                    f" {_leftover(source)} RETURNING workspace_id, operation_id, source_session_id,"
                    " target_session_id",
                    (to.value, error, tx.now_ms),
                )
                if to is ForkStatus.FAILED:
                    tx.executemany(
                        DELETE_RESERVATION_SQL,
                        [(ws, target, op_id) for ws, op_id, _, target in moved],
                    )
                    failed += len(moved)
                else:
                    unknown += len(moved)
                for ws, op_id, source_sid, _ in moved:
                    tx.emit(ForkOperationChanged(ws, op_id))
                    tx.emit(SessionChanged(ws, source_sid))
        return failed, unknown
