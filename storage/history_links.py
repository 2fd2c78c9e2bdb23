"""A fork child's history read from its source's rows: the durable link, the visible rows it
names, and the rows a change of a linked Message first gives each child that links it.

A child committed with a link (schema v12, `history_links`) holds no copy of its boundary's
Messages. Its visible history is, position by position, its own row where it has one, else the
row its source shows at that position (the source's own, or — a source that is itself a linked
child — its source's, and so on), as long as the position is at or below the link's
`through_position` and the row's Turn at or below its `through_sequence`; each linked row is
seen with the ids identity rule v2 gives it in the child (the child's Message prefix and the
position, its Turn prefix and the Turn's sequence: the Turn ids the child's cloned Turns have)
and `created_at_ms` the link's time. That is, column for column, the row the copy of the same
fork would have written (docs/design/store.md, "The history link").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import apsw

from storage.fork_child import ordinal_id, ordinal_id_sql, ordinal_seed
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Row


@dataclass(frozen=True, slots=True)
class LinkLevel:
    """One Session whose rows a child reads: the rows at or below `through_position` of its
    Turns at or below `through_sequence` (the tightest bounds of the links on the way)."""

    workspace_id: str
    session_id: str
    key: int
    through_sequence: int
    through_position: int


@dataclass(frozen=True, slots=True)
class HistoryLink:
    """A child's link: its ids' prefixes, the link's time and the Sessions it reads, nearest
    first (the source; the source's source when the source is a linked child; ...)."""

    child_key: int
    message_prefix: str
    turn_prefix: str
    linked_at_ms: int
    levels: tuple[LinkLevel, ...]

    @property
    def through_sequence(self) -> int:
        return self.levels[0].through_sequence

    @property
    def through_position(self) -> int:
        return self.levels[0].through_position

    def message_id(self, position: int) -> str:
        return ordinal_id(self.message_prefix, position)

    def turn_id(self, sequence: int) -> str:
        return ordinal_id(self.turn_prefix, sequence)

    def position_of(self, message_id: str) -> int | None:
        """The position a linked Message id names (rule v2 ends it with the position), or None
        when the id is not one of this link's."""
        if len(message_id) != 36 or message_id[8:24] != self.message_prefix[8:]:
            return None
        try:
            position = int(message_id[24:], 16)
        except ValueError:
            return None
        return position if self.message_id(position) == message_id else None


_LINK_SQL = (
    "SELECT l.child_key, l.source_key, l.through_sequence, l.through_position, l.message_prefix,"
    " l.turn_prefix, l.linked_at_ms, k.workspace_id, k.session_id FROM history_links l"
    " JOIN session_keys k ON k.session_key = l.source_key WHERE l.child_key = {key}"
)


def history_link(conn: apsw.Connection, ws: str, sid: str) -> HistoryLink | None:
    """The link of Session `(ws, sid)`, its chain resolved; None for a Session with no link
    (every Session that is not a linked fork child: one index probe)."""
    row = conn.execute(_LINK_SQL.format(key=SESSION_KEY_OF), (ws, sid)).fetchone()
    return None if row is None else _resolve(conn, row)


def history_link_of_key(conn: apsw.Connection, key: int) -> HistoryLink | None:
    row = conn.execute(_LINK_SQL.format(key="?"), (key,)).fetchone()
    return None if row is None else _resolve(conn, row)


def _resolve(conn: apsw.Connection, row: Row) -> HistoryLink:
    child_key, message_prefix, turn_prefix, linked_at_ms = row[0], row[4], row[5], row[6]
    levels: list[LinkLevel] = []
    seen = {int(child_key)}
    through_sequence, through_position = int(row[2]), int(row[3])
    at: Row | None = row
    while at is not None:
        row = at
        key = int(row[1])
        if key in seen:  # a cycle cannot be committed (a child is new); refuse to loop on one
            raise apsw.ConstraintError(f"history link cycle through session key {key}")
        seen.add(key)
        through_sequence = min(through_sequence, int(row[2]))
        through_position = min(through_position, int(row[3]))
        levels.append(LinkLevel(row[7], row[8], key, through_sequence, through_position))
        at = conn.execute(_LINK_SQL.format(key="?"), (key,)).fetchone()
    return HistoryLink(
        int(child_key), str(message_prefix), str(turn_prefix), int(linked_at_ms), tuple(levels)
    )


# A Session's own Messages of Turns through a sequence (and at or below a position), each with its
# Turn's sequence: `?1` workspace, `?2` Session, `?3` its key, `?4` the sequence, `?5` the
# position; `{turns}` narrows to some sequences. Turns first (`CROSS JOIN` keeps that order),
# then each one's Messages by `messages_by_turn` (the `+` keeps SQLite off the position key,
# which would walk every Message of the Session below the bound for a page of 50 Turns).
_LEVEL_SQL = (
    "SELECT m.position, t.sequence, m.message_id, m.turn_id, m.kind, m.text, m.payload_json,"
    " m.version FROM turns t CROSS JOIN messages m ON m.session_key = ?3"
    " AND m.turn_id = t.turn_id"
    " WHERE t.workspace_id = ?1 AND t.session_id = ?2 AND t.sequence <= ?4{turns}"
    " AND +m.position <= ?5"
)

VisibleRow = tuple[str, str, str, str | None, str, int, int, int]
"""(message_id, turn_id, kind, text, payload_json, version, position, Turn sequence): a
`MESSAGE_COLUMNS` row and its Turn's sequence, with the ids the reading Session sees."""


# The same rows as the reading child sees them: its ids derived by SQLite (rule v2, `?6`/`?7`
# its Message prefix split, `?8`/`?9` its Turn prefix), in (Turn, position) order.
_LINKED_SQL = (
    f"SELECT {ordinal_id_sql('?6', '?7', 'm.position')},"
    f" {ordinal_id_sql('?8', '?9', 't.sequence')},"
    " m.kind, m.text, m.payload_json, m.version, m.position, t.sequence"
    " FROM turns t CROSS JOIN messages m ON m.session_key = ?3 AND m.turn_id = t.turn_id"
    " WHERE t.workspace_id = ?1 AND t.session_id = ?2 AND t.sequence <= ?4{turns}"
    " AND +m.position <= ?5 ORDER BY t.sequence, m.position"
)


def linked_rows(
    conn: apsw.Connection,
    link: HistoryLink,
    *,
    sequences: Sequence[int] | None = None,
    positions: set[int] | None = None,
) -> list[VisibleRow]:
    """The rows a child reads through its link (not its own), with the child's ids: those of
    the Turns `sequences` (all of the boundary when None), skipping `positions` (the child's
    own rows there win; the set is extended with every position returned). In (Turn, position)
    order for a link of one level; a chain's levels follow each other."""
    taken: set[int] = set() if positions is None else positions
    out: list[VisibleRow] = []
    seqs = None if sequences is None else [s for s in sequences if s <= link.through_sequence]
    if seqs is not None and not seqs:
        return out
    turns = "" if seqs is None else f" AND t.sequence IN ({','.join(str(int(s)) for s in seqs)})"
    sql = _LINKED_SQL.format(turns=turns)
    prefixes = (
        ordinal_seed(link.message_prefix), link.message_prefix[8:],
        ordinal_seed(link.turn_prefix), link.turn_prefix[8:],
    )  # fmt: skip
    for level in link.levels:
        args = (level.workspace_id, level.session_id, level.key)
        bounds = (level.through_sequence, level.through_position)
        rows = cast(list[VisibleRow], conn.execute(sql, (*args, *bounds, *prefixes)).fetchall())
        if not taken:
            out.extend(rows)
            taken.update(r[6] for r in rows)
            continue
        for row in rows:
            if row[6] not in taken:
                taken.add(row[6])
                out.append(row)
    return out


def visible_rows(conn: apsw.Connection, ws: str, sid: str, through: int) -> list[VisibleRow]:
    """Every Message Session `(ws, sid)` shows of its Turns 1..`through` (its own and, for a
    linked child, the linked ones), in position order."""
    key = conn.execute(SESSION_KEY_OF[1:-1], (ws, sid)).fetchone()
    if key is None:
        return []
    own: list[VisibleRow] = [
        (r[2], r[3], r[4], r[5], r[6], r[7], r[0], r[1])
        for r in conn.execute(_LEVEL_SQL.format(turns=""), (ws, sid, int(key[0]), through, 1 << 62))
    ]
    link = history_link(conn, ws, sid)
    if link is not None:
        taken = {r[6] for r in own}
        own.extend(r for r in linked_rows(conn, link, positions=taken) if r[7] <= through)
    own.sort(key=lambda r: r[6])
    return own


def visible_row_at(conn: apsw.Connection, ws: str, sid: str, position: int) -> VisibleRow | None:
    """The Message Session `(ws, sid)` shows at `position` (of a Turn), or None."""
    key = conn.execute(SESSION_KEY_OF[1:-1], (ws, sid)).fetchone()
    if key is None:
        return None
    own = conn.execute(
        "SELECT m.message_id, m.turn_id, m.kind, m.text, m.payload_json, m.version, m.position,"
        " t.sequence FROM messages m JOIN turns t ON t.workspace_id = m.workspace_id"
        " AND t.session_id = m.session_id AND t.turn_id = m.turn_id"
        " WHERE m.session_key = ? AND m.position = ?",
        (int(key[0]), position),
    ).fetchone()
    if own is not None:
        return (own[0], own[1], own[2], own[3], own[4], own[5], own[6], own[7])
    link = history_link(conn, ws, sid)
    if link is None or position > link.through_position:
        return None
    for level in link.levels:
        if position > level.through_position:
            break
        r = conn.execute(
            "SELECT m.kind, m.text, m.payload_json, m.version, t.sequence FROM messages m"
            " JOIN turns t ON t.workspace_id = m.workspace_id AND t.session_id = m.session_id"
            " AND t.turn_id = m.turn_id WHERE m.session_key = ? AND m.position = ?",
            (level.key, position),
        ).fetchone()
        if r is not None:
            if int(r[4]) > level.through_sequence:
                return None
            return (
                link.message_id(position), link.turn_id(int(r[4])),
                r[0], r[1], r[2], int(r[3]), position, int(r[4]),
            )  # fmt: skip
    return None


def linked_message(conn: apsw.Connection, ws: str, sid: str, message_id: str) -> VisibleRow | None:
    """The linked (not own) Message `message_id` Session `(ws, sid)` shows, or None."""
    link = history_link(conn, ws, sid)
    if link is None:
        return None
    position = link.position_of(message_id)
    if position is None or position > link.through_position:
        return None
    row = visible_row_at(conn, ws, sid, position)
    return row if row is not None and row[0] == message_id else None


def give_children_their_rows(conn: apsw.Connection, ws: str, sid: str, position: int) -> int:
    """Before Session `(ws, sid)`'s Message at `position` changes: every child whose link reads
    it gets it as its own row (as it shows it now, with the child's ids), so the child's history
    stays what it was (the triggers of schema v12 refuse the change otherwise). Returns how many
    rows were written."""
    # One statement, nearly always answering no row (a Session nothing links to).
    children = conn.execute(
        "SELECT l.child_key, l.through_sequence, l.message_prefix, l.turn_prefix,"
        " l.linked_at_ms, k.workspace_id, k.session_id FROM history_links l"
        " JOIN session_keys k ON k.session_key = l.child_key"
        f" WHERE l.source_key = {SESSION_KEY_OF} AND l.through_position >= ?"
        " AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.session_key = l.child_key"
        " AND c.position = ?)",
        (ws, sid, position, position),
    ).fetchall()
    if not children:
        return 0
    row = visible_row_at(conn, ws, sid, position)
    if row is None:
        return 0
    _, _, kind, text, payload, version, _, sequence = row
    written = 0
    for child_key, through_sequence, message_prefix, turn_prefix, at_ms, cws, csid in children:
        if sequence > int(str(through_sequence)):
            continue
        conn.execute(
            "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
            " payload_json, version, position, created_at_ms, session_key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                cws, csid, ordinal_id(str(message_prefix), position),
                ordinal_id(str(turn_prefix), sequence),
                kind, text, payload, version, position, at_ms, child_key,
            ),
        )  # fmt: skip
        written += 1
    return written
