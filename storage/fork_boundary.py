"""The fork boundary checks (seed 000 §4): what in the source blocks a fork (an active fork, a
running Turn, a pending Interaction), and the Turn boundary a fork may go through — settled,
bound to its provider turn, free of descendant lanes, session-local attachments and a resume
cursor of the source — loaded with its history for the snapshot."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import apsw

from domain.errors import (
    ForkBoundaryError,
    ForkBoundaryReason,
)
from domain.fork_states import ACTIVE_SQL
from storage.fork_child import (
    reject_duplicate_keys,
)
from storage.history_links import (
    DESCENDANT_LANE_KEY,
    DESCENDANT_LANE_KIND,
    HistoryScan,
    has_session_local_attachment,
    history_link,
    linked_message,
    scan_history,
    visible_rows,
)
from storage.models import (
    VERIFIABLE_PROVENANCE,
    Session,
    SessionKind,
    TurnPhase,
)
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Row

# A runtime-context resume cursor naming the source provider session must not cross the fork.
RESUME_CURSOR_KEY = "resumeCursor"
# A boundary (and snapshot v2) Message is an array of these, in this order; v1 snapshots had
# them as the keys of an object (storage/fork_snapshot.py reads both).
MESSAGE_FIELDS = ("message_id", "kind", "text", "payload", "version", "position")
# A version 4 boundary's Turn has these keys, in this order; a version 5 snapshot stores each
# Turn as an array of their values (storage/fork_snapshot.py), read back into this map.
TURN_FIELDS = (
    "turn_id",
    "sequence",
    "sequence_provenance",
    "phase",
    "outcome",
    "root_provider_turn_id",
    "provider_turn_binding_json",
    "final_assistant_message_id",
    "error",
    "created_at_ms",
    "settled_at_ms",
    "interactions",
    "final_assistant_position",
)


# -- boundary checks ------------------------------------------------------------------------


def source_blockers(conn: apsw.Connection, ws: str, session: Session) -> list[ForkBoundaryReason]:
    """Quiescence of the source (seed 000 §4), in a fixed order; empty when forkable."""
    sid = session.session_id
    reasons: list[ForkBoundaryReason] = []
    if session.kind != SessionKind.ROOT:
        reasons.append(ForkBoundaryReason.SOURCE_NOT_ROOT)
    if not session.provider_session_id:
        reasons.append(ForkBoundaryReason.SOURCE_PROVIDER_SESSION_MISSING)
    # Most specific first: a pending Interaction or an unbound submit claim only exists while a
    # Turn is active, so checking the Turn first would hide those reasons.
    checks = (
        (
            ForkBoundaryReason.SOURCE_GOAL_CONTROL_ACTIVE,
            "SELECT 1 FROM goal_controls WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_RUNTIME_OPERATION_ACTIVE,
            "SELECT 1 FROM runtime_operations WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_INTERACTION_PENDING,
            "SELECT 1 FROM interactions WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'pending'",
        ),
        (
            ForkBoundaryReason.SOURCE_SUBMIT_CLAIM_ACTIVE,
            "SELECT 1 FROM submit_claims WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_TURN_ACTIVE,
            "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ? AND phase = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_FORK_ACTIVE,
            "SELECT 1 FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
            f" AND status IN {ACTIVE_SQL}",
        ),
    )
    for reason, sql in checks:
        if conn.execute(sql + " LIMIT 1", (ws, sid)).fetchone() is not None:
            reasons.append(reason)
    return reasons


@dataclass(frozen=True, slots=True)
class Boundary:
    """The source history through the selected Turn, as frozen into the snapshot. Read for a
    version 3 snapshot (`messages=True`), each Turn's `messages` are snapshot v2 arrays
    (message_id, kind, text, payload, version, position); for version 4 the Turns carry none and
    `history` says what was learnt of the Messages in SQLite (storage/history_links.py)."""

    turns: list[dict[str, Any]]
    provider_turn_ids: tuple[str, ...]
    selected: dict[str, Any]
    history: HistoryScan | None = None


# No Turn id equals it: the first Message always looks its Turn up.
_NO_TURN = object()


def _parse_payload(text: str) -> Any:
    if text == "{}":  # most payloads: skip the parser (a 1,000-Turn boundary has ~10,000)
        return {}
    return json.loads(text, object_pairs_hook=reject_duplicate_keys)


# The key's subquery takes parameters 1 and 2 (workspace, Session): its `?`s are numbered in
# order, and `_MESSAGES_CUT` names them as `?1` and `?2`.
_MESSAGES_SQL = (
    "SELECT message_id, turn_id, kind, text, payload_json, version, position FROM messages"
    f" WHERE session_key = {SESSION_KEY_OF}{{cut}} ORDER BY position"
)
# The Turns through the selected one (`?3` its sequence), looked up once as a list.
_MESSAGES_CUT = (
    " AND turn_id IN (SELECT turn_id FROM turns WHERE workspace_id = ?1 AND session_id = ?2"
    " AND sequence <= ?3)"
)


# The boundary's Turns (`?3` the selected Turn's sequence), in order.
_TURN_COLUMNS = (
    "t.turn_id, t.sequence, t.sequence_provenance, t.phase, t.outcome, t.root_provider_turn_id,"
    " t.provider_turn_binding_json, t.final_assistant_message_id, t.error, t.created_at_ms,"
    " t.settled_at_ms"
)
_TURNS_WHERE = " WHERE t.workspace_id = ?1 AND t.session_id = ?2 AND t.sequence <= ?3"
_TURNS_SQL = f"SELECT {_TURN_COLUMNS} FROM turns t{_TURNS_WHERE} ORDER BY t.sequence"
# ... and with each one's final assistant Message (its position and its own Turn; NULLs when the
# Session holds no row of it) looked up by the `(session_key, message_id)` key as the walk reaches
# the Turn: one walk of the Turns, not a second one joining them to their final Messages.
_TURNS_FINALS_SQL = (
    f"SELECT {_TURN_COLUMNS}, fm.position, fm.turn_id FROM turns t LEFT JOIN messages fm"
    " ON fm.session_key = (SELECT session_key FROM session_keys WHERE workspace_id = ?1"
    " AND session_id = ?2) AND fm.message_id = t.final_assistant_message_id"
    f"{_TURNS_WHERE} ORDER BY t.sequence"
)


def load_boundary(
    conn: apsw.Connection, ws: str, sid: str, turn_id: str, *, messages: bool = True
) -> Boundary:
    """Read the through-Turn history (inclusive) and prove it forkable, else a boundary error.
    `messages=False` (snapshot version 4 and later): the Messages stay in SQLite, checked and
    digested there (`scan_history`); each Turn has the `TURN_FIELDS`, its
    `final_assistant_position` the position of its final assistant Message when that Message is
    in the boundary (else None)."""
    selected = conn.execute(
        "SELECT sequence, phase FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, sid, turn_id),
    ).fetchone()
    if selected is None:
        raise ForkBoundaryError(ForkBoundaryReason.TURN_NOT_FOUND)
    if selected[1] != TurnPhase.SETTLED:
        raise ForkBoundaryError(ForkBoundaryReason.TURN_NOT_SETTLED)
    through = int(selected[0])
    # Version 4: each Turn's final Message (position, owner Turn) in the same walk of the Turns.
    turn_rows = conn.execute(
        _TURNS_SQL if messages else _TURNS_FINALS_SQL, (ws, sid, through)
    ).fetchall()
    turns: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for expected, r in enumerate(turn_rows, start=1):
        # Verifiable provenance: host-assigned and gap-free 1..n, so "through" means the same
        # prefix to the provider as to us.
        if r[2] not in VERIFIABLE_PROVENANCE or r[1] != expected:
            raise ForkBoundaryError(ForkBoundaryReason.TURN_SEQUENCE_UNVERIFIED)
        if not r[5]:
            raise ForkBoundaryError(ForkBoundaryReason.PROVIDER_TURN_MISSING)
        turn: dict[str, Any] = {
            "turn_id": r[0],
            "sequence": r[1],
            "sequence_provenance": r[2],
            "phase": r[3],
            "outcome": r[4],
            "root_provider_turn_id": r[5],
            "provider_turn_binding_json": r[6],
            "final_assistant_message_id": r[7],
            "error": r[8],
            "created_at_ms": r[9],
            "settled_at_ms": r[10],
            "interactions": [],
        }
        if messages:
            turn["messages"] = []
        else:
            turn["final_assistant_position"] = None  # set below when in the boundary
        turns.append(turn)
        by_id[str(r[0])] = turn
    history: HistoryScan | None = None
    if messages:
        _read_messages(conn, ws, sid, through, by_id)
    else:
        history = scan_history(conn, ws, sid, through)
        _place_finals(conn, ws, sid, through, turn_rows, by_id)
    for r in conn.execute(
        "SELECT i.interaction_id, i.request_id, i.turn_id, i.kind, i.status, i.input_json,"
        " i.output_json FROM interactions i JOIN turns t ON t.workspace_id = i.workspace_id"
        " AND t.session_id = i.session_id AND t.turn_id = i.turn_id"
        " WHERE i.workspace_id = ? AND i.session_id = ? AND t.sequence <= ?"
        " ORDER BY t.sequence, i.created_at_ms, i.rowid",
        (ws, sid, through),
    ):
        by_id[r[2]]["interactions"].append(
            {
                "interaction_id": r[0],
                "request_id": r[1],
                "kind": r[3],
                "status": r[4],
                "input": _parse_payload(r[5]),
                "output": None if r[6] is None else _parse_payload(r[6]),
            }
        )
    return Boundary(
        turns=turns,
        provider_turn_ids=tuple(t["root_provider_turn_id"] for t in turns),
        selected=by_id[turn_id],
        history=history,
    )


def _place_finals(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    through: int,
    turn_rows: list[Row],
    by_id: dict[str, dict[str, Any]],
) -> None:
    """Each boundary Turn's `final_assistant_position`: the position of its final assistant
    Message, when that Message's own Turn is in the boundary. `turn_rows` (`_TURNS_FINALS_SQL`)
    carry the Session's own row of it; a linked child's Message not among its own rows is the
    source's (`linked_message`)."""
    linked = history_link(conn, ws, sid) is not None
    for r in turn_rows:
        final_id, position, message_owner = r[7], r[11], r[12]
        if final_id is None:
            continue
        if position is None and linked:
            found = linked_message(conn, ws, sid, final_id)
            if found is not None:
                position, message_owner = found[6], found[1]
        if position is not None and message_owner in by_id:
            by_id[str(r[0])]["final_assistant_position"] = position


