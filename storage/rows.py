"""The store's rows: the SQL column lists and decoders of the canonical history (Sessions,
Turns, Messages, Interactions) and of a fork operation, and the row helpers the store's parts
share (load or require a Session, Turn or fork operation, validate an argument, touch a
Session, finish submit claims, the next Message position).

Keeping the SELECT lists next to their decoders means a column added in a migration is
threaded through one place only. A fork operation's row: its columns, the barrier/active SQL
generated from the state machine, and its decode — a committed operation carries its child
rebuilt from the frozen snapshot alone (law 4), kept in the store's `ProjectionCache`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import apsw

from domain.errors import ForkOperationNotFound, InvalidArgument, SessionNotFound, TurnNotFound
from domain.fork_states import ACTIVE_SQL, BARRIER_SQL, ForkStatus
from domain.json_text import loads_as_stdlib
from storage.fork_child import project_child
from storage.fork_snapshot import load_snapshot, read_frozen
from storage.history_links import history_link, linked_rows
from storage.models import (
    ForkOperation,
    Interaction,
    Lineage,
    Message,
    Session,
    SessionChanged,
    SessionTouch,
    Turn,
)
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Row, Tx

# -- Column lists and decoders ---------------------------------------------------------------------


def _lineage_column(column: str) -> str:
    return (
        f"(SELECT l.{column} FROM fork_lineage l WHERE l.workspace_id = s.workspace_id"
        " AND l.target_session_id = s.session_id)"
    )


# The lineage columns are scalar subqueries on fork_lineage's primary key (at most one row),
# not a LEFT JOIN: the same values, but SQLite ran the join ~7x slower per point read
# (110 vs 15 µs of CPU for one `session.get` on a 2,000-Session store).
# The active Turn is looked up by `turns_active` (the Session's active Turns: at most one),
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
       {_lineage_column("forked_at_ms")}, s.version
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
        settings=json_object(r[7]),
        runtime_context=json_object(r[8]),
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
        version=r[25],
    )


TURN_COLUMNS = (
    "workspace_id, session_id, turn_id, sequence, sequence_provenance, phase, outcome,"
    " root_provider_turn_id, provider_turn_binding_json, final_assistant_message_id, error,"
    " created_at_ms, settled_at_ms, checkpoint_json, host_only"
)
TURN_BY_ID_SQL = (
    f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ? AND turn_id = ?"
)
MESSAGE_COLUMNS = "message_id, turn_id, kind, text, payload_json, version, position"
INTERACTION_COLUMNS = "interaction_id, request_id, turn_id, kind, status, input_json, output_json"


def json_column(text: str | None) -> Any:
    """`json.loads(text)` of a JSON column (None: SQL NULL), by orjson where it agrees
    (`domain.json_text`)."""
    return None if text is None else loads_as_stdlib(text)


def json_object(text: str) -> Any:
    """A NOT NULL JSON object column (a Session's `settings_json` / `runtime_context_json`, a
    Message's `payload_json`): `json_column`, and the empty object (most rows') without a
    decoder; a fresh dict each."""
    return {} if text == "{}" else json_column(text)


def message_from_row(r: Row) -> Message:
    payload = r[4]
    return Message(
        message_id=r[0],
        turn_id=r[1],
        kind=r[2],
        text=r[3],
        # Most Messages carry their text alone: a page of 50 Turns is ~500 of them, and the
        # JSON parser was a third of reading it. A fresh dict each: no two Messages share one.
        payload={} if payload == "{}" else json_column(payload),
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
        input=json_column(r[5]),
        output=json_column(r[6]),
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
        host_only=bool(r[14]),
    )


CHUNK = 400


def _chunks(items: Sequence[str], size: int = CHUNK) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _padded(n: int) -> int:
    """How many `?` an IN list of `n` values is written with: the next power of two, at most
    `CHUNK` (1, 2, 4, ... 256, 400: ten texts of a statement for any number of values)."""
    return min(1 << (n - 1).bit_length(), CHUNK) if n > 1 else 1


# The Messages of some Turns, each Turn's in position order. Ordered by (turn, position), the
# order of `messages_by_turn`, so SQLite looks each Turn up in it: ordered by position alone it
# walked the Session's position key over every Message the Session ever had (a 20-Turn
# timeline page: 0.67 ms at 300 Turns, 1.3-2.0 ms at 1,500; 0.55 ms at either this way).
HYDRATE_MESSAGES_SQL = (
    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = {SESSION_KEY_OF}"
    " AND turn_id IN ({marks}) ORDER BY turn_id, position"
)


# The Interactions of some Turns, with what orders them (opened: `created_at_ms`, then
# `rowid`) after the columns. Each Turn's are put in that order here (`opened_order`), not
# by SQLite: an ORDER BY opens a sorter for every page read, though nearly every Turn has
# no Interaction at all.
INTERACTIONS_SQL = (
    f"SELECT {INTERACTION_COLUMNS}, created_at_ms, rowid FROM interactions"
    " WHERE workspace_id = ? AND session_id = ? AND turn_id IN ({marks})"
)


def opened_order(rows: list[Row]) -> list[Interaction]:
    """One Turn's Interactions from their rows (`INTERACTIONS_SQL`'s), in the order opened."""
    if len(rows) > 1:
        rows.sort(key=_opened)
    return [interaction_from_row(r) for r in rows]


def _opened(r: Row) -> tuple[int, int]:
    return r[7], r[8]


def hydrate_turns(conn: apsw.Connection, ws: str, sid: str, turn_rows: Sequence[Row]) -> list[Turn]:
    """Attach each Turn's Messages and Interactions (presentation order) to its row."""
    messages, interactions = turn_history_rows(conn, ws, sid, turn_rows)
    return [
        turn_from_row(r, [message_from_row(m) for m in messages[r[2]]], interactions[r[2]])
        for r in turn_rows
    ]


