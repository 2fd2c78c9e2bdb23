"""The fork's boundary and the snapshot frozen from it: what in the source blocks a fork, the
Turn boundary a fork may go through loaded with its history (seed 000 §4), and the immutable
snapshot prepare freezes of it.

The boundary checks: what in the source blocks a fork (an active fork, a running Turn, a
pending Interaction), and the Turn boundary a fork may go through — settled, bound to its
provider turn (each Turn before it too, but for one its provider never got: schema v24's
`host_only`, left out of the provider prefix), free of descendant lanes, session-local
attachments and a resume cursor of the source — loaded with its history for the snapshot.

The snapshot, frozen at prepare, is hashed with SHA-256 over its stored bytes (law 5); commit
and the committed projection read only it (and the operation row) — and, for a version 4 or 5
snapshot, the source's boundary Messages, once the commit has re-proved them against the
count and digest the snapshot froze (storage/history_links.py). The documents this process froze
are kept by hash for its own commit (`ForkMemo`, storage/fork_child.py).

Version 5 (what prepare freezes) is MessagePack bytes (a BLOB) whose Turns carry no Messages: a
`history` map holds their count, digest, the payloads holding a reference (rewritten) and the
child ids of the Messages a reference names; each Turn is stored as an array of its values in
`TURN_FIELDS` order (named once, in `turn_fields`) instead of the map version 4 stored (its keys
were ~60 % of a Turn's bytes). In memory a version 4 or 5 Turn is that array — prepare builds it
from the Turn's row, a version 4 map is read into it — and an older version's Turn a map.
Version 4 was the same document with each Turn stored as that map; version 3 the same bytes
with every Message of the boundary a compact array in its Turn (`MESSAGE_FIELDS` order);
version 2 canonical JSON text (sorted keys, no whitespace) of that shape, version 1 the same
with Messages as objects. All are still read: an operation prepared by an older build may be
committed or projected by this one. A document MessagePack cannot hold (an integer beyond 64
bits, which JSON allows) is frozen as JSON text instead — version 2 for a version 3 document,
versions 4 and 5 keep their number; the stored value's type says which encoding it is."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import apsw
import msgpack

from domain.errors import (
    ForkBoundaryError,
    ForkBoundaryReason,
    ForkSnapshotCorrupt,
)
from domain.fork_states import STAGE_ACTIVE_SQL
from storage.fork_child import (
    T_FINAL_POSITION,
    T_INTERACTIONS,
    TURN_FIELDS,
    ForkMemo,
    reject_duplicate_keys,
    turn_array,
)
from storage.history_links import (
    DESCENDANT_LANE_KIND,
    HistoryScan,
    history_link,
    linked_message,
    refuse_boundary_payload,
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
from storage.sqlite import Row, dumps

# -- The boundary ----------------------------------------------------------------------------------

# A runtime-context resume cursor naming the source provider session must not cross the fork.
RESUME_CURSOR_KEY = "resumeCursor"
# A boundary (and snapshot v2) Message is an array of these, in this order; v1 snapshots had
# them as the keys of an object (`load_snapshot` below reads both).
MESSAGE_FIELDS = ("message_id", "kind", "text", "payload", "version", "position")
# -- boundary checks ------------------------------------------------------------------------


_BLOCKER_CHECKS = (
    (
        ForkBoundaryReason.SOURCE_GOAL_CONTROL_ACTIVE,
        "SELECT 1 FROM goal_controls WHERE workspace_id = ?1 AND session_id = ?2"
        " AND status = 'active'",
    ),
    (
        ForkBoundaryReason.SOURCE_RUNTIME_OPERATION_ACTIVE,
        "SELECT 1 FROM runtime_operations WHERE workspace_id = ?1 AND session_id = ?2"
        " AND status = 'active'",
    ),
    (
        ForkBoundaryReason.SOURCE_INTERACTION_PENDING,
        "SELECT 1 FROM interactions WHERE workspace_id = ?1 AND session_id = ?2"
        " AND status = 'pending'",
    ),
    (
        ForkBoundaryReason.SOURCE_SUBMIT_CLAIM_ACTIVE,
        "SELECT 1 FROM submit_claims WHERE workspace_id = ?1 AND session_id = ?2"
        " AND status = 'active'",
    ),
    (
        ForkBoundaryReason.SOURCE_TURN_ACTIVE,
        "SELECT 1 FROM turns WHERE workspace_id = ?1 AND session_id = ?2 AND phase = 'active'",
    ),
    (
        ForkBoundaryReason.SOURCE_FORK_ACTIVE,
        "SELECT 1 FROM fork_operations WHERE workspace_id = ?1 AND source_session_id = ?2"
        f" AND {STAGE_ACTIVE_SQL}",
    ),
)
"""The source's quiescence checks that read the store (seed 000 §4), most specific first."""
_BLOCKER_REASONS = tuple(reason for reason, _ in _BLOCKER_CHECKS)
_BLOCKERS_SQL = "SELECT " + ", ".join(f"EXISTS ({sql})" for _, sql in _BLOCKER_CHECKS)
"""One row: for each of `_BLOCKER_CHECKS` in order, 1 when the source has such a row
(parameters: workspace, source Session)."""


