"""A Turn's history: Messages (appended or updated by version) and Interactions (opened and
resolved), and the Session timeline that reads them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from domain.errors import Conflict, InteractionNotFound, InvalidArgument, TurnNotFound
from storage.base import Database
from storage.history_links import give_children_their_rows, linked_message
from storage.models import (
    Interaction,
    InteractionStatus,
    Message,
    SessionChanged,
    Turn,
    TurnChanged,
    TurnPhase,
    TurnTail,
)
from storage.rows import (
    INTERACTION_COLUMNS,
    INTERACTIONS_SQL,
    MESSAGE_COLUMNS,
    TURN_BY_ID_SQL,
    TURN_COLUMNS,
    hydrate_turns,
    insert_message,
    interaction_from_row,
    message_from_row,
    next_position,
    opened_order,
    require_live_session,
    require_mapping,
    require_text,
    turn_from_row,
    turn_history_rows,
    turn_row,
)
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Row, Tx, dumps


@dataclass(frozen=True, slots=True)
class TimelinePage:
    """A page of the timeline as the wire reads it: each Turn's row (`TURN_COLUMNS`), its
    Messages' rows (`MESSAGE_COLUMNS` first, presentation order) and its Interactions, by
    Turn id — the Turns and Messages `timeline` builds, left as rows: the wire's maps are
    built from them with no `Turn` or `Message` value between."""

    turn_rows: tuple[Row, ...]
    """In sequence order."""
    message_rows: Mapping[str, Sequence[Row]]
    interactions: Mapping[str, Sequence[Interaction]]
    next_sequence: int | None


class HistoryStore:
    """Messages, Interactions, the timeline, and the read snapshot of the events publisher."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._read = db.read

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
            require_live_session(tx.conn, ws, sid)
            if turn_id is not None:
                turn_row(tx, ws, sid, turn_id)
            if message_id is not None:
                existing = tx.one(
                    f"SELECT turn_id, position FROM messages WHERE session_key = {SESSION_KEY_OF}"
                    " AND message_id = ?",
                    (ws, sid, message_id),
                )
                linked = (
                    None if existing is not None else linked_message(tx.conn, ws, sid, message_id)
                )
                if linked is not None:
                    # A Message the Session reads through its history link: changed, it becomes
                    # the Session's own row at the same position (the link's row stays frozen).
                    if linked[1] != turn_id:
                        raise Conflict(f"message {message_id} belongs to another turn")
                    give_children_their_rows(tx.conn, ws, sid, linked[6])
                    tx.execute(
                        "INSERT INTO messages (session_key, workspace_id, session_id, message_id,"
                        " turn_id, kind, text, payload_json, version, position, created_at_ms)"
                        f" SELECT {SESSION_KEY_OF}, ?, ?, ?, ?, ?, ?, ?, ?, ?, linked_at_ms"
                        f" FROM history_links WHERE child_key = {SESSION_KEY_OF}",
                        (
                            ws, sid, ws, sid, message_id, turn_id, kind, text, payload_json,
                            linked[5] + 1, linked[6], ws, sid,
                        ),
                    )  # fmt: skip
                    return self._message_after(tx, ws, sid, message_id, turn_id)
                if existing is not None:
                    if existing[0] != turn_id:
                        raise Conflict(f"message {message_id} belongs to another turn")
                    give_children_their_rows(tx.conn, ws, sid, int(existing[1]))
                    tx.execute(
                        "UPDATE messages SET kind = ?, text = ?, payload_json = ?,"
                        f" version = version + 1 WHERE session_key = {SESSION_KEY_OF}"
                        " AND message_id = ?",
                        (kind, text, payload_json, ws, sid, message_id),
                    )
                    return self._message_after(tx, ws, sid, message_id, turn_id)
            message = insert_message(
                tx,
                ws,
                sid,
                turn_id,
                message_id or str(uuid.uuid4()),
                kind,
                text,
                payload_json,
                next_position(tx, ws, sid),
            )
            tx.emit(
                TurnChanged(ws, sid, turn_id) if turn_id is not None else SessionChanged(ws, sid)
            )
            return message

    def _message_after(
        self, tx: Tx, ws: str, sid: str, message_id: str, turn_id: str | None
    ) -> Message:
        row = tx.one(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = {SESSION_KEY_OF}"
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
            require_live_session(tx.conn, ws, sid)
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
        self,
        ws: str,
        sid: str,
        turn_id: str,
        request_id: str,
        output: Mapping[str, Any],
        *,
        delivered: bool = False,
    ) -> Interaction:
        """Record the answer to a pending Interaction. `delivered`: the provider has taken
        this answer (its worker said so), so an Interaction the Turn's settlement superseded
        meanwhile is resolved all the same: the provider's end of the Turn can overtake the
        worker's reply to the answer that let the Turn end."""
        output_json = dumps(dict(require_mapping("response", output)))
        with self._write(ws, fence=sid) as tx:
            require_live_session(tx.conn, ws, sid)
            row = tx.one(
                "SELECT interaction_id, status FROM interactions WHERE workspace_id = ?"
                " AND session_id = ? AND turn_id = ? AND request_id = ?",
                (ws, sid, turn_id, request_id),
            )
            if row is None:
                raise InteractionNotFound(f"interaction {request_id} not found in turn {turn_id}")
            superseded_but_delivered = delivered and row[1] == InteractionStatus.SUPERSEDED
            if row[1] != InteractionStatus.PENDING and not superseded_but_delivered:
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
            require_live_session(conn, ws, sid)
            rows = self._page_rows(conn, ws, sid, after_sequence, limit)
            turns = hydrate_turns(conn, ws, sid, rows[:limit])
        next_sequence = turns[-1].sequence if len(rows) > limit else None
        return turns, next_sequence

    def timeline_page(
        self,
        ws: str,
        sid: str,
        *,
        after_sequence: int = 0,
        limit: int = 100,
        max_chars: int | None = None,
    ) -> TimelinePage:
        """`timeline`'s page with each Turn and its Messages as rows (`session.timeline`
        projects them onto the wire straight from the rows: a `Message` or `Turn` value per
        row was most of the read's Python).

        `max_chars`: the page ends before the Turn that would take its stored text past it —
        never before the first, so paging always moves on — and `next_sequence` continues from
        there (`_bounded_history`)."""
        if not 1 <= limit <= 100_000:
            raise InvalidArgument("limit", "limit must be between 1 and 100000")
        with self._read() as conn:
            require_live_session(conn, ws, sid)
            rows = self._page_rows(conn, ws, sid, after_sequence, limit)
            page = rows[:limit]
            if max_chars is None:
                messages, interactions = turn_history_rows(conn, ws, sid, page)
                cut = False
            else:
                page, messages, interactions, cut = _bounded_history(conn, ws, sid, page, max_chars)
        next_sequence = int(page[-1][3]) if cut or len(rows) > limit else None
        return TimelinePage(tuple(page), messages, interactions, next_sequence)

    @staticmethod
    def _page_rows(
        conn: apsw.Connection, ws: str, sid: str, after_sequence: int, limit: int
    ) -> list[Row]:
        """The page's Turn rows and one more (its presence says more remain)."""
        return conn.execute(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND sequence > ? ORDER BY sequence LIMIT ?",
            (ws, sid, after_sequence, limit + 1),
        ).fetchall()

    def turn_since(
        self, ws: str, sid: str, turn_id: str, seen: Sequence[tuple[int, int]] | None
    ) -> TurnTail:
        """An active Turn read from its first Message added or changed since `seen`; the whole
        Turn when `seen` is None or the Turn is settled (for the events publisher).

        `seen[i]` = (position, running total of the versions of Messages 0..i) of the Turn's
        Messages as last read. A Message keeps its position for life and its version only
        grows, and a new Message takes a position after every existing one; so Messages
        0..i-1 are unchanged exactly when this Turn has `i` Messages at or before `seen[i-1]`'s
        position and their versions sum to `seen[i-1]`'s total. That test is one aggregate
        statement (one row back); the first changed ordinal is found by galloping back from
        the end (most updates touch the last Messages), and only the Messages from it on are
        fetched. All in one read snapshot, so the cut is exactly the one a whole read and a
        comparison would give.
        """
        with self._read() as conn:
            require_live_session(conn, ws, sid)
            row = conn.execute(TURN_BY_ID_SQL, (ws, sid, turn_id)).fetchone()
            if row is None:
                raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
            if seen is None or row[5] != TurnPhase.ACTIVE:
                whole = hydrate_turns(conn, ws, sid, [row])[0]
                return TurnTail(whole, len(whole.messages), 0)
            start = _first_changed(conn, ws, sid, turn_id, seen)
            after = seen[start - 1][0] if start else None
            messages = [
                message_from_row(r)
                for r in conn.execute(
                    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = {SESSION_KEY_OF}"
                    " AND turn_id = ? AND (? IS NULL OR position > ?)"
                    " ORDER BY position",
                    (ws, sid, turn_id, after, after),
                )
            ]
            interactions = opened_order(
                conn.execute(INTERACTIONS_SQL.format(marks="?"), (ws, sid, turn_id)).fetchall()
            )
        return TurnTail(turn_from_row(row, messages, interactions), start + len(messages), start)


