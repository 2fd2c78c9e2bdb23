"""A fork child's history read through a link to its source's rows: the durable link, the
visible rows it names, the rows a change of a linked Message first gives each child that links
it, and the fork's side of it (snapshot version 4): the boundary checked over only the Messages
a check concerns, the history digest, the fence's witness, and the link the commit writes.

The link. A child committed with a link (schema v12, `history_links`) holds no copy of its
boundary's Messages. Its visible history is, position by position, its own row where it has one,
else the row its source shows at that position (the source's own, or — a source that is itself
a linked child — its source's, and so on), as long as the position is at or below the link's
`through_position` and the row's Turn at or below its `through_sequence`; each linked row is
seen with the ids identity rule v2 gives it in the child (the child's Message prefix and the
position, its Turn prefix and the Turn's sequence: the Turn ids the child's cloned Turns have)
and `created_at_ms` the link's time. That is, column for column, the row the copy of the same
fork would have written (docs/design/store.md, "The history link").

The fork's side. A boundary's Messages are most of a fork's rows (ten per Turn in a typical
history) and nearly all of them are plain: an empty payload, nothing to check, nothing to
rewrite. Prepare does not read them into Python: it checks the boundary with one query that
returns only the Messages a check or a rewrite concerns (a descendant lane, a non-empty
payload), and freezes the rest as their count and a SHA-256 computed over their columns as
SQLite concatenates them (`history_digest`), and writes the fence's witness (schema v13: a row
in which SQLite counts every change of the source's history). The commit reads the witness;
when it counted a change (or cannot vouch) the commit recomputes that digest in its own
transaction — any Message added, removed or changed in the boundary since prepare (which the
source fence forbids every store path to do) fails the commit closed, `ForkSnapshotCorrupt`,
exactly like a snapshot that no longer matches its hash — and then links the child to the
boundary: one row, the child reads the source's Messages with the ids identity rule v2 derives
from each row's position (storage/fork_child.py), so nothing is copied. The few payloads that
hold allowlisted references are rewritten at prepare and frozen in the snapshot; the commit
writes them as the child's own rows, which win over the linked ones. A source that is itself a
linked child is checked, digested and linked through its visible rows (its own and its linked
ones).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import apsw

from domain.errors import ForkBoundaryError, ForkBoundaryReason, ForkSnapshotCorrupt
from storage.fork_child import (
    REFERENCE_KEYS,
    T_INTERACTIONS,
    IdentityMap,
    OrdinalPrefixes,
    TurnArray,
    ordinal_id,
    ordinal_id_sql,
    ordinal_identity,
    ordinal_seed,
    reject_duplicate_keys,
    remap_references,
)
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Row, dumps

# -- The link and the rows it shows ----------------------------------------------------------------


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


# -- The fork's side -------------------------------------------------------------------------------

# Message markers that the boundary must not contain (seed 000 §4, both fail closed).
DESCENDANT_LANE_KIND = "descendant_lane"
DESCENDANT_LANE_KEY = "descendantLane"
ATTACHMENTS_KEY = "attachments"
SESSION_LOCAL_SCOPE = "session_local"

# The boundary's Messages: those of the source's Turns through sequence ?3 (a Message of no Turn
# is not part of any Turn's history). ?1 workspace, ?2 Session.
_BOUNDARY = (
    " FROM messages m JOIN turns t ON t.workspace_id = ?1 AND t.session_id = ?2"
    " AND t.turn_id = m.turn_id"
    " WHERE m.session_key = (SELECT session_key FROM session_keys WHERE workspace_id = ?1"
    " AND session_id = ?2) AND t.sequence <= ?3"
)

# Every column the child copies, in position order, one line per Message; each text with its
# byte length in front, so no two different rows print alike. `octet_length` reads the stored
# size (no scan); one `concat` per row (its result sized once, where `printf` grew its buffer
# by reallocations and a chain of `||` made an intermediate string per operator). The bytes are
# those `printf('%d,%d,%s,%s,%s,%d:%s,%d:%s', …)` printed (a NULL text is '' to both), so the
# digests frozen by builds that printed them are re-proved alike.
# The order: the subquery's ORDER BY, served by the (session_key, position) key — the `+` keeps
# the Turn list from choosing the by-Turn index — so no sorter runs. SQLite never flattens a
# subquery with an ORDER BY into an aggregate; it feeds its rows to `group_concat` in that order
# (an `ORDER BY` inside `group_concat` would sort all of them again: twice the CPU). `{cut}`
# says which Messages are the boundary's, `{extra}`/`{inner}` what else one pass collects.
_DIGEST_TEMPLATE = (
    "SELECT count(*), CAST(group_concat(r, char(10)) AS BLOB), max(p){extra} FROM (SELECT"
    " concat(m.position, ',', m.version, ',', m.turn_id, ',', m.message_id, ',', m.kind, ',',"
    " ifnull(octet_length(m.text), -1), ':', m.text, ',', octet_length(m.payload_json), ':',"
    " m.payload_json) AS r, m.position AS p{inner}"
    " FROM messages m WHERE m.session_key = (SELECT session_key FROM session_keys"
    " WHERE workspace_id = ?1 AND session_id = ?2) AND {cut} ORDER BY m.position)"
)
# The boundary's Messages: those of the Turns through sequence ?3, looked up once as a list...
_THROUGH_CUT = (
    "+m.turn_id IN (SELECT turn_id FROM turns WHERE workspace_id = ?1 AND session_id = ?2"
    " AND sequence <= ?3)"
)
# ... or, when Turn ?3 is the Session's last (a fork of the whole history, the usual case), every
# Message of a Turn: the same rows (a Message's Turn is one of its Session's, a foreign key)
# without a lookup in that list per Message (~30 % of the statement at 10,000 Messages).
_WHOLE_CUT = "+m.turn_id IS NOT NULL"
_LATER_TURN_SQL = (
    "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ? AND sequence > ? LIMIT 1"
)


def _digest_statement(
    conn: apsw.Connection, ws: str, sid: str, through: int, *, scan: bool, later: bool | None = None
) -> tuple[str, tuple[str | int, ...]]:
    """The digest statement of the boundary through Turn `through` and its parameters; `scan`:
    it also collects the positions of the Messages prepare must look at — a descendant lane, or
    a payload other than the empty map — in the same pass over the rows. `later`: whether the
    Session has Turns after `through` (asked here when None)."""
    if later is None:
        later = later_turns(conn, ws, sid, through)
    sql = _DIGEST_TEMPLATE.format(
        cut=_THROUGH_CUT if later else _WHOLE_CUT,
        extra=", group_concat(p) FILTER (WHERE s)" if scan else "",
        inner=(
            f", (m.payload_json != '{{}}' OR m.kind = '{DESCENDANT_LANE_KIND}') AS s"
            if scan
            else ""
        ),
    )
    return sql, (ws, sid, through) if later else (ws, sid)


# The Messages prepare must look at: a descendant lane, or a payload other than the empty map —
# read in one walk of the boundary when they are many...
_SPECIAL_SCAN_SQL = (
    "SELECT m.message_id, m.position, m.kind, m.payload_json"
    + _BOUNDARY
    + f" AND (m.payload_json != '{{}}' OR m.kind = '{DESCENDANT_LANE_KIND}') ORDER BY m.position"
)
# ... and, when they are few (the usual history: nearly every payload empty), by the positions
# the digest's pass found (integers SQLite printed), one key lookup each.
FEW_SPECIAL = 8
"""At most one Message in this many looked up by position; more, and one walk reads them."""
_SPECIAL_SQL = (
    "SELECT message_id, position, kind, payload_json FROM messages WHERE session_key = (SELECT"
    " session_key FROM session_keys WHERE workspace_id = ? AND session_id = ?)"
    " AND position IN ({positions}) ORDER BY position"
)

# A Message of the boundary by its source id: its position (what its child id is made of).
_POSITION_SQL = "SELECT m.position" + _BOUNDARY + " AND m.message_id = ?4"


@dataclass(frozen=True, slots=True)
class HistoryScan:
    """What prepare learnt of the boundary's Messages without reading them all: their count and
    digest, and the (source id, position, parsed payload) of each non-empty payload."""

    through: int
    count: int
    digest: str
    payloads: tuple[tuple[str, int, Any], ...]
    top: int = 0
    """The boundary's highest position (0 for none): the history link's bound."""
    linked: bool = False
    """Whether the Session is a linked fork child (it has a history link): read once here, for
    the rest of the prepare (`_place_finals`, `BoundaryMessageIds`)."""


def history_digest(conn: apsw.Connection, ws: str, sid: str, through: int) -> tuple[int, str]:
    """(count, SHA-256 hex) of the boundary's Messages through Turn sequence `through`."""
    count, digest, _ = boundary_proof(conn, ws, sid, through)
    return count, digest


