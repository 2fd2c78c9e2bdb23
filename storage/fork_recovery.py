"""Start-up recovery's store side: the operations left active by a stop, by a stable
cursor, and the restart rule's pure status changes (domain.fork_states.after_restart) applied
to the whole store at once."""

from __future__ import annotations

from domain.errors import InvalidArgument
from domain.fork_states import ACTIVE, ForkStatus, after_restart
from storage.base import Database
from storage.fork_rows import ACTIVE_OPS_SQL, OP_COLUMNS, op_from_row
from storage.models import ForkOperation, ForkOperationChanged, LeftoverCommit, SessionChanged


class ForkRecovery:
    """Pages of leftovers, and the settlement of those that are not commits."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._all = db.rows

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
            f"SELECT {OP_COLUMNS} FROM fork_operations WHERE status IN {ACTIVE_OPS_SQL}"
            " AND op_seq > ? ORDER BY op_seq LIMIT ?",
            (after_seq, limit + 1),
        )
        ops = [op_from_row(r) for r in rows[:limit]]
        cursor = str(rows[limit - 1][28]) if len(rows) > limit else None
        return ops, cursor

    def leftover_commits(self) -> list[LeftoverCommit]:
        """Every `provider_accepted` operation (the restart rule's commits), oldest first, by
        its key alone: a start lists thousands of them after the status changes, and the
        commit reads each row again in its own transaction, so no row is decoded here."""
        rows = self._all(
            "SELECT workspace_id, operation_id FROM fork_operations"
            " WHERE status = ? ORDER BY op_seq",
            (ForkStatus.PROVIDER_ACCEPTED.value,),
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
                moved = tx.all(
                    "UPDATE fork_operations SET status = ?, error = ?, completed_at_ms = ?"
                    " WHERE status = ? RETURNING workspace_id, operation_id, source_session_id",
                    (to.value, error, tx.now_ms, source.value),
                )
                if to is ForkStatus.FAILED:
                    tx.executemany(
                        "DELETE FROM session_reservations"
                        " WHERE workspace_id = ? AND operation_id = ?",
                        [(ws, op_id) for ws, op_id, _ in moved],
                    )
                    failed += len(moved)
                else:
                    unknown += len(moved)
                for ws, op_id, source_sid in moved:
                    tx.emit(ForkOperationChanged(ws, op_id))
                    tx.emit(SessionChanged(ws, source_sid))
        return failed, unknown
