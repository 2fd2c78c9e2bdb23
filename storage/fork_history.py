"""A fork's Messages kept in SQLite (snapshot version 4).

A boundary's Messages are most of a fork's rows (ten per Turn in a typical history) and nearly
all of them are plain: an empty payload, nothing to check, nothing to rewrite. Prepare no longer
reads them into Python: it checks the boundary with one query that returns only the Messages a
check or a rewrite concerns (a descendant lane, a non-empty payload), and freezes the rest as
their count and a SHA-256 computed over their columns as SQLite concatenates them
(`history_digest`). The commit recomputes that digest in its own transaction — any Message
added, removed or changed in the boundary since prepare (which the source fence forbids every
store path to do) fails the commit closed, `ForkSnapshotCorrupt`, exactly like a snapshot that
no longer matches its hash — and then copies the rows with one `INSERT … SELECT`, each child id
derived by SQLite from the row's position (identity rule v2, storage/fork_identity.py). The few
payloads that hold allowlisted references are rewritten at prepare and frozen in the snapshot;
the commit writes them over the copied rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from domain.errors import ForkBoundaryError, ForkBoundaryReason
from storage.fork_identity import (
    REFERENCE_KEYS,
    OrdinalPrefixes,
    ordinal_id,
    ordinal_id_sql,
    ordinal_identity,
    ordinal_seed,
    reject_duplicate_keys,
    remap_references,
)
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
# size (no scan); one `printf` per row instead of a chain of `||` (each an intermediate string).
# The order: the subquery's ORDER BY, served by the (session_key, position) key — the `+` keeps
# the Turn list from choosing the by-Turn index — so no sorter runs. SQLite never flattens a
# subquery with an ORDER BY into an aggregate; it feeds its rows to `group_concat` in that order
# (an `ORDER BY` inside `group_concat` would sort all of them again: twice the CPU).
_DIGEST_SQL = (
    "SELECT count(*), CAST(group_concat(r, char(10)) AS BLOB) FROM (SELECT"
    " printf('%d,%d,%s,%s,%s,%d:%s,%d:%s', m.position, m.version, m.turn_id, m.message_id,"
    " m.kind, ifnull(octet_length(m.text), -1), ifnull(m.text, ''),"
    " octet_length(m.payload_json), m.payload_json) AS r"
    " FROM messages m WHERE m.session_key = (SELECT session_key FROM session_keys"
    " WHERE workspace_id = ?1 AND session_id = ?2) AND +m.turn_id IN (SELECT turn_id FROM turns"
    " WHERE workspace_id = ?1 AND session_id = ?2 AND sequence <= ?3) ORDER BY m.position)"
)

# The Messages prepare must look at: a descendant lane, or a payload other than the empty map.
_SPECIAL_SQL = (
    "SELECT m.message_id, m.position, m.kind, m.payload_json"
    + _BOUNDARY
    + f" AND (m.payload_json != '{{}}' OR m.kind = '{DESCENDANT_LANE_KIND}') ORDER BY m.position"
)

# A Message of the boundary by its source id: its position (what its child id is made of).
_POSITION_SQL = "SELECT m.position" + _BOUNDARY + " AND m.message_id = ?4"

# The copy: ?4 the child's workspace (the source's), ?5 the child Session, ?6/?7 rule v2's
# Message prefix (its seed and the rest), ?10/?11 its Turn prefix's, ?8 the commit time, ?9 the
# child's session key.
_COPY_SQL = (
    "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
    " payload_json, version, position, created_at_ms, session_key)"
    f" SELECT ?4, ?5, {ordinal_id_sql('?6', '?7', 'm.position')},"
    f" {ordinal_id_sql('?10', '?11', 't.sequence')},"
    " m.kind, m.text, m.payload_json, m.version, m.position, ?8, ?9"
    + _BOUNDARY
    + " ORDER BY m.position"
)


@dataclass(frozen=True, slots=True)
class HistoryScan:
    """What prepare learnt of the boundary's Messages without reading them all: their count and
    digest, and the (source id, position, parsed payload) of each non-empty payload."""

    through: int
    count: int
    digest: str
    payloads: tuple[tuple[str, int, Any], ...]


def history_digest(conn: apsw.Connection, ws: str, sid: str, through: int) -> tuple[int, str]:
    """(count, SHA-256 hex) of the boundary's Messages through Turn sequence `through`."""
    row = conn.execute(_DIGEST_SQL, (ws, sid, through)).fetchone()
    assert row is not None  # an aggregate always answers one row
    count, joined = row
    return int(count), hashlib.sha256(b"" if joined is None else bytes(joined)).hexdigest()