def boundary_proof(conn: apsw.Connection, ws: str, sid: str, through: int) -> tuple[int, str, int]:
    """(count, SHA-256 hex, highest position, 0 for none) of the Messages Session `(ws, sid)`
    shows of its Turns through sequence `through`: its own rows in SQLite, or — a linked child —
    its visible rows, digested in Python line for line as SQLite prints them."""
    if history_link(conn, ws, sid) is not None:
        rows = visible_rows(conn, ws, sid, through)
        joined = "\n".join(_digest_line(r) for r in rows).encode()
        return len(rows), hashlib.sha256(joined).hexdigest(), rows[-1][6] if rows else 0
    count, digest, top, _ = _digest_pass(conn, ws, sid, through, scan=False)
    return count, digest, top


def _digest_pass(
    conn: apsw.Connection, ws: str, sid: str, through: int, *, scan: bool, later: bool | None = None
) -> tuple[int, str, int, list[int]]:
    """One pass of SQLite over a Session's own boundary rows: (count, SHA-256 hex, highest
    position, and with `scan` the positions of the Messages prepare must look at)."""
    sql, params = _digest_statement(conn, ws, sid, through, scan=scan, later=later)
    row = conn.execute(sql, params).fetchone()
    assert row is not None  # an aggregate always answers one row
    count, joined_sql, top = row[0], row[1], row[2]
    digest = hashlib.sha256(b"" if joined_sql is None else bytes(joined_sql)).hexdigest()
    special = [int(p) for p in str(row[3]).split(",")] if scan and row[3] is not None else []
    return int(count), digest, int(top or 0), special