# A byte-bounded timeline page reads its Turns' history in runs, in sequence order: the first
# run holds up to FIRST_RUN Turns (a page of the default 100 is one run, its statements those
# of an unbounded read), each next run as many as the budget left would hold at the page's
# mean so far (at least one), so Turns far past the budget are not read only to be cut. A
# Turn's size is the length of its stored text: Messages' text and payload JSON, Interactions'
# input and output JSON, the row's binding, error and checkpoint, and a fixed allowance per
# Turn and Message for the ids and numbers the wire adds (characters: what the rows hold, no
# encoding).
FIRST_RUN = 128
TURN_ALLOWANCE = 512
MESSAGE_ALLOWANCE = 160


def _bounded_history(
    conn: apsw.Connection, ws: str, sid: str, page: list[Row], max_chars: int
) -> tuple[list[Row], dict[str, list[Row]], dict[str, list[Interaction]], bool]:
    """`page`'s first Turns whose text fits `max_chars` (never fewer than one), their Message
    rows and Interactions, and whether the page was cut."""
    messages: dict[str, list[Row]] = {}
    interactions: dict[str, list[Interaction]] = {}
    fit, total, run = 0, 0, min(len(page), FIRST_RUN)
    while fit < len(page):
        chunk = page[fit : fit + run]
        chars: dict[str, int] = {}
        found, asked = turn_history_rows(conn, ws, sid, chunk, chars)
        messages.update(found)
        interactions.update(asked)
        for r in chunk:
            tid = r[2]
            total += (
                TURN_ALLOWANCE
                + chars.get(tid, 0)
                + len(r[8] or "")
                + len(r[10] or "")
                + len(r[13] or "")
            )
            for m in found[tid]:
                total += MESSAGE_ALLOWANCE + len(m[3] or "") + len(m[4] or "")
            if fit and total > max_chars:
                return page[:fit], messages, interactions, True
            fit += 1
        run = max(1, (max_chars - total) * fit // total + 1)
    return page, messages, interactions, False


def _first_changed(
    conn: apsw.Connection, ws: str, sid: str, turn_id: str, seen: Sequence[tuple[int, int]]
) -> int:
    """The ordinal of the Turn's first Message not as in `seen` (`len(seen)`: none)."""

    def unchanged_before(i: int) -> bool:  # Messages 0..i-1 are as seen
        if i == 0:
            return True
        position, total = seen[i - 1]
        row = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(version), 0) FROM messages"
            f" WHERE session_key = {SESSION_KEY_OF} AND turn_id = ? AND position <= ?",
            (ws, sid, turn_id, position),
        ).fetchone()
        return row is not None and (int(row[0]), int(row[1])) == (i, total)

    # Gallop back from the end to a prefix known unchanged, then bisect the gap.
    high = len(seen)
    if unchanged_before(high):
        return high
    step = 1
    while True:
        low = max(high - step, 0)
        if unchanged_before(low):
            break
        high, step = low, step * 2
    # unchanged_before(low) and not unchanged_before(high): the answer is in [low, high).
    while high - low > 1:
        middle = (low + high) // 2
        if unchanged_before(middle):
            low = middle
        else:
            high = middle
    return low