def source_blockers(conn: apsw.Connection, ws: str, session: Session) -> list[ForkBoundaryReason]:
    """Quiescence of the source (seed 000 §4), in a fixed order; empty when forkable."""
    sid = session.session_id
    reasons: list[ForkBoundaryReason] = []
    if session.kind != SessionKind.ROOT:
        reasons.append(ForkBoundaryReason.SOURCE_NOT_ROOT)
    if not session.provider_session_id:
        reasons.append(ForkBoundaryReason.SOURCE_PROVIDER_SESSION_MISSING)
    # Most specific first: a pending Interaction or an unbound submit claim only exists while a
    # Turn is active, so checking the Turn first would hide those reasons. All six asked by one
    # statement (`_BLOCKERS_SQL`: one step of SQLite, not six statements prepared, bound and
    # stepped from Python), each its own `EXISTS` on the same index a lone query used.
    found = conn.execute(_BLOCKERS_SQL, (ws, sid)).fetchone()
    assert found is not None  # a SELECT of constants and EXISTS: always one row
    reasons.extend(reason for reason, hit in zip(_BLOCKER_REASONS, found, strict=True) if hit)
    return reasons


@dataclass(frozen=True, slots=True)
class Boundary:
    """The source history through the selected Turn, as frozen into the snapshot. Read for a
    version 3 snapshot (`messages=True`), each Turn's `messages` are snapshot v2 arrays
    (message_id, kind, text, payload, version, position); for version 4 the Turns carry none and
    `history` says what was learnt of the Messages in SQLite (storage/history_links.py)."""

    turns: list[Any]
    """Version 3: each Turn a map (with its `messages`); version 4 and later: each Turn its
    `TURN_FIELDS` array, as a version 5 snapshot stores it (no map built and then packed)."""
    provider_turn_ids: tuple[str, ...]
    selected: Any
    """The selected Turn, of `turns`."""
    turn_id: str
    """The selected Turn's id."""
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
_TURNS_SQL = f"SELECT {_TURN_COLUMNS}, t.host_only FROM turns t{_TURNS_WHERE} ORDER BY t.sequence"
# ... and with each one's final assistant Message (its position and its own Turn; NULLs when the
# Session holds no row of it) looked up by the `(session_key, message_id)` key as the walk reaches
# the Turn: one walk of the Turns, not a second one joining them to their final Messages. The
# Turns are found from the Session's key, bound (`?2`; `?1` the selected Turn's sequence): one
# text for every Session, compiled once per connection. (Before the connections ran with the
# planner's stability guarantee, a bound key had SQLite compile the join again at every
# execution, so the key was written into the text: a statement compiled, and an entry of the
# writer's statement cache taken, per Session forked; docs/design/store.md "Statements
# compiled once".)
_TURNS_FINALS_SQL = (
    "SELECT t.turn_id, t.sequence, t.sequence_provenance, t.phase, t.outcome,"
    " t.root_provider_turn_id, t.provider_turn_binding_json, t.final_assistant_message_id,"
    " t.error, t.created_at_ms, t.settled_at_ms, fm.position, fm.turn_id, t.host_only"
    " FROM session_keys k"
    " JOIN turns t ON t.workspace_id = k.workspace_id AND t.session_id = k.session_id"
    " LEFT JOIN messages fm ON fm.session_key = k.session_key"
    " AND fm.message_id = t.final_assistant_message_id"
    " WHERE k.session_key = ?2 AND t.sequence <= ?1 ORDER BY t.sequence"
)
# A Session without a key (no row in `session_keys`): its Turns, no final Message found.
_TURNS_NO_FINALS_SQL = (
    f"SELECT {_TURN_COLUMNS}, NULL, NULL, t.host_only FROM turns t{_TURNS_WHERE}"
    " ORDER BY t.sequence"
)
_SESSION_KEY_SQL = SESSION_KEY_OF[1:-1]


