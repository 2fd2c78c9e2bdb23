"""Pure reads of fork operations the daemon makes: one operation by id, its child rebuilt from
the snapshot once committed. (Reads only tests make — by request, by source, lineage, fork
readiness — are in tests/support/store_reads.py, out of `Store`.)"""

from __future__ import annotations

from storage.base import Database
from storage.fork_rows import load_op
from storage.models import ForkOperation


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
