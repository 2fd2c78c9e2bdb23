"""The source fence: whether a Session is held by an active fork operation (advisory here;
every write re-checks it inside its own transaction, storage/base.py `Tx.check_fence`). Which
operation holds it is a test's question (tests/support/store_reads.py `fence_holder`)."""

from __future__ import annotations

from storage.base import Database
from storage.sqlite import Tx


class ForkFence:
    """The fence reads of seed 000 §6."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._read = db.read

    def check_fence(self, ws: str, sid: str) -> None:
        """Raise `ForkInProgress` if `sid` is fenced now (advisory; writes re-check in-tx)."""
        with self._read() as conn:
            tx = Tx(conn, ws, 0)
            tx.check_fence(sid)
