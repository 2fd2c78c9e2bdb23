"""Rows of the canonical history: their SQL column lists and decoders, and the row helpers the
store's parts share (load or require a Session or Turn, validate an argument, touch a Session,
finish submit claims, the next Message position).

Keeping the SELECT lists next to their decoders means a column added in a migration is
threaded through one place only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import apsw

from domain.errors import InvalidArgument, SessionNotFound, TurnNotFound
from storage.history_links import history_link, linked_rows
from storage.models import Interaction, Lineage, Message, Session, SessionChanged, Turn
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Row, Tx, loads

# -- Column lists and decoders ---------------------------------------------------------------------

def _lineage_column(column: str) -> str:
    return (
        f"(SELECT l.{column} FROM fork_lineage l WHERE l.workspace_id = s.workspace_id"
        " AND l.target_session_id = s.session_id)"
    )


# The lineage columns are scalar subqueries on fork_lineage's primary key (at most one row),
# not a LEFT JOIN: the same values, but SQLite ran the join ~7x slower per point read
# (110 vs 15 µs of CPU for one `session.get` on a 2,000-Session store).
# The active Turn is looked up by `turns_by_phase` (the Session's active Turns: at most one),
# sorted by `+t.sequence`: with a plain `t.sequence` SQLite walked the (session, sequence)
# index to skip the sort, reading every Turn the Session ever had (70 µs
# of CPU per Session read at 300 Turns, 250 µs at 1,500; ~18 µs at any size with `+`).
SESSION_SELECT = f"""
SELECT s.workspace_id, s.session_id, s.kind, s.provider, s.provider_session_id, s.title, s.cwd,
       s.settings_json, s.runtime_context_json, s.model, s.pinned, s.deleted, s.goal,
       (SELECT t.turn_id FROM turns t WHERE t.workspace_id = s.workspace_id
            AND t.session_id = s.session_id AND t.phase = 'active'
            ORDER BY +t.sequence LIMIT 1),
       s.parent_session_id, s.parent_turn_id, s.created_at_ms, s.updated_at_ms,
       s.rail_placement, s.visibility,
       {_lineage_column("source_session_id")}, {_lineage_column("source_turn_id")},
       {_lineage_column("target_turn_id")}, {_lineage_column("operation_id")},
       {_lineage_column("forked_at_ms")}