_ANY_INTERACTION_SQL = (
    "SELECT 1 FROM interactions WHERE workspace_id = ? AND session_id = ? LIMIT 1"
)
_INTERACTIONS_SQL = (
    "SELECT i.interaction_id, i.request_id, i.turn_id, i.kind, i.status, i.input_json,"
    " i.output_json FROM interactions i JOIN turns t ON t.workspace_id = i.workspace_id"
    " AND t.session_id = i.session_id AND t.turn_id = i.turn_id"
    " WHERE i.workspace_id = ? AND i.session_id = ? AND t.sequence <= ?"
    " ORDER BY t.sequence, i.created_at_ms, i.rowid"
)


def load_boundary(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    turn_id: str,
    *,
    messages: bool = True,
    keep_digest: bool = False,
) -> Boundary:
    """Read the through-Turn history (inclusive) and prove it forkable, else a boundary error.
    `messages=False` (snapshot version 4 and later): the Messages stay in SQLite, checked and
    digested there (`scan_history`); each Turn has the `TURN_FIELDS`, its
    `final_assistant_position` the position of its final assistant Message when that Message is
    in the boundary (else None). `keep_digest` (prepare's write transaction): the digest a
    previous prepare kept is used while it stands, and one computed is kept (schema v17)."""
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
    # Version 4: each Turn's final Message (position, owner Turn) in the same walk of the Turns,
    # by the Session's key (None for a Session without one: no Message, no final found).
    session_key: int | None = None
    if messages:
        turn_rows = conn.execute(_TURNS_SQL, (ws, sid, through)).fetchall()
    else:
        key = conn.execute(_SESSION_KEY_SQL, (ws, sid)).fetchone()
        if key is None:
            turn_rows = conn.execute(_TURNS_NO_FINALS_SQL, (ws, sid, through)).fetchall()
        else:
            session_key = int(key[0])
            turn_rows = conn.execute(_TURNS_FINALS_SQL, (through, session_key)).fetchall()
    turns: list[Any] = []
    by_id: dict[str, Any] = {}
    interactions_of: dict[str, list[dict[str, Any]]] = {}
    for expected, r in enumerate(turn_rows, start=1):
        # Verifiable provenance: host-assigned and gap-free 1..n, so "through" means the same
        # prefix to the provider as to us.
        if r[2] not in VERIFIABLE_PROVENANCE or r[1] != expected:
            raise ForkBoundaryError(ForkBoundaryReason.TURN_SEQUENCE_UNVERIFIED)
        # Every Turn the provider may hold is bound; one it provably never got (`host_only`,
        # its last column, schema v24) is left out of the provider prefix below, but the fork
        # cannot go through it (the provider has no Turn to fork at).
        if not r[5] and (not r[-1] or r[0] == turn_id):
            raise ForkBoundaryError(ForkBoundaryReason.PROVIDER_TURN_MISSING)
        interactions: list[dict[str, Any]] = []
        turn: Any
        if messages:
            turn = {
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
                "interactions": interactions,
                "messages": [],
            }
        else:
            # The row's first columns are the `TURN_FIELDS` before `interactions`, in order; the
            # final position is set below when the final Message is in the boundary.
            turn = [*r[:T_INTERACTIONS], interactions, None]
        turns.append(turn)
        by_id[str(r[0])] = turn
        interactions_of[str(r[0])] = interactions
    history: HistoryScan | None = None
    if messages:
        _read_messages(conn, ws, sid, through, by_id)
    else:
        history = scan_history(conn, ws, sid, through, keep=keep_digest, session_key=session_key)
        _place_finals(conn, ws, sid, turn_rows, by_id, linked=history.linked)
    # Most Sessions have no Interaction at all: one index probe says so (~4 µs) before the join
    # through every boundary Turn, which SQLite recompiles at each execution (~20 µs).
    interaction_rows: Iterable[Row] = ()
    if conn.execute(_ANY_INTERACTION_SQL, (ws, sid)).fetchone() is not None:
        interaction_rows = conn.execute(_INTERACTIONS_SQL, (ws, sid, through))
    for r in interaction_rows:
        interactions_of[r[2]].append(
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
        provider_turn_ids=tuple(str(r[5]) for r in turn_rows if r[5]),
        selected=by_id[turn_id],
        turn_id=turn_id,
        history=history,
    )


