"""Goal control: `session.setGoal` / `clearGoal`, each recorded as a finished goal control.

Goal controls and runtime operations that span a provider call block forks of the Session
while active (seed 000 §5 quiescence; `storage.fork_snapshot.source_blockers` reads them); no
daemon path opens one yet, so opening and finishing them lives with the tests that pin those
rules (tests/support/store_reads.py), not in `Store`.
"""

from __future__ import annotations

import uuid

from storage.base import Database
from storage.models import Session
from storage.rows import require_live_session, require_session, require_text, touch

KEPT_GOAL_CONTROLS = 64
"""How many finished goal controls a Session keeps (the newest): each `set_goal`/`clear_goal`
records one, a goal up to the text limit each, and only `active` ones are ever read (the fork's
quiescence); the Session row holds the goal itself."""


class SessionControls:
    """Goal controls."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write

    def set_goal(self, ws: str, sid: str, goal: str) -> Session:
        require_text("goal", goal)
        return self._apply_goal(ws, sid, "set", goal)

    def clear_goal(self, ws: str, sid: str) -> Session:
        return self._apply_goal(ws, sid, "clear", None)

    def _apply_goal(self, ws: str, sid: str, action: str, goal: str | None) -> Session:
        with self._write(ws, fence=sid) as tx:
            require_live_session(tx.conn, ws, sid)
            tx.execute(
                "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal,"
                " status, created_at_ms, finished_at_ms) VALUES (?, ?, ?, ?, ?, 'finished', ?, ?)",
                (ws, sid, str(uuid.uuid4()), action, goal, tx.now_ms, tx.now_ms),
            )
            # The record stays bounded: the oldest finished controls past the kept number go.
            tx.execute(
                "DELETE FROM goal_controls WHERE workspace_id = ?1 AND session_id = ?2"
                " AND status = 'finished' AND control_id NOT IN (SELECT control_id FROM"
                " goal_controls WHERE workspace_id = ?1 AND session_id = ?2"
                " AND status = 'finished' ORDER BY created_at_ms DESC, rowid DESC LIMIT ?3)",
                (ws, sid, KEPT_GOAL_CONTROLS),
            )
            tx.execute(
                "UPDATE sessions SET goal = ? WHERE workspace_id = ? AND session_id = ?",
                (goal, ws, sid),
            )
            touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)
