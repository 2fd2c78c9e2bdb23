"""A fork's Messages kept in SQLite (snapshot version 4), read by the child through a link.

A boundary's Messages are most of a fork's rows (ten per Turn in a typical history) and nearly
all of them are plain: an empty payload, nothing to check, nothing to rewrite. Prepare no longer
reads them into Python: it checks the boundary with one query that returns only the Messages a
check or a rewrite concerns (a descendant lane, a non-empty payload), and freezes the rest as
their count and a SHA-256 computed over their columns as SQLite concatenates them
(`history_digest`), and writes the fence's witness (schema v13: a row in which SQLite counts
every change of the source's history). The commit reads the witness; when it counted a change
(or cannot vouch) the commit recomputes that digest in its own transaction — any Message added,
removed or changed in the boundary since prepare (which the source fence forbids every store
path to do) fails the commit closed, `ForkSnapshotCorrupt`, exactly like a snapshot that no
longer matches its hash — and then links the child to the boundary (storage/history_links.py):
one row, the child reads the source's Messages with the ids identity rule v2 derives from each
row's position (storage/fork_child.py), so nothing is copied. The few payloads that hold
allowlisted references are rewritten at prepare and frozen in the snapshot; the commit writes
them as the child's own rows, which win over the linked ones. A source that is itself a linked
child is checked, digested and linked through its visible rows (its own and its linked ones).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from domain.errors import ForkBoundaryError, ForkBoundaryReason, ForkSnapshotCorrupt
from storage.fork_child import (
    REFERENCE_KEYS,
    IdentityMap,
    OrdinalPrefixes,
    ordinal_id,
    ordinal_identity,
    reject_duplicate_keys,
    remap_references,
)
from storage.history_links import (
    VisibleRow,
    history_link,
    linked_message,
    visible_row_at,
    visible_rows,
)
from storage.schema import SESSION_KEY_OF
from storage.sqlite import dumps

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
    conn: apsw.Connection, ws: str, sid: str, through: int, *, scan: bool
) -> tuple[str, tuple[str | int, ...]]:
    """The digest statement of the boundary through Turn `through` and its parameters; `scan`:
    it also collects the positions of the Messages prepare must look at — a descendant lane, or
    a payload other than the empty map — in the same pass over the rows."""
    later = conn.execute(_LATER_TURN_SQL, (ws, sid, through)).fetchone() is not None
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
_FEW_SPECIAL = 8
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
    conn: apsw.Connection, ws: str, sid: str, through: int, *, scan: bool
) -> tuple[int, str, int, list[int]]:
    """One pass of SQLite over a Session's own boundary rows: (count, SHA-256 hex, highest
    position, and with `scan` the positions of the Messages prepare must look at)."""
    sql, params = _digest_statement(conn, ws, sid, through, scan=scan)
    row = conn.execute(sql, params).fetchone()
    assert row is not None  # an aggregate always answers one row
    count, joined_sql, top = row[0], row[1], row[2]
    digest = hashlib.sha256(b"" if joined_sql is None else bytes(joined_sql)).hexdigest()
    special = [int(p) for p in str(row[3]).split(",")] if scan and row[3] is not None else []
    return int(count), digest, int(top or 0), special


def _digest_line(r: VisibleRow) -> str:
    message_id, turn_id, kind, text, payload, version, position, _ = r
    body = "-1:" if text is None else f"{len(text.encode())}:{text}"
    tail = f"{len(payload.encode())}:{payload}"
    return f"{position},{version},{turn_id},{message_id},{kind},{body},{tail}"


def scan_history(conn: apsw.Connection, ws: str, sid: str, through: int) -> HistoryScan:
    """The boundary's Message checks (seed 000 §4: no descendant lane, no session-local
    attachment; a payload with a repeated key is refused), in position order, reading only the
    Messages they concern; then the count and digest frozen for the commit."""
    payloads: list[tuple[str, int, Any]] = []
    if history_link(conn, ws, sid) is None:
        # One pass: the digest, and where the Messages to look at are.
        count, digest, top, special = _digest_pass(conn, ws, sid, through, scan=True)
        if len(special) * _FEW_SPECIAL <= count:
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
        if type(payload) is dict and payload:
            if payload.get(DESCENDANT_LANE_KEY):
                raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
            if has_session_local_attachment(payload):
                raise ForkBoundaryError(ForkBoundaryReason.SESSION_LOCAL_ATTACHMENT_IN_BOUNDARY)
        payloads.append((str(message_id), int(position), payload))
    return HistoryScan(
        through=through, count=count, digest=digest, payloads=tuple(payloads), top=top
    )


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

    def __init__(self, conn: apsw.Connection, ws: str, sid: str, through: int, prefix: str) -> None:
        self._conn = conn
        self._args = (ws, sid, through)
        self._prefix = prefix
        self._linked = history_link(conn, ws, sid) is not None
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
    turns: list[dict[str, Any]],
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
    found = BoundaryMessageIds(conn, ws, sid, scan.through, prefixes.message)
    ids = ordinal_identity(prefixes, turns, found)
    rewritten: list[list[Any]] = []
    for message_id, position, payload in scan.payloads:
        remapped = remap_references(payload, ids, where=f"message {message_id}")
        if type(payload) is dict and any(key in REFERENCE_KEYS for key in payload):
            rewritten.append([position, dumps(remapped)])
    for turn in turns:
        for i in turn["interactions"]:
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