def _place_finals(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    turn_rows: list[Row],
    by_id: dict[str, list[Any]],
    *,
    linked: bool,
) -> None:
    """Each boundary Turn's `final_assistant_position`: the position of its final assistant
    Message, when that Message's own Turn is in the boundary. `turn_rows` (`_TURNS_FINALS_SQL`)
    carry the Session's own row of it; a linked child's Message not among its own rows is the
    source's (`linked_message`); `linked`: the Session has a history link (read once, by
    `scan_history`)."""
    for r in turn_rows:
        final_id, position, message_owner = r[7], r[11], r[12]
        if final_id is None:
            continue
        if position is None and linked:
            found = linked_message(conn, ws, sid, final_id)
            if found is not None:
                position, message_owner = found[6], found[1]
        if position is not None and message_owner in by_id:
            by_id[str(r[0])][T_FINAL_POSITION] = position


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
            refuse_boundary_payload(payload)
        # A snapshot v2 Message: an array in `MESSAGE_FIELDS` order.
        append([message_id, kind, text, payload, version, position])


# -- The frozen snapshot ---------------------------------------------------------------------------

SNAPSHOT_VERSION = 5
# Version 4: the same document with each Turn stored as a map (what builds before version 5 froze).
MAP_TURNS_VERSION = 4
# The versions whose Messages stay in SQLite (a `history` map says what the commit needs).
HISTORY_VERSIONS = (MAP_TURNS_VERSION, SNAPSHOT_VERSION)
# Version 3: the same MessagePack document with every Message of the boundary in its Turn.
MESSAGES_VERSION = 3
# The version of the JSON text form: what builds before MessagePack froze, and what this one
# freezes for a document MessagePack cannot hold.
JSON_VERSION = 2
# The versions `load_snapshot` reads: 1 (Messages as objects), 2 (canonical JSON) and 3
# (MessagePack, Messages inside) are still found in stores written by older builds; their
# operations may still be committed or read.
READABLE_VERSIONS = (1, 2, 3, 4, 5)

# What a version 4 or 5 document's `history` holds (storage/history_links.py `history_section`).
HISTORY_KEYS = frozenset({"through", "count", "digest", "rewritten", "message_ids"})

Frozen = str | bytes
"""A stored snapshot: version 3 MessagePack bytes, or version 1 / 2 JSON text."""

# `dumps`'s canonical form (sorted keys, no whitespace, UTF-8 kept) without the per-container
# cycle check: a snapshot is built from fresh containers and parsed JSON, never cyclic, and the
# check costs an id-keyed dict insert and delete per object and array (~20,000 at 10,000
# Messages). Same output as `dumps` for every acyclic value.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def encode_snapshot(document: Mapping[str, Any]) -> str:
    """The canonical JSON text of a snapshot document (version 1 and 2; hashed as UTF-8)."""
    return _ENCODER.encode(document)


def pack_snapshot(document: Mapping[str, Any]) -> bytes:
    """The MessagePack bytes of a snapshot document (the bytes that are hashed): version 5's
    Turns as arrays (`stored_form`). Maps keep the document's own order, which prepare builds
    the same way every time; nothing re-encodes a document to compare it, the stored bytes are
    what the hash covers."""
    packed: bytes = msgpack.packb(stored_form(document), use_bin_type=True)
    return packed