FROM sessions s
"""


def session_from_row(r: Row) -> Session:
    lineage = None
    if r[20] is not None:
        lineage = Lineage(
            source_session_id=r[20],
            source_turn_id=r[21],
            target_session_id=r[1],
            target_turn_id=r[22],
            operation_id=r[23],
            forked_at_ms=r[24],
        )
    return Session(
        workspace_id=r[0],
        session_id=r[1],
        kind=r[2],
        provider=r[3],
        provider_session_id=r[4],
        title=r[5],
        cwd=r[6],
        settings=loads(r[7]),
        runtime_context=loads(r[8]),
        model=r[9],
        pinned=bool(r[10]),
        deleted=bool(r[11]),
        goal=r[12],
        active_turn_id=r[13],
        parent_session_id=r[14],
        parent_turn_id=r[15],
        created_at_ms=r[16],
        updated_at_ms=r[17],
        lineage=lineage,
        rail_placement=r[18],
        visibility=r[19],
    )


TURN_COLUMNS = (
    "workspace_id, session_id, turn_id, sequence, sequence_provenance, phase, outcome,"
    " root_provider_turn_id, provider_turn_binding_json, final_assistant_message_id, error,"
    " created_at_ms, settled_at_ms, checkpoint_json"
)
MESSAGE_COLUMNS = "message_id, turn_id, kind, text, payload_json, version, position"
INTERACTION_COLUMNS = "interaction_id, request_id, turn_id, kind, status, input_json, output_json"


def message_from_row(r: Row) -> Message:
    payload = r[4]
    return Message(
        message_id=r[0],
        turn_id=r[1],
        kind=r[2],
        text=r[3],
        # Most Messages carry their text alone: a page of 50 Turns is ~500 of them, and the
        # JSON parser was a third of reading it. A fresh dict each: no two Messages share one.
        payload={} if payload == "{}" else loads(payload),
        version=r[5],
        position=r[6],
    )


def interaction_from_row(r: Row) -> Interaction:
    return Interaction(
        interaction_id=r[0],
        request_id=r[1],
        turn_id=r[2],
        kind=r[3],
        status=r[4],
        input=loads(r[5]),
        output=loads(r[6]),
    )


def turn_from_row(
    r: Row, messages: Sequence[Message] = (), interactions: Sequence[Interaction] = ()
) -> Turn:
    return Turn(
        workspace_id=r[0],
        session_id=r[1],
        turn_id=r[2],
        sequence=r[3],
        sequence_provenance=r[4],
        phase=r[5],
        outcome=r[6],
        root_provider_turn_id=r[7],
        provider_turn_binding_json=r[8],
        final_assistant_message_id=r[9],
        error=r[10],
        created_at_ms=r[11],
        settled_at_ms=r[12],
        messages=tuple(messages),
        interactions=tuple(interactions),
        checkpoint_json=r[13],
    )


def _chunks(items: Sequence[str], size: int = 400) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# The Messages of some Turns, each Turn's in position order. Ordered by (turn, position), the
# order of `messages_by_turn`, so SQLite looks each Turn up in it: ordered by position alone it
# walked the Session's position key over every Message the Session ever had (a 20-Turn
# timeline page: 0.67 ms at 300 Turns, 1.3-2.0 ms at 1,500; 0.55 ms at either this way).
HYDRATE_MESSAGES_SQL = (
    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = {SESSION_KEY_OF}"
    " AND turn_id IN ({marks}) ORDER BY turn_id, position"
)


def hydrate_turns(conn: apsw.Connection, ws: str, sid: str, turn_rows: Sequence[Row]) -> list[Turn]:
    """Attach each Turn's Messages and Interactions (presentation order) to its row."""
    ids = [r[2] for r in turn_rows]
    messages: dict[str, list[Message]] = {i: [] for i in ids}
    interactions: dict[str, list[Interaction]] = {i: [] for i in ids}
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        params: list[Any] = [ws, sid, *chunk]
        for r in conn.execute(HYDRATE_MESSAGES_SQL.format(marks=marks), params):
            messages[r[1]].append(message_from_row(r))
        for r in conn.execute(
            f"SELECT {INTERACTION_COLUMNS} FROM interactions WHERE workspace_id = ?"
            f" AND session_id = ? AND turn_id IN ({marks}) ORDER BY created_at_ms, rowid",
            params,
        ):
            interactions[r[2]].append(interaction_from_row(r))
    _add_linked(conn, ws, sid, turn_rows, messages)
    return [turn_from_row(r, messages[r[2]], interactions[r[2]]) for r in turn_rows]


def _add_linked(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    turn_rows: Sequence[Row],
    messages: dict[str, list[Message]],
) -> None:
    """A linked child's Turns of the boundary: their linked Messages beside their own rows (the
    own row at a position wins), each Turn's in position order (storage/history_links.py)."""
    link = history_link(conn, ws, sid)
    if link is None:
        return
    by_sequence = {int(r[3]): r[2] for r in turn_rows if int(r[3]) <= link.through_sequence}
    if not by_sequence:
        return
    taken = {m.position for t in by_sequence.values() for m in messages[t]}
    # Rows of one level, none of the child's own among them, come in (Turn, position) order.
    ordered = not taken and len(link.levels) == 1
    for row in linked_rows(conn, link, sequences=list(by_sequence), positions=taken):
        messages[by_sequence[row[7]]].append(message_from_row(row))
    if not ordered:
        for turn_id in by_sequence.values():
            messages[turn_id].sort(key=_position)


def _position(m: Message) -> int:
    return m.position


# -- Load, require and touch -----------------------------------------------------------------------
# Row helpers the canonical history's modules share: load or require a Session or Turn,
# validate an argument, touch a Session (its `updated_at_ms` and a change event), finish submit
# claims, the next Message position.

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