def digest_pass(
    conn: apsw.Connection, ws: str, sid: str, through: int
) -> tuple[int, str, int, list[int]]:
    """A fresh pass over a Session's own boundary rows (count, digest, highest position, the
    positions prepare looks at): what a kept digest must equal (the invariant checker's)."""
    return _digest_pass(conn, ws, sid, through, scan=True)


def _digest_line(r: VisibleRow) -> str:
    message_id, turn_id, kind, text, payload, version, position, _ = r
    body = "-1:" if text is None else f"{len(text.encode())}:{text}"
    tail = f"{len(payload.encode())}:{payload}"
    return f"{position},{version},{turn_id},{message_id},{kind},{body},{tail}"


def scan_history(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    through: int,
    *,
    keep: bool = False,
    later: bool | None = None,
    session_key: int | None = None,
) -> HistoryScan:
    """The boundary's Message checks (seed 000 §4: no descendant lane, no session-local
    attachment; a payload with a repeated key is refused), in position order, reading only the
    Messages they concern; then the count and digest frozen for the commit.

    `keep` (prepare, inside its write transaction): a Session's own boundary is digested only
    when no kept digest of it stands (schema v17, `kept_digest`), and one digested is kept.
    `later`: whether the Session has Turns after `through` (asked here when None).
    `session_key`: the Session's key when the caller read it in this transaction (looked up
    here when None)."""
    payloads: list[tuple[str, int, Any]] = []
    linked = history_link(conn, ws, sid) is not None
    if not linked:
        # One pass: the digest, and where the Messages to look at are — or the digest a
        # previous prepare kept, which SQLite deletes at the first change it did not see.
        found: tuple[int, str, int, list[int] | None]
        if later is None:
            later = later_turns(conn, ws, sid, through)
        if keep:
            found = kept_digest(conn, ws, sid, through, later=later, session_key=session_key)
        else:
            found = _few_special(*_digest_pass(conn, ws, sid, through, scan=True, later=later))
        count, digest, top, special = found
        if special is not None:
            rows = _rows_at(conn, ws, sid, special)
        else:
            rows = [
                (str(r[0]), int(r[1]), str(r[2]), str(r[3]))
                for r in conn.execute(_SPECIAL_SCAN_SQL, (ws, sid, through))
            ]
    else:
        count, digest, top = boundary_proof(conn, ws, sid, through)
        rows = _special_rows(conn, ws, sid, through)
    for message_id, position, kind, payload_json in rows:
        if kind == DESCENDANT_LANE_KIND:
            raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
        payload = json.loads(payload_json, object_pairs_hook=reject_duplicate_keys)
        refuse_boundary_payload(payload)
        payloads.append((str(message_id), int(position), payload))
    return HistoryScan(
        through=through,
        count=count,
        digest=digest,
        payloads=tuple(payloads),
        top=top,
        linked=linked,
    )


