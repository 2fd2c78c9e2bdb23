"""Row helpers the canonical history's modules share: load or require a Session or Turn,
validate an argument, touch a Session (its `updated_at_ms` and a change event), finish submit
claims, the next Message position."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import apsw

from domain.errors import InvalidArgument, SessionNotFound, TurnNotFound
from storage.models import Session, SessionChanged, Turn
from storage.rows import (
    SESSION_SELECT,
    TURN_COLUMNS,
    hydrate_turns,
    session_from_row,
    turn_from_row,
)
from storage.writes import Tx


def require_text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(field, f"{field} must be a non-empty string")
    return value


def require_mapping(field: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(field, f"{field} must be a map")
    return value


def load_session(
    conn: apsw.Connection, ws: str, sid: str, *, include_deleted: bool = False
) -> Session | None:
    row = conn.execute(
        SESSION_SELECT + " WHERE s.workspace_id = ? AND s.session_id = ?", (ws, sid)
    ).fetchone()
    if row is None:
        return None
    session = session_from_row(row)
    if session.deleted and not include_deleted:
        return None
    return session


def require_session(conn: apsw.Connection, ws: str, sid: str) -> Session:
    session = load_session(conn, ws, sid)
    if session is None:
        raise SessionNotFound(f"session {sid} not found")
    return session


def require_live_session(
    conn: apsw.Connection, ws: str, sid: str, *, include_deleted: bool = False
) -> None:
    """`require_session` when the caller needs only to know the Session exists and is not
    deleted (or, `include_deleted`, exists at all): one primary-key lookup, without the
    lineage, active-Turn and JSON work of a whole Session (every write checks this inside the
    writer's baton)."""
    row = conn.execute(
        "SELECT deleted FROM sessions WHERE workspace_id = ? AND session_id = ?", (ws, sid)
    ).fetchone()
    if row is None or (row[0] and not include_deleted):
        raise SessionNotFound(f"session {sid} not found")


def load_turn(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Turn | None:
    row = conn.execute(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, sid, turn_id),
    ).fetchone()
    if row is None:
        return None
    return hydrate_turns(conn, ws, sid, [row])[0]


def require_turn(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Turn:
    turn = load_turn(conn, ws, sid, turn_id)
    if turn is None:
        raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
    return turn


def turn_row(tx: Tx, ws: str, sid: str, turn_id: str) -> Turn:
    row = tx.one(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, sid, turn_id),
    )
    if row is None:
        raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
    return turn_from_row(row)


def touch(tx: Tx, ws: str, sid: str) -> None:
    tx.execute(
        "UPDATE sessions SET updated_at_ms = ? WHERE workspace_id = ? AND session_id = ?",
        (tx.now_ms, ws, sid),
    )
    tx.emit(SessionChanged(ws, sid))


def finish_claims(tx: Tx, ws: str, sid: str, turn_id: str) -> None:
    tx.execute(
        "UPDATE submit_claims SET status = 'finished', finished_at_ms = ?"
        " WHERE workspace_id = ? AND session_id = ? AND turn_id = ? AND status = 'active'",
        (tx.now_ms, ws, sid, turn_id),
    )


def next_position(tx: Tx, ws: str, sid: str) -> int:
    """The position after every Message the Session shows: its own rows' and, for a linked
    child, its link's bound (the linked rows are at or below it)."""
    row = tx.one(
        "SELECT MAX(COALESCE((SELECT MAX(position) FROM messages"
        " WHERE session_key = k.session_key), 0), COALESCE((SELECT through_position"
        " FROM history_links WHERE child_key = k.session_key), 0)) + 1"
        " FROM session_keys k WHERE k.workspace_id = ? AND k.session_id = ?",
        (ws, sid),
    )
    return int(row[0]) if row else 1