def turn_history_rows(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    turn_rows: Sequence[Row],
    interaction_chars: dict[str, int] | None = None,
) -> tuple[dict[str, list[Row]], dict[str, list[Interaction]]]:
    """Each Turn's Message rows (`MESSAGE_COLUMNS` first, presentation order; a linked child's
    from its link beside its own) and Interactions, by Turn id: what `hydrate_turns` attaches,
    the Messages left as rows for a reader that never needs a `Message` value of them (the
    timeline's wire page builds its maps from the rows: a 50-Turn page is ~500 Messages).
    `interaction_chars`, when given, gets each Turn's Interactions' stored JSON length (their
    input and output as read, before they are decoded)."""
    ids = [r[2] for r in turn_rows]
    messages: dict[str, list[Row]] = {i: [] for i in ids}
    interactions: dict[str, list[Interaction]] = {i: [] for i in ids}
    opened: dict[str, list[Row]] = {}
    for chunk in _chunks(ids):
        # The list padded with NULLs (never equal to a Turn id) to the next power of two: a
        # statement text per size class, not per number of Turns read (each its own compilation
        # and entry of the reader's statement cache); the plan is the same either way.
        width = _padded(len(chunk))
        marks = ",".join("?" * width)
        params: list[Any] = [ws, sid, *chunk, *([None] * (width - len(chunk)))]
        for r in conn.execute(HYDRATE_MESSAGES_SQL.format(marks=marks), params):
            messages[r[1]].append(r)
        for r in conn.execute(INTERACTIONS_SQL.format(marks=marks), params):
            opened.setdefault(r[2], []).append(r)
            if interaction_chars is not None:
                chars = len(r[5] or "") + len(r[6] or "")
                interaction_chars[r[2]] = interaction_chars.get(r[2], 0) + chars
    for turn_id, rows in opened.items():
        interactions[turn_id] = opened_order(rows)
    _add_linked(conn, ws, sid, turn_rows, messages)
    return messages, interactions


