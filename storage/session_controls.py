"""Goal control and runtime operations: Session-level work that spans a provider call and
blocks forks of the Session while it is active (seed 000 §5 quiescence).
"""

from __future__ import annotations

import uuid

from storage.base import StoreBase
from storage.errors import InvalidArgument, NotFound
from storage.models import Session
from storage.session_rows import load_session, require_session, require_text, touch


class SessionControls(StoreBase):
    """Goal controls and runtime operations."""

    def set_goal(self, ws: str, sid: str, goal: str) -> Session:
        require_text("goal", goal)
        return self._apply_goal(ws, sid, "set", goal)

    def clear_goal(self, ws: str, sid: str) -> Session:
        return self._apply_goal(ws, sid, "clear", None)

    def _apply_goal(self, ws: str, sid: str, action: str, goal: str | None) -> Session:
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            tx.execute(
                "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal,"
                " status, created_at_ms, finished_at_ms) VALUES (?, ?, ?, ?, ?, 'finished', ?, ?)",
                (ws, sid, str(uuid.uuid4()), action, goal, tx.now_ms, tx.now_ms),
            )
            tx.execute(
                "UPDATE sessions SET goal = ? WHERE workspace_id = ? AND session_id = ?",
                (goal, ws, sid),
            )
            touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)

    def begin_goal_control(self, ws: str, sid: str, action: str, goal: str | None = None) -> str:
        """Open a goal-control operation that spans a provider call (blocks forks until done)."""
        if action not in ("set", "clear"):
            raise InvalidArgument("action", "goal control action must be 'set' or 'clear'")
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            control_id = str(uuid.uuid4())
            tx.execute(
                "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal,"
                " status, created_at_ms) VALUES (?, ?, ?, ?, ?, 'active', ?)",
                (ws, sid, control_id, action, goal, tx.now_ms),
            )
            return control_id

    def finish_goal_control(self, ws: str, control_id: str, *, apply: bool = True) -> Session:
        """Finish a goal control; `apply` writes its goal to the Session. Idempotent."""
        with self._write(ws) as tx:
            row = tx.one(
                "SELECT session_id, action, goal, status FROM goal_controls"
                " WHERE workspace_id = ? AND control_id = ?",
                (ws, control_id),
            )
            if row is None:
                raise NotFound(f"goal control {control_id} not found")
            sid, action, goal, status = row
            if status == "active":
                tx.execute(
                    "UPDATE goal_controls SET status = 'finished', finished_at_ms = ?"
                    " WHERE workspace_id = ? AND control_id = ?",
                    (tx.now_ms, ws, control_id),
                )
                if apply:
                    tx.execute(
                        "UPDATE sessions SET goal = ? WHERE workspace_id = ? AND session_id = ?",
                        (goal if action == "set" else None, ws, sid),
                    )
                touch(tx, ws, sid)
            session = load_session(tx.conn, ws, sid, include_deleted=True)
            assert session is not None  # FK guarantees the row
            return session

    def begin_runtime_operation(self, ws: str, sid: str, kind: str) -> str:
        require_text("kind", kind)
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            op_id = str(uuid.uuid4())
            tx.execute(
                "INSERT INTO runtime_operations (workspace_id, session_id, operation_id, kind,"
                " status, created_at_ms) VALUES (?, ?, ?, ?, 'active', ?)",
                (ws, sid, op_id, kind, tx.now_ms),
            )
            return op_id

    def finish_runtime_operation(self, ws: str, op_id: str) -> None:
        # Not fenced: finishing can never be what a frozen snapshot depends on.
        with self._write(ws) as tx:
            row = tx.one(
                "SELECT status FROM runtime_operations WHERE workspace_id = ? AND operation_id = ?",
                (ws, op_id),
            )
            if row is None:
                raise NotFound(f"runtime operation {op_id} not found")
            tx.execute(
                "UPDATE runtime_operations SET status = 'finished', finished_at_ms = ?"
                " WHERE workspace_id = ? AND operation_id = ? AND status = 'active'",
                (tx.now_ms, ws, op_id),
            )
