"""Pure reads of fork operations: by id, by request, by source, lineage, and the fork
readiness of a Session (the inputs of capability/availability resolution)."""

from __future__ import annotations

from storage.base import StoreBase
from storage.errors import ForkBoundaryError
from storage.fork_rows import ACTIVE_OPS_SQL, OP_COLUMNS, decode_op, load_op, op_from_row
from storage.fork_snapshot import load_boundary, source_blockers
from storage.models import ForkOperation, ForkReadiness, Lineage
from storage.session_rows import load_session, load_turn, require_session


class ForkQueries(StoreBase):
    """Reads only; never writes."""

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation:
        """A pure read; a committed operation carries its child rebuilt from the snapshot."""
        with self._read() as conn:
            return load_op(conn, ws, op_id)

    def find_fork_operation_by_request(self, ws: str, request_id: str) -> ForkOperation | None:
        with self._read() as conn:
            r = conn.execute(
                f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND request_id = ?",
                (ws, request_id),
            ).fetchone()
            return None if r is None else decode_op(conn, r)

    def lineage_of(self, ws: str, sid: str) -> Lineage | None:
        session = self._with_conn(lambda c: load_session(c, ws, sid, include_deleted=True))
        return None if session is None else session.lineage

    def fork_operations_of(self, ws: str, sid: str) -> list[ForkOperation]:
        """Every operation whose source is `sid`, oldest first (without projections)."""
        rows = self._all(
            f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
            " AND source_session_id = ? ORDER BY op_seq",
            (ws, sid),
        )
        return [op_from_row(r) for r in rows]

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
                f" AND source_session_id = ? AND status IN {ACTIVE_OPS_SQL} LIMIT 1",
                (ws, sid),
            ).fetchone()
            return ForkReadiness(
                session=session,
                turn=turn,
                blocking=tuple(dict.fromkeys(blocking)),
                active_operation_id=None if active is None else active[0],
            )