def _add_linked(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    turn_rows: Sequence[Row],
    messages: dict[str, list[Row]],
) -> None:
    """A linked child's Turns of the boundary: their linked Messages beside their own rows (the
    own row at a position wins), each Turn's in position order (storage/history_links.py)."""
    link = history_link(conn, ws, sid)
    if link is None:
        return
    by_sequence = {int(r[3]): r[2] for r in turn_rows if int(r[3]) <= link.through_sequence}
    if not by_sequence:
        return
    taken = {int(m[6]) for t in by_sequence.values() for m in messages[t]}
    # Rows of one level, none of the child's own among them, come in (Turn, position) order.
    ordered = not taken and len(link.levels) == 1
    for row in linked_rows(conn, link, sequences=list(by_sequence), positions=taken):
        messages[by_sequence[row[7]]].append(row)
    if not ordered:
        for turn_id in by_sequence.values():
            messages[turn_id].sort(key=_position)


def _position(m: Row) -> int:
    return int(m[6])


# -- A fork operation's row ------------------------------------------------------------------------

OP_COLUMNS = (
    "workspace_id, operation_id, request_id, request_hash, source_session_id,"
    " target_session_id, point_kind, source_turn_id, source_provider_session_id,"
    " source_provider_turn_id, source_provider_turn_ids, target_provider_session_id,"
    " target_provider_turn_ids, target_turn_id, driver_kind, driver_version, binding_mode,"
    " binding_receipt, snapshot_hash, status, error, created_at_ms, dispatched_at_ms,"
    " accepted_at_ms, completed_at_ms, client_observed_at_ms, target_title,"
    " target_turn_bindings, op_seq, workspace_mode, workspace_json, workspace_state"
)
OP_SEQ = 28
"""The index of `op_seq` in a row of `OP_COLUMNS`."""
# Generated from the state machine (domain.fork_states): the active set, and the barrier of
# seed 000 §6.1 (active, unknown, or committed but not yet observed by a client).
ACTIVE_OPS_SQL = ACTIVE_SQL
BARRIER_OPS_SQL = BARRIER_SQL


def op_from_row(
    r: Row,
    committed: tuple[Any, Lineage] | None = None,
    *,
    lists: ProjectionCache | None = None,
) -> ForkOperation:
    """The operation of row `r`. With `lists` (the store's cache) a long provider Turn id list
    is parsed once per operation, not once per read (see `ProjectionCache.id_list`)."""
    source_turns = tuple(json_column(r[10])) if lists is None else lists.id_list(r[28], 10, r[10])
    if r[12] is None:
        target_turns: tuple[Any, ...] | None = None
    else:
        target_turns = (
            tuple(json_column(r[12])) if lists is None else lists.id_list(r[28], 12, r[12])
        )
    return ForkOperation(
        workspace_id=r[0],
        operation_id=r[1],
        request_id=r[2],
        request_hash=r[3],
        source_session_id=r[4],
        target_session_id=r[5],
        point_kind=r[6],
        source_turn_id=r[7],
        source_provider_session_id=r[8],
        source_provider_turn_id=r[9],
        source_provider_turn_ids=source_turns,
        target_provider_session_id=r[11],
        target_provider_turn_ids=target_turns,
        target_turn_id=r[13],
        driver_kind=r[14],
        driver_version=r[15],
        binding_mode=r[16],
        binding_receipt=json_column(r[17]),
        snapshot_hash=r[18],
        status=ForkStatus(r[19]),
        error=r[20],
        created_at_ms=r[21],
        dispatched_at_ms=r[22],
        accepted_at_ms=r[23],
        completed_at_ms=r[24],
        client_observed_at_ms=r[25],
        committed_session=None if committed is None else committed[0],
        lineage=None if committed is None else committed[1],
        target_title=r[26],
        workspace_mode=r[29] or "shared",
        worktree=json_column(r[30]),
        worktree_state=r[31],
    )


LIST_CACHE_SIZE = 8
"""Operations whose long provider Turn id lists are kept parsed (a 10,000-Turn list: ~1 MB)."""
LIST_CACHE_MIN_CHARS = 8192
"""A list shorter than this (~200 ids) is parsed each time: cheaper than keeping it."""