def _read_messages(
    conn: apsw.Connection, ws: str, sid: str, through: int, by_id: dict[str, dict[str, Any]]
) -> None:
    """A version 3 boundary's Messages, into each Turn's `messages`."""
    # Through the last Turn (a fork of the whole history, the usual case) every Message with a
    # Turn is in the boundary: read them in position order alone. A join to `turns` for each
    # Message's sequence cost a second index search per row (~40 % of this read at 10,000).
    later = conn.execute(
        "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ? AND sequence > ? LIMIT 1",
        (ws, sid, through),
    ).fetchone()
    rows: Iterable[Row]
    if history_link(conn, ws, sid) is not None:  # a linked child: its visible rows
        rows = [r[:7] for r in visible_rows(conn, ws, sid, through)]
    elif later is None:
        rows = conn.execute(_MESSAGES_SQL.format(cut=""), (ws, sid))
    else:
        rows = conn.execute(_MESSAGES_SQL.format(cut=_MESSAGES_CUT), (ws, sid, through))
    # One pass over ~10,000 rows at 1,000 Turns: a Turn's Messages are consecutive in position
    # order, so its list's `append` is looked up once per run of them, not once per Message.
    lane_kind = DESCENDANT_LANE_KIND
    current: Any = _NO_TURN
    append: Callable[[list[Any]], None] | None = None
    for message_id, owner_id, kind, text, payload_json, version, position in rows:
        if owner_id != current:
            current = owner_id
            owner = by_id.get(owner_id)
            append = None if owner is None else owner["messages"].append
        if append is None:  # a Message of no Turn is not part of any Turn's history
            continue
        if kind == lane_kind:
            raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
        if payload_json == "{}":  # most payloads: no parse, no marker to look for
            payload: Any = {}
        else:
            payload = json.loads(payload_json, object_pairs_hook=reject_duplicate_keys)
            # Parsed JSON: an object is a plain dict (no ABC isinstance per Message).
            if type(payload) is dict and payload:
                if payload.get(DESCENDANT_LANE_KEY):
                    raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
                if has_session_local_attachment(payload):
                    raise ForkBoundaryError(ForkBoundaryReason.SESSION_LOCAL_ATTACHMENT_IN_BOUNDARY)
        # A snapshot v2 Message: an array in `MESSAGE_FIELDS` order.
        append([message_id, kind, text, payload, version, position])