def scan_history(conn: apsw.Connection, ws: str, sid: str, through: int) -> HistoryScan:
    """The boundary's Message checks (seed 000 §4: no descendant lane, no session-local
    attachment; a payload with a repeated key is refused), in position order, reading only the
    Messages they concern; then the count and digest frozen for the commit."""
    payloads: list[tuple[str, int, Any]] = []
    for message_id, position, kind, payload_json in conn.execute(_SPECIAL_SQL, (ws, sid, through)):
        if kind == DESCENDANT_LANE_KIND:
            raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
        payload = json.loads(payload_json, object_pairs_hook=reject_duplicate_keys)
        if type(payload) is dict and payload:
            if payload.get(DESCENDANT_LANE_KEY):
                raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
            if has_session_local_attachment(payload):
                raise ForkBoundaryError(ForkBoundaryReason.SESSION_LOCAL_ATTACHMENT_IN_BOUNDARY)
        payloads.append((str(message_id), int(position), payload))
    count, digest = history_digest(conn, ws, sid, through)
    return HistoryScan(through=through, count=count, digest=digest, payloads=tuple(payloads))


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
        self.found: dict[str, str] = {}
        self._missing: set[str] = set()

    def _lookup(self, source_id: str) -> str | None:
        if source_id in self.found:
            return self.found[source_id]
        if source_id in self._missing:
            return None
        row = self._conn.execute(_POSITION_SQL, (*self._args, source_id)).fetchone()
        if row is None:
            self._missing.add(source_id)
            return None
        child = ordinal_id(self._prefix, int(row[0]))
        self.found[source_id] = child
        return child

    def __getitem__(self, source_id: str) -> str:
        child = self._lookup(source_id) if isinstance(source_id, str) else None
        if child is None:
            raise KeyError(source_id)
        return child

    def __iter__(self) -> Iterator[str]:
        return iter(self.found)

    def __len__(self) -> int:
        return len(self.found)


def copy_messages(
    conn: apsw.Connection,
    *,
    ws: str,
    source_session_id: str,
    through: int,
    target_session_id: str,
    message_prefix: str,
    turn_prefix: str,
    committed_at_ms: int,
    target_key: int,
) -> int:
    """Copy the boundary's Messages into the child in one statement; returns how many."""
    conn.execute(
        _COPY_SQL,
        (
            ws,
            source_session_id,
            through,
            ws,
            target_session_id,
            ordinal_seed(message_prefix),
            message_prefix[8:],
            committed_at_ms,
            target_key,
            ordinal_seed(turn_prefix),
            turn_prefix[8:],
        ),
    )
    return int(conn.changes())


def history_section(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    scan: HistoryScan,
    *,
    turns: list[dict[str, Any]],
    prefixes: OrdinalPrefixes,
) -> dict[str, Any]:
    """The snapshot's `history` (version 4): the boundary's sequence, Message count and digest;
    each payload holding an allowlisted reference rewritten (`[position, JSON text]`, written
    over the copied row by the commit); and the child id of every Message a reference names
    (`message_ids`, what the commit's Interactions are rewritten with). Every non-empty payload
    and every Interaction passes the allowlist here (law 5: refused at prepare, before any
    dispatch), exactly as a version 3 prepare's dry run refused it."""
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
        "rewritten": rewritten,
        "message_ids": dict(found.found),
    }