PROJECTION_CACHE_SIZE = 4096
"""Committed operations whose child projection is kept in memory, so a `fork.get` of a
committed operation does not re-read, re-hash and re-parse its snapshot every time."""


class ProjectionCache:
    """Bounded LRU of committed projections, keyed by what the projection is a pure function
    of: the snapshot's hash (its verified bytes), the child's provider session id and the
    commit time. A committed operation never changes any of them, so an entry never goes
    stale. Owned by the store that fills it (`Database.projections`; a `ReadView` is handed
    its store's), so two stores in one process share nothing."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[Any, ...], tuple[Session, Lineage]] = OrderedDict()
        self._lock = threading.Lock()
        self.misses = 0
        self._lists: OrderedDict[tuple[int, int], tuple[str, tuple[Any, ...]]] = OrderedDict()

    def id_list(self, op_seq: int, column: int, text: str) -> tuple[Any, ...]:
        """The parsed JSON list in `column` of operation `op_seq`'s row. Each read of an
        operation parsed both of its provider Turn id lists: a client polling `fork.get` on
        a 10,000-Turn fork had the daemon parse ~400 KB of JSON several times per poll (three
        reads of the row: the read view, the host, the Session actor). A list is kept with the
        text it was parsed from and served only while the row holds the very same text (a
        compare of the two strings, no parse), so a changed row is parsed again."""
        if len(text) < LIST_CACHE_MIN_CHARS:
            return tuple(json_column(text))
        key = (op_seq, column)
        with self._lock:
            held = self._lists.get(key)
        if held is not None and held[0] == text:
            return held[1]
        parsed = tuple(json_column(text))
        with self._lock:
            self._lists[key] = (text, parsed)
            self._lists.move_to_end(key)
            while len(self._lists) > LIST_CACHE_SIZE:
                self._lists.popitem(last=False)
        return parsed

    def get(self, key: tuple[Any, ...]) -> tuple[Session, Lineage] | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(
        self, key: tuple[Any, ...], value: tuple[Session, Lineage], *, miss: bool = True
    ) -> None:
        """`miss=False`: seeded by the commit that built the same value (not a reader's miss)."""
        with self._lock:
            self.misses += int(miss)
            self._entries[key] = value
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._lists.clear()


def committed_projection(
    conn: apsw.Connection, r: Row, projections: ProjectionCache | None
) -> tuple[Session, Lineage]:
    """Rebuild the committed child's Session and lineage purely from the snapshot and the
    operation row (law 4), so the projection survives deletion of the child. Built once per
    store from the hash-verified snapshot, then served from its `projections` (None: built
    every time)."""
    key = (r[18], r[11], r[24])
    cached = None if projections is None else projections.get(key)
    if cached is not None:
        return cached
    snapshot = load_snapshot(read_frozen(conn, r[28]), r[18])
    built = project_child(snapshot, child_provider_session_id=r[11], committed_at_ms=r[24])
    if projections is not None:
        projections.put(key, built)
    return built


def load_op(
    conn: apsw.Connection,
    ws: str,
    op_id: str,
    *,
    project: bool = True,
    projections: ProjectionCache | None = None,
) -> ForkOperation:
    r = conn.execute(
        f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ? AND operation_id = ?",
        (ws, op_id),
    ).fetchone()
    if r is None:
        raise ForkOperationNotFound(f"fork operation {op_id} not found")
    return decode_op(conn, r, project=project, projections=projections)


def decode_op(
    conn: apsw.Connection,
    r: Row,
    *,
    project: bool = True,
    projections: ProjectionCache | None = None,
) -> ForkOperation:
    """The operation of row `r`; a committed one carries its child projection (served from
    `projections`, the store's cache) unless `project` is False."""
    if project and r[19] == ForkStatus.COMMITTED:
        return op_from_row(r, committed_projection(conn, r, projections), lists=projections)
    return op_from_row(r, lists=projections)


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
    require_live(sid, None if row is None else row[0], include_deleted=include_deleted)


def require_live(sid: str, deleted: object, *, include_deleted: bool = False) -> None:
    """`require_live_session` on the Session row's `deleted` read by the caller's own
    statement (None: no such row)."""
    if deleted is None or (deleted and not include_deleted):
        raise SessionNotFound(f"session {sid} not found")


def load_turn(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Turn | None:
    row = conn.execute(TURN_BY_ID_SQL, (ws, sid, turn_id)).fetchone()
    if row is None:
        return None
    return hydrate_turns(conn, ws, sid, [row])[0]


def require_turn(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Turn:
    turn = load_turn(conn, ws, sid, turn_id)
    if turn is None:
        raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
    return turn


def turn_row(tx: Tx, ws: str, sid: str, turn_id: str) -> Turn:
    row = tx.one(TURN_BY_ID_SQL, (ws, sid, turn_id))
    if row is None:
        raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
    return turn_from_row(row)


def touch(
    tx: Tx, ws: str, sid: str, *, claimed: str | None = None, settled: str | None = None
) -> None:
    """The write's last change of its Session's row: `updated_at_ms`, and the row's version one
    more. Its event carries what it changed (`SessionTouch`), so a subscriber holding the row
    it changed builds the new one without a read. `claimed` / `settled`: the Turn whose claim
    or settlement this write is (the row's active Turn changes with it: the only writes that
    change it, so nothing else of the row changed since the version before)."""
    row = tx.one(
        "UPDATE sessions SET updated_at_ms = ?, version = version + 1 WHERE workspace_id = ?"
        " AND session_id = ? RETURNING version",
        (tx.now_ms, ws, sid),
    )
    mark = None if row is None else SessionTouch(int(row[0]), tx.now_ms, claimed, settled)
    tx.emit(SessionChanged(ws, sid, seq=tx.seq, touch=mark))


def finish_claims(tx: Tx, ws: str, sid: str, turn_id: str) -> None:
    tx.execute(
        "UPDATE submit_claims SET status = 'finished', finished_at_ms = ?"
        " WHERE workspace_id = ? AND session_id = ? AND turn_id = ? AND status = 'active'",
        (tx.now_ms, ws, sid, turn_id),
    )


INSERT_MESSAGE = (
    "INSERT INTO messages (session_key, workspace_id, session_id, message_id, turn_id,"
    " kind, text, payload_json, version, position, created_at_ms)"
    f" VALUES ({SESSION_KEY_OF}, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)"
)
"""A new Message's row (version 1), bound to (ws, sid, ws, sid, id, turn, kind, text,
payload JSON, position, now)."""


def insert_message(
    tx: Tx,
    ws: str,
    sid: str,
    turn_id: str | None,
    message_id: str,
    kind: str,
    text: str | None,
    payload_json: str,
    position: int,
) -> Message:
    """Insert a new Message at `position` and return it as inserted (built, not read back:
    `test_store_canonical` pins it equal to a fresh read). No event: the caller's."""
    tx.execute(
        INSERT_MESSAGE,
        (ws, sid, ws, sid, message_id, turn_id, kind, text, payload_json, position, tx.now_ms),
    )
    return Message(message_id, turn_id, kind, text, json_object(payload_json), 1, position)


NEXT_POSITION = (
    "(SELECT MAX(COALESCE((SELECT MAX(position) FROM messages"
    " WHERE session_key = k.session_key), 0), COALESCE((SELECT through_position"
    " FROM history_links WHERE child_key = k.session_key), 0)) + 1"
    " FROM session_keys k WHERE k.workspace_id = ? AND k.session_id = ?)"
)
"""`next_position` as a scalar subquery, bound to (workspace, session); NULL: no key yet."""


def next_position(tx: Tx, ws: str, sid: str) -> int:
    """The position after every Message the Session shows: its own rows' and, for a linked
    child, its link's bound (the linked rows are at or below it)."""
    row = tx.one(f"SELECT {NEXT_POSITION}", (ws, sid))
    return position_of(None if row is None else row[0])


def position_of(value: Any) -> int:
    """`NEXT_POSITION`'s value as a position (NULL: the Session's first, 1)."""
    return 1 if value is None else int(value)