# The kept digest (schema v17) of the Session with key ?1 through Turn ?2 (and whether the Session
# had later Turns then). Two plain key lookups: one statement joining them to the Session's ids
# SQLite re-planned at every execution (its plan depends on the bound values).
_KEY_SQL = SESSION_KEY_OF[1:-1]
_KEPT_SQL = (
    "SELECT later, count, digest, top, special FROM history_digests"
    " WHERE session_key = ? AND through = ?"
)
_KEEP_SQL = (
    "INSERT OR REPLACE INTO history_digests (session_key, through, later, count, digest, top,"
    " special) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def later_turns(conn: apsw.Connection, ws: str, sid: str, through: int) -> bool:
    """Whether Session `(ws, sid)` has Turns after sequence `through`."""
    return conn.execute(_LATER_TURN_SQL, (ws, sid, through)).fetchone() is not None


def _few_special(
    count: int, digest: str, top: int, special: list[int]
) -> tuple[int, str, int, list[int] | None]:
    """A digest pass's answer with its special positions, or None for them when they are too many
    to look up one by one (one walk of the boundary reads them)."""
    return count, digest, top, special if len(special) * FEW_SPECIAL <= count else None


_MANY = "*"
"""A kept row's `special` when the positions were too many to keep: prepare walks for them."""


def kept_digest(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    through: int,
    *,
    later: bool,
    session_key: int | None = None,
) -> tuple[int, str, int, list[int] | None]:
    """`_digest_pass(scan=True)` of a Session's own boundary through Turn `through` (the special
    positions None when they are too many to look up one by one; `later`: whether the Session
    has Turns after it), from the row a previous prepare kept when it stands (it stands only
    while no Message of the Session, no Turn's identity and no `session_keys` row of it changed
    since: the triggers of schema v17 delete it in the writer's transaction), else digested and
    kept in the caller's transaction (a prepare that rolls back takes it with it). Law: a kept
    row is the pass it saves (tests/support/invariants.py, `history_digest_kept`).
    `session_key`: the Session's key as the caller read it in this transaction (else read here)."""
    key: Any = (session_key,)
    if session_key is None:
        key = conn.execute(_KEY_SQL, (ws, sid)).fetchone()
    if key is None:  # no key: no Message either; nothing to keep
        return _few_special(*_digest_pass(conn, ws, sid, through, scan=True, later=later))
    row = conn.execute(_KEPT_SQL, (int(key[0]), through)).fetchone()
    if row is not None and bool(row[0]) == later:
        text = str(row[4])
        special = None if text == _MANY else [int(p) for p in text.split(",")] if text else []
        return int(row[1]), str(row[2]), int(row[3]), special
    found = _few_special(*_digest_pass(conn, ws, sid, through, scan=True, later=later))
    count, digest, top, few = found
    kept = _MANY if few is None else ",".join(str(p) for p in few)
    conn.execute(_KEEP_SQL, (int(key[0]), through, int(later), count, digest, top, kept))
    return found


def _rows_at(
    conn: apsw.Connection, ws: str, sid: str, positions: list[int]
) -> list[tuple[str, int, str, str]]:
    """(message id, position, kind, payload) of a Session's own Messages at `positions`."""
    if not positions:
        return []
    sql = _SPECIAL_SQL.format(positions=",".join(str(int(p)) for p in positions))
    return [(str(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in conn.execute(sql, (ws, sid))]


def _special_rows(
    conn: apsw.Connection, ws: str, sid: str, through: int
) -> list[tuple[str, int, str, str]]:
    """(message id, position, kind, payload) of a linked child's visible boundary lanes and
    non-empty payloads."""
    return [
        (r[0], r[6], r[2], r[4])
        for r in visible_rows(conn, ws, sid, through)
        if r[4] != "{}" or r[2] == DESCENDANT_LANE_KIND
    ]


def refuse_boundary_payload(payload: Any) -> None:
    """Raise the `ForkBoundaryError` a boundary Message's parsed payload calls for: a
    descendant lane's marker, or an attachment local to its Session (a parsed JSON object is a
    plain dict, so no ABC check per Message)."""
    if type(payload) is dict and payload:
        if payload.get(DESCENDANT_LANE_KEY):
            raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
        if has_session_local_attachment(payload):
            raise ForkBoundaryError(ForkBoundaryReason.SESSION_LOCAL_ATTACHMENT_IN_BOUNDARY)


def has_session_local_attachment(payload: Any) -> bool:
    if not isinstance(payload, Mapping):
        return False
    attachments = payload.get(ATTACHMENTS_KEY)
    if not isinstance(attachments, list):
        return False
    return any(
        isinstance(a, Mapping) and a.get("scope") == SESSION_LOCAL_SCOPE for a in attachments
    )


class BoundaryMessageIds(Mapping[str, str]):
    """source Message id → rule v2 child id for the Messages of the boundary, looked up in
    SQLite one at a time (only the ids a payload or a Turn refers to are ever asked for); the
    ids found are `found`, frozen into the snapshot for the commit."""

    def __init__(
        self, conn: apsw.Connection, ws: str, sid: str, through: int, prefix: str, *, linked: bool
    ) -> None:
        self._conn = conn
        self._args = (ws, sid, through)
        self._prefix = prefix
        self._linked = linked  # whether `(ws, sid)` has a history link (`HistoryScan.linked`)
        self.found: dict[str, str] = {}
        self._missing: set[str] = set()

    def _lookup(self, source_id: str) -> str | None:
        if source_id in self.found:
            return self.found[source_id]
        if source_id in self._missing:
            return None
        position = self._position(source_id)
        if position is None:
            self._missing.add(source_id)
            return None
        child = ordinal_id(self._prefix, position)
        self.found[source_id] = child
        return child

    def _position(self, source_id: str) -> int | None:
        row = self._conn.execute(_POSITION_SQL, (*self._args, source_id)).fetchone()
        if row is not None:
            return int(row[0])
        if not self._linked:
            return None
        ws, sid, through = self._args
        linked = linked_message(self._conn, ws, sid, source_id)
        return None if linked is None or linked[7] > through else linked[6]

    def __getitem__(self, source_id: str) -> str:
        child = self._lookup(source_id) if isinstance(source_id, str) else None
        if child is None:
            raise KeyError(source_id)
        return child

    def __iter__(self) -> Iterator[str]:
        return iter(self.found)

    def __len__(self) -> int:
        return len(self.found)


def link_messages(
    conn: apsw.Connection,
    *,
    ws: str,
    source_session_id: str,
    through: int,
    through_position: int,
    target_session_id: str,
    target_key: int,
    message_prefix: str,
    turn_prefix: str,
    linked_at_ms: int,
    rewritten: tuple[tuple[int, str], ...],
) -> None:
    """Link the child to the source's boundary (one row), then write the payloads prepare
    rewrote as the child's own rows: the source's row at that position, the child's ids, the
    rewritten payload."""
    conn.execute(
        "INSERT INTO history_links (child_key, source_key, through_sequence, through_position,"
        f" message_prefix, turn_prefix, linked_at_ms) VALUES (?, {SESSION_KEY_OF}, ?, ?, ?, ?, ?)",
        (
            target_key, ws, source_session_id, through, through_position, message_prefix,
            turn_prefix, linked_at_ms,
        ),
    )  # fmt: skip
    for position, text in rewritten:
        row = visible_row_at(conn, ws, source_session_id, position)
        if row is None or row[7] > through:
            raise ForkSnapshotCorrupt(f"no boundary Message at rewritten position {position}")
        _, _, kind, body, _, version, _, sequence = row
        conn.execute(
            "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
            " payload_json, version, position, created_at_ms, session_key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                ws, target_session_id, ordinal_id(message_prefix, position),
                ordinal_id(turn_prefix, sequence), kind, body, text, version, position,
                linked_at_ms, target_key,
            ),
        )  # fmt: skip


def history_section(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    scan: HistoryScan,
    *,
    turns: list[TurnArray],
    prefixes: OrdinalPrefixes,
) -> tuple[dict[str, Any], IdentityMap]:
    """The snapshot's `history` (version 4): the boundary's sequence, Message count and digest;
    each payload holding an allowlisted reference rewritten (`[position, JSON text]`, written
    over the copied row by the commit); and the child id of every Message a reference names
    (`message_ids`, what the commit's Interactions are rewritten with). Every non-empty payload
    and every Interaction passes the allowlist here (law 5: refused at prepare, before any
    dispatch), exactly as a version 3 prepare's dry run refused it. With it, the identity map
    the commit builds the child with (`fork_child.child_history` of the frozen document: the
    same prefixes, Turns and `message_ids`), so prepare maps the boundary once."""
    found = BoundaryMessageIds(conn, ws, sid, scan.through, prefixes.message, linked=scan.linked)
    ids = ordinal_identity(prefixes, turns, found)
    rewritten: list[list[Any]] = []
    for message_id, position, payload in scan.payloads:
        remapped = remap_references(payload, ids, where=f"message {message_id}")
        if type(payload) is dict and any(key in REFERENCE_KEYS for key in payload):
            rewritten.append([position, dumps(remapped)])
    for turn in turns:
        for i in turn[T_INTERACTIONS]:
            where = f"interaction {i['interaction_id']}"
            remap_references(i["input"], ids, where=where)
            if i["output"] is not None:
                remap_references(i["output"], ids, where=where)
    return {
        "through": scan.through,
        "count": scan.count,
        "digest": scan.digest,
        "through_position": scan.top,
        "rewritten": rewritten,
        "message_ids": dict(found.found),
    }, IdentityMap(turns=ids.turns, messages=dict(found.found), interactions=ids.interactions)


def fence_history(conn: apsw.Connection, ws: str, sid: str, op_seq: int) -> None:
    """Prepare's witness (schema v13): from now on SQLite counts every change of Session
    `(ws, sid)`'s Messages and of its Turns' identity in the row of operation `op_seq`, whoever
    writes it; the row goes when the operation leaves the active states."""
    conn.execute(
        "INSERT OR REPLACE INTO history_fences (session_key, op_seq, changes)"
        f" VALUES ({SESSION_KEY_OF}, ?, 0)",
        (ws, sid, op_seq),
    )


def fenced_history_unchanged(conn: apsw.Connection, ws: str, sid: str, op_seq: int) -> bool:
    """True when operation `op_seq`'s witness of Session `(ws, sid)` counted no change since
    prepare wrote it and the Session reads no rows through a link of its own (those rows are
    another Session's, which this witness does not watch): one row, whatever the history's size.
    False with no such row (an operation prepared before schema v13), a change counted, or a
    linked source."""
    row = conn.execute(
        "SELECT f.op_seq, f.changes, EXISTS (SELECT 1 FROM history_links l"
        " WHERE l.child_key = f.session_key) FROM history_fences f"
        f" WHERE f.session_key = {SESSION_KEY_OF}",
        (ws, sid),
    ).fetchone()
    return row is not None and int(row[0]) == op_seq and int(row[1]) == 0 and not row[2]
