"""Pure reads of fork operations the daemon makes: one operation by id, its child rebuilt from
the snapshot once committed, and the source fence — whether a Session is held by an active fork
operation (advisory here; every write re-checks it inside its own transaction, storage/sqlite.py
`Tx.check_fence`). (Reads only tests make — by request, by source, lineage, fork readiness,
which operation holds a fence — are in tests/support/store_reads.py, out of `Store`.)"""

from __future__ import annotations

from storage.base import Database
from storage.models import ForkOperation
from storage.rows import load_op
from storage.sqlite import Tx

# -- An operation by id ----------------------------------------------------------------------------


class ForkQueries:
    """Reads only; never writes."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._read = db.read
        self._projections = db.projections

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation:
        """A pure read; a committed operation carries its child rebuilt from the snapshot."""
        with self._read() as conn:
            return load_op(conn, ws, op_id, projections=self._projections)


# -- The source fence ------------------------------------------------------------------------------


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