def stored_form(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """What is encoded for `document`: a version 5 document with each Turn as the array of its
    `TURN_FIELDS` values (prepare builds them so; a Turn map built elsewhere is read as one,
    a missing value None); any other document as it is."""
    if document.get("version") != SNAPSHOT_VERSION:
        return document
    turns = document["turns"]
    if all(type(t) is list or type(t) is tuple for t in turns):
        return document
    return {**document, "turns": [turn_array(t) if isinstance(t, Mapping) else t for t in turns]}


def _turn_arrays(document: dict[str, Any]) -> dict[str, Any]:
    """A decoded version 4 or 5 document with its Turns as `TURN_FIELDS` arrays (the in-memory
    shape of both: version 5 stored them so, version 4 as maps); a version 5 document that does
    not name these fields, or a Turn that is not an array of their length (a map, for version 4),
    fails closed."""
    turns = document.get("turns")
    if not isinstance(turns, list):
        raise ForkSnapshotCorrupt(f"malformed version {document.get('version')} Turns")
    if document.get("version") == MAP_TURNS_VERSION:
        if not all(isinstance(t, dict) for t in turns):
            raise ForkSnapshotCorrupt("malformed version 4 Turns: not maps")
        return {**document, "turns": [turn_array(t) for t in turns]}
    if document.get("turn_fields") != list(TURN_FIELDS):
        raise ForkSnapshotCorrupt("version 5 fork snapshot does not name its Turn fields")
    width = len(TURN_FIELDS)
    if not all(type(t) is list and len(t) == width for t in turns):
        raise ForkSnapshotCorrupt("malformed version 5 Turns: not arrays of the Turn fields")
    return document


def sha256_hex(frozen: Frozen) -> str:
    data = frozen.encode("utf-8") if isinstance(frozen, str) else frozen
    return hashlib.sha256(data).hexdigest()


def request_hash(
    source: str, target: str, point_kind: str, turn_id: str, workspace: str = "shared"
) -> str:
    """Law 6: the identity of a fork request (what `requestId` must keep meaning). The
    workspace mode is part of it; `shared` (the default) hashes as before it existed, so
    stored operations keep their identity."""
    identity = {"point_kind": point_kind, "source": source, "target": target, "turn_id": turn_id}
    if workspace != "shared":
        identity["workspace"] = workspace
    return sha256_hex(dumps(identity))


# -- freezing ---------------------------------------------------------------------------------


def child_runtime_context(
    runtime_context: Mapping[str, Any], source_provider_session_id: str
) -> dict[str, Any]:
    """Drop a resume cursor that points back into the source provider session (seed 000 §5)."""
    context = dict(runtime_context)
    cursor = context.get(RESUME_CURSOR_KEY)
    if cursor == source_provider_session_id or (
        isinstance(cursor, Mapping) and cursor.get("resume") == source_provider_session_id
    ):
        del context[RESUME_CURSOR_KEY]
    return context


def freeze_snapshot(
    *,
    operation_id: str,
    workspace_id: str,
    source: Session,
    target_session_id: str,
    target_title: str,
    point_kind: str,
    boundary: Boundary,
    runtime_identity: Mapping[str, Any],
    memo: ForkMemo | None = None,
    history: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], Frozen, str]:
    """Build the snapshot document; returns (document, its stored form, SHA-256 hex).
    With `history` (storage/history_links.py `history_section`) it is a version 5 document whose
    Turns carry no Messages; without, version 3 with every Message in its Turn."""
    assert source.provider_session_id is not None
    settings = runtime_identity.get("settings", source.settings)
    context = runtime_identity.get("runtime_context", source.runtime_context)
    document: dict[str, Any] = {
        "version": MESSAGES_VERSION if history is None else SNAPSHOT_VERSION,
        "message_fields": list(MESSAGE_FIELDS),
        "operation_id": operation_id,
        "workspace_id": workspace_id,
        "point": {"kind": point_kind, "turn_id": boundary.turn_id},
        "source": {
            "session_id": source.session_id,
            "provider": source.provider,
            "provider_session_id": source.provider_session_id,
            "title": source.title,
        },
        "target": {
            "session_id": target_session_id,
            "title": target_title,
            "provider": source.provider,
            "model": source.model,
            "cwd": str(runtime_identity.get("cwd", source.cwd)),
            "settings": dict(settings),
            "runtime_context": child_runtime_context(context, source.provider_session_id),
            "rail_placement": source.rail_placement,
            "visibility": source.visibility,
        },
        "provider_turn_ids": list(boundary.provider_turn_ids),
        "turns": boundary.turns,
    }
    if history is not None:
        document["turn_fields"] = list(TURN_FIELDS)
        document["history"] = dict(history)
    frozen: Frozen
    try:
        frozen = pack_snapshot(document)
    except (OverflowError, TypeError, ValueError):
        # E.g. a payload's integer beyond 64 bits: JSON holds it, MessagePack cannot. A version
        # 5 document keeps its version (its shape says how to commit it); the text type says JSON.
        if history is None:
            document["version"] = JSON_VERSION
        frozen = encode_snapshot(stored_form(document))
    digest = sha256_hex(frozen)
    if memo is not None:
        memo.remember_frozen(digest, document, len(frozen))
    return document, frozen, digest


