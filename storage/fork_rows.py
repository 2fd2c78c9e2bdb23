"""Reading a fork operation row: its columns, the barrier/active SQL generated from the
state machine, and the decode (a committed operation carries its child rebuilt from the
snapshot alone, law 4)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import apsw

from domain.errors import ForkOperationNotFound
from domain.fork_states import ACTIVE_SQL, BARRIER_SQL, ForkStatus
from storage.fork_child import project_child
from storage.fork_snapshot import load_snapshot, read_frozen
from storage.models import ForkOperation, Lineage, Session
from storage.sqlite import Row, loads

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
    source_turns = tuple(loads(r[10])) if lists is None else lists.id_list(r[28], 10, r[10])
    if r[12] is None:
        target_turns: tuple[Any, ...] | None = None
    else:
        target_turns = tuple(loads(r[12])) if lists is None else lists.id_list(r[28], 12, r[12])
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
        binding_receipt=loads(r[17]),
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
        worktree=loads(r[30]),
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
            return tuple(loads(text))
        key = (op_seq, column)
        with self._lock:
            held = self._lists.get(key)
        if held is not None and held[0] == text:
            return held[1]
        parsed = tuple(loads(text))
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
