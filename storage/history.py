"""A Turn's history: Messages (appended or updated by version) and Interactions (opened and
resolved), and the Session timeline that reads them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from storage.base import StoreBase, Tx, dumps
from storage.errors import Conflict, InteractionNotFound, InvalidArgument
from storage.models import (
    Interaction,
    InteractionStatus,
    Message,
    SessionChanged,
    Turn,
    TurnChanged,
    TurnPhase,
)
from storage.rows import (
    INTERACTION_COLUMNS,
    MESSAGE_COLUMNS,
    TURN_COLUMNS,
    hydrate_turns,
    interaction_from_row,
    message_from_row,
)
from storage.session_rows import (
    next_position,
    require_mapping,
    require_session,
    require_text,
    turn_row,
)


class HistoryStore(StoreBase):
    """Messages, Interactions and the timeline."""

    def append_message(
        self,
        ws: str,
        sid: str,
        turn_id: str | None,
        *,
        kind: str,
        text: str | None,
        payload: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> Message:
        """Append a Message in presentation order; an existing `message_id` of the same Turn is
        replaced in place with `version + 1` (streamed updates keep their position)."""
        require_text("kind", kind)
        payload_json = dumps(dict(require_mapping("payload", payload or {})))
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            if turn_id is not None:
                turn_row(tx, ws, sid, turn_id)
            if message_id is not None:
                existing = tx.one(
                    "SELECT turn_id FROM messages WHERE workspace_id = ? AND session_id = ?"
                    " AND message_id = ?",
                    (ws, sid, message_id),
                )
                if existing is not None:
                    if existing[0] != turn_id:
                        raise Conflict(f"message {message_id} belongs to another turn")
                    tx.execute(
                        "UPDATE messages SET kind = ?, text = ?, payload_json = ?,"
                        " version = version + 1 WHERE workspace_id = ? AND session_id = ?"
                        " AND message_id = ?",
                        (kind, text, payload_json, ws, sid, message_id),
                    )
                    return self._message_after(tx, ws, sid, message_id, turn_id)
            message_id = message_id or str(uuid.uuid4())
            tx.execute(
                "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
                " payload_json, version, position, created_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                (
                    ws,
                    sid,
                    message_id,
                    turn_id,
                    kind,
                    text,
                    payload_json,
                    next_position(tx, ws, sid),
                    tx.now_ms,
                ),
            )
            return self._message_after(tx, ws, sid, message_id, turn_id)

    def _message_after(
        self, tx: Tx, ws: str, sid: str, message_id: str, turn_id: str | None
    ) -> Message:
        row = tx.one(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE workspace_id = ? AND session_id = ?"
            " AND message_id = ?",
            (ws, sid, message_id),
        )
        assert row is not None
        if turn_id is not None:
            tx.emit(TurnChanged(ws, sid, turn_id))
        else:
            tx.emit(SessionChanged(ws, sid))
        return message_from_row(row)

    def open_interaction(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        *,
        request_id: str,
        kind: str,
        input: Mapping[str, Any],
    ) -> Interaction:
        """Open a pending Interaction on an active Turn; a repeated `request_id` returns it."""
        require_text("requestId", request_id)
        require_text("kind", kind)
        input_json = dumps(dict(require_mapping("input", input)))
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            turn = turn_row(tx, ws, sid, turn_id)
            existing = tx.one(
                f"SELECT {INTERACTION_COLUMNS} FROM interactions WHERE workspace_id = ?"
                " AND session_id = ? AND turn_id = ? AND request_id = ?",
                (ws, sid, turn_id, request_id),
            )
            if existing is not None:
                return interaction_from_row(existing)
            if turn.phase != TurnPhase.ACTIVE:
                raise Conflict(f"turn {turn_id} is settled; cannot open an interaction")
            interaction_id = str(uuid.uuid4())
            tx.execute(
                "INSERT INTO interactions (workspace_id, session_id, interaction_id, request_id,"
                " turn_id, kind, status, input_json, output_json, created_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, NULL, ?)",
                (ws, sid, interaction_id, request_id, turn_id, kind, input_json, tx.now_ms),
            )
            tx.emit(TurnChanged(ws, sid, turn_id))
            row = tx.one(
                f"SELECT {INTERACTION_COLUMNS} FROM interactions WHERE workspace_id = ?"
                " AND session_id = ? AND interaction_id = ?",
                (ws, sid, interaction_id),
            )
            assert row is not None
            return interaction_from_row(row)

    def resolve_interaction(
        self, ws: str, sid: str, turn_id: str, request_id: str, output: Mapping[str, Any]
    ) -> Interaction:
        output_json = dumps(dict(require_mapping("response", output)))
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            row = tx.one(
                "SELECT interaction_id, status FROM interactions WHERE workspace_id = ?"
                " AND session_id = ? AND turn_id = ? AND request_id = ?",
                (ws, sid, turn_id, request_id),
            )
            if row is None:
                raise InteractionNotFound(f"interaction {request_id} not found in turn {turn_id}")
            if row[1] != InteractionStatus.PENDING:
                raise Conflict(f"interaction {request_id} is {row[1]}, not pending")
            tx.execute(
                "UPDATE interactions SET status = 'resolved', output_json = ?, resolved_at_ms = ?"
                " WHERE workspace_id = ? AND session_id = ? AND interaction_id = ?",
                (output_json, tx.now_ms, ws, sid, row[0]),
            )
            tx.emit(TurnChanged(ws, sid, turn_id))
            result = tx.one(
                f"SELECT {INTERACTION_COLUMNS} FROM interactions WHERE workspace_id = ?"
                " AND session_id = ? AND interaction_id = ?",
                (ws, sid, row[0]),
            )
            assert result is not None
            return interaction_from_row(result)

    def timeline(
        self, ws: str, sid: str, *, after_sequence: int = 0, limit: int = 100
    ) -> tuple[list[Turn], int | None]:
        """Turns after `after_sequence` in order; `next_sequence` is set when more remain."""
        if not 1 <= limit <= 100_000:
            raise InvalidArgument("limit", "limit must be between 1 and 100000")
        with self._read() as conn:
            require_session(conn, ws, sid)
            rows = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND sequence > ? ORDER BY sequence LIMIT ?",
                (ws, sid, after_sequence, limit + 1),
            ).fetchall()
            turns = hydrate_turns(conn, ws, sid, rows[:limit])
        next_sequence = turns[-1].sequence if len(rows) > limit else None
        return turns, next_sequence

    def session_messages(self, ws: str, sid: str) -> list[Message]:
        """Every Message of a Session in presentation order (session-level ones included)."""
        with self._read() as conn:
            require_session(conn, ws, sid)
            return [
                message_from_row(r)
                for r in conn.execute(
                    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE workspace_id = ?"
                    " AND session_id = ? ORDER BY position",
                    (ws, sid),
                )
            ]