def take_frozen_snapshot(
    text: Frozen, expected_hash: str, memo: ForkMemo | None = None
) -> dict[str, Any]:
    """`load_snapshot` for a commit: the stored bytes are hashed and must match; their parse is
    the document prepare froze when the store's `memo` still holds it (a hash match means the
    bytes are exactly its encoding, whose decode equals it), else decoded."""
    if sha256_hex(text) != expected_hash:
        raise ForkSnapshotCorrupt("fork snapshot does not match its hash")
    held = None if memo is None else memo.take_frozen(expected_hash)
    if held is None:
        return load_snapshot(text, expected_hash)
    return dict(held)


# The stored value as its bytes and its type: a text value whose bytes are not UTF-8 (a damaged
# store) is then a corrupt snapshot, not a decode error inside SQLite's driver.
_FROZEN_SELECT = (
    "SELECT CAST(snapshot_json AS BLOB), typeof(snapshot_json) FROM fork_snapshots WHERE op_seq = ?"
)


def read_frozen(conn: apsw.Connection, op_seq: int) -> Frozen:
    """The stored snapshot of operation `op_seq`, as `load_snapshot` takes it."""
    row = conn.execute(_FROZEN_SELECT, (op_seq,)).fetchone()
    if row is None:
        raise ForkSnapshotCorrupt("fork snapshot row is missing")
    data, kind = row
    if kind == "blob":
        return bytes(data)
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ForkSnapshotCorrupt(f"fork snapshot text is not UTF-8: {exc}") from exc


def decode_frozen(frozen: Frozen) -> Any:
    """The stored value decoded by its type (bytes: MessagePack, text: JSON), unchecked: what
    `load_snapshot` verifies and reads (tools that inspect a store use it as it is)."""
    return msgpack.unpackb(frozen, raw=False) if isinstance(frozen, bytes) else json.loads(frozen)


def load_snapshot(text: Frozen, expected_hash: str) -> dict[str, Any]:
    """Parse a stored snapshot, refusing one whose bytes no longer match the frozen hash."""
    if sha256_hex(text) != expected_hash:
        raise ForkSnapshotCorrupt("fork snapshot does not match its hash")
    packed = isinstance(text, bytes)
    try:
        document = decode_frozen(text)
    except ValueError as exc:  # msgpack's and json's decode errors are ValueErrors
        raise ForkSnapshotCorrupt(f"fork snapshot does not decode: {exc}") from exc
    if not isinstance(document, dict):
        raise ForkSnapshotCorrupt("fork snapshot is not a map")
    version = document.get("version")
    if version in HISTORY_VERSIONS:
        history = document.get("history")
        if not isinstance(history, dict) or not history.keys() >= HISTORY_KEYS:
            raise ForkSnapshotCorrupt(f"version {version} fork snapshot has no well-formed history")
    if version == 1 and not packed:
        return _upgrade_v1(document)
    expected = (MESSAGES_VERSION if packed else JSON_VERSION, *HISTORY_VERSIONS)
    if version not in expected or document.get("message_fields") != list(MESSAGE_FIELDS):
        raise ForkSnapshotCorrupt(f"unsupported snapshot version {version!r}")
    if version in HISTORY_VERSIONS:
        return _turn_arrays(document)
    return document


def _upgrade_v1(document: dict[str, Any]) -> dict[str, Any]:
    """A v1 document (Messages as objects, stored by an older build) in the v2 shape
    the child is built from. Only the in-memory form changes: the stored bytes and their hash
    stay as frozen, and the child built from either shape is the same."""
    try:
        turns = [
            {
                **turn,
                "messages": [[m[f] for f in MESSAGE_FIELDS] for m in turn["messages"]],
            }
            for turn in document["turns"]
        ]
    except (KeyError, TypeError) as exc:
        raise ForkSnapshotCorrupt(f"malformed v1 snapshot: {exc!r}") from exc
    # `version` stays 1: the document says what was stored; only its Messages changed shape.
    return {**document, "message_fields": list(MESSAGE_FIELDS), "turns": turns}
