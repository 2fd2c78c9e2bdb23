"""Start-up recovery's store side: the operations left active by a stop, by a stable
cursor, and the restart rule (domain.fork_states.after_restart) applied to one page."""

from __future__ import annotations

from collections.abc import Sequence

from domain.errors import InvalidArgument
from domain.fork_states import ForkStatus, after_restart
from storage.base import Database
from storage.fork_rows import ACTIVE_OPS_SQL, OP_COLUMNS, op_from_row
from storage.models import ForkOperation, ForkOperationChanged, SessionChanged


class ForkRecovery:
    """Pages of leftovers and their settlement."""

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
