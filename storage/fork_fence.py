"""The source fence: whether a Session is held by an active fork operation (advisory here;
every write re-checks it inside its own transaction, storage/base.py `Tx.check_fence`)."""

from __future__ import annotations

from storage.base import StoreBase, Tx
from storage.fork_rows import ACTIVE_OPS_SQL, OP_COLUMNS, op_from_row
from storage.models import ForkOperation


class ForkFence(StoreBase):
    """The fence reads of seed 000 §6."""

    def check_fence(self, ws: str, sid: str) -> None:
        """Raise `ForkInProgress` if `sid` is fenced now (advisory; writes re-check in-tx)."""
        with self._read() as conn:
            tx = Tx(conn, ws, 0)
            tx.check_fence(sid)

    def fence_holder(self, ws: str, sid: str) -> ForkOperation | None:
        """The active operation holding `sid`'s fence, if any."""
        r = self._one(
            f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
            f" AND source_session_id = ? AND status IN {ACTIVE_OPS_SQL} LIMIT 1",
            (ws, sid),
        )
        return None if r is None else op_from_row(r)
