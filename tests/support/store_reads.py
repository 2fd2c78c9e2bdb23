"""The test port of the store: reads and writes only tests make, kept out of `storage.Store`.

Each function runs the SQL a `Store` method of the same name would, through the store's own
connection helpers (`_read`, `_write` with its fence check, `_one`, `_all`), so that `Store`
keeps only what the daemon calls.

- Inspection of fork state: `fence_holder`, `find_fork_operation_by_request`,
  `fork_operations_of`, `lineage_of`, `fork_readiness`, `find_session`.
- Goal controls and runtime operations that span a provider call (seed 000 §5 quiescence):
  the schema holds them and forkability honours them (`storage.fork_snapshot.source_blockers`),
  but no daemon path opens one yet; tests open and finish them here to pin those rules.
"""

from __future__ import annotations

import uuid

import apsw

from domain.errors import ForkBoundaryError, InvalidArgument, NotFound
from storage.fork_snapshot import load_boundary, source_blockers
from storage.models import ForkOperation, ForkReadiness, Lineage, Session
from storage.rows import (
    ACTIVE_OPS_SQL,
    OP_COLUMNS,
    decode_op,
    load_session,
    load_turn,
    op_from_row,
    require_session,
    require_text,
    touch,
)
from storage.store import Store

# -- fork state, read ------------------------------------------------------------------------


def fence_holder(store: Store, ws: str, sid: str) -> ForkOperation | None:
    """The active operation holding `sid`'s fence, if any."""
    r = store.db.one(
        f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
        f" AND source_session_id = ? AND status IN {ACTIVE_OPS_SQL} LIMIT 1",
        (ws, sid),
    )
    return None if r is None else op_from_row(r)


def find_fork_operation_by_request(store: Store, ws: str, request_id: str) -> ForkOperation | None:
    with store.db.read() as conn:
        r = conn.execute(
            f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ? AND request_id = ?",
            (ws, request_id),
        ).fetchone()
        return None if r is None else decode_op(conn, r, projections=store.db.projections)


def lineage_of(store: Store, ws: str, sid: str) -> Lineage | None:
    session = store.db.with_conn(lambda c: load_session(c, ws, sid, include_deleted=True))
    return None if session is None else session.lineage


def fork_operations_of(store: Store, ws: str, sid: str) -> list[ForkOperation]:
    """Every operation whose source is `sid`, oldest first (without projections)."""
    rows = store.db.rows(
        f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
        " AND source_session_id = ? ORDER BY op_seq",
        (ws, sid),
    )
    return [op_from_row(r) for r in rows]


def fork_readiness(store: Store, ws: str, sid: str, turn_id: str | None = None) -> ForkReadiness:
    """Why a fork of `sid` (through `turn_id`) would be rejected now. Never writes."""
    with store.db.read() as conn:
        session = require_session(conn, ws, sid)
        blocking = [r.value for r in source_blockers(conn, ws, session)]
        turn = None
        if turn_id is not None:
            turn = load_turn(conn, ws, sid, turn_id)
            try:
                load_boundary(conn, ws, sid, turn_id)
            except ForkBoundaryError as exc:
                blocking.append(exc.boundary_reason.value)
        active = conn.execute(
            "SELECT operation_id FROM fork_operations WHERE workspace_id = ?"
            f" AND source_session_id = ? AND status IN {ACTIVE_OPS_SQL} LIMIT 1",
            (ws, sid),
        ).fetchone()
        return ForkReadiness(
            session=session,
            turn=turn,
            blocking=tuple(dict.fromkeys(blocking)),
            active_operation_id=None if active is None else active[0],
        )


def find_session(store: Store, ws: str, sid: str) -> Session | None:
    """A live Session, or None (a deleted one is not found)."""
    return store.db.with_conn(lambda c: load_session(c, ws, sid))


# -- goal controls and runtime operations (fenced writes) -----------------------------------


def begin_goal_control(
    store: Store, ws: str, sid: str, action: str, goal: str | None = None
) -> str:
    """Open a goal-control operation that spans a provider call (blocks forks until done)."""
    if action not in ("set", "clear"):
        raise InvalidArgument("action", "goal control action must be 'set' or 'clear'")
    with store.db.write(ws, fence=sid) as tx:
        require_session(tx.conn, ws, sid)
        control_id = str(uuid.uuid4())
        tx.execute(
            "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal,"
            " status, created_at_ms) VALUES (?, ?, ?, ?, ?, 'active', ?)",
            (ws, sid, control_id, action, goal, tx.now_ms),
        )
        return control_id


def finish_goal_control(store: Store, ws: str, control_id: str, *, apply: bool = True) -> Session:
    """Finish a goal control; `apply` writes its goal to the Session. Idempotent."""
    with store.db.write(ws) as tx:
        row = tx.one(
            "SELECT session_id, action, goal, status FROM goal_controls"
            " WHERE workspace_id = ? AND control_id = ?",
            (ws, control_id),
        )
        if row is None:
            raise NotFound(f"goal control {control_id} not found")
        sid, action, goal, status = row
        if status == "active":
            tx.execute(
                "UPDATE goal_controls SET status = 'finished', finished_at_ms = ?"
                " WHERE workspace_id = ? AND control_id = ?",
                (tx.now_ms, ws, control_id),
            )
            if apply:
                tx.execute(
                    "UPDATE sessions SET goal = ? WHERE workspace_id = ? AND session_id = ?",
                    (goal if action == "set" else None, ws, sid),
                )
            touch(tx, ws, sid)
        session = load_session(tx.conn, ws, sid, include_deleted=True)
        assert session is not None  # FK guarantees the row
        return session


def begin_runtime_operation(store: Store, ws: str, sid: str, kind: str) -> str:
    require_text("kind", kind)
    with store.db.write(ws, fence=sid) as tx:
        require_session(tx.conn, ws, sid)
        op_id = str(uuid.uuid4())
        tx.execute(
            "INSERT INTO runtime_operations (workspace_id, session_id, operation_id, kind,"
            " status, created_at_ms) VALUES (?, ?, ?, ?, 'active', ?)",
            (ws, sid, op_id, kind, tx.now_ms),
        )
        return op_id


def finish_runtime_operation(store: Store, ws: str, op_id: str) -> None:
    # Not fenced: finishing can never be what a frozen snapshot depends on.
    with store.db.write(ws) as tx:
        row = tx.one(
            "SELECT status FROM runtime_operations WHERE workspace_id = ? AND operation_id = ?",
            (ws, op_id),
        )
        if row is None:
            raise NotFound(f"runtime operation {op_id} not found")
        tx.execute(
            "UPDATE runtime_operations SET status = 'finished', finished_at_ms = ?"
            " WHERE workspace_id = ? AND operation_id = ? AND status = 'active'",
            (tx.now_ms, ws, op_id),
        )


def recoverable_fork_operations(
    store: Store, *, after: str | None = None, limit: int = 500
) -> tuple[list[ForkOperation], str | None]:
    """Operations still needing start-up recovery (active), across workspaces, by a stable
    cursor (the daemon's recovery settles them set-based and lists its commits by key)."""
    if not 1 <= limit <= 10_000:
        raise InvalidArgument("limit", "limit must be between 1 and 10000")
    after_seq = int(after) if after is not None else 0
    rows = store.db.rows(
        f"SELECT {OP_COLUMNS} FROM fork_operations WHERE status IN {ACTIVE_OPS_SQL}"
        " AND op_seq > ? ORDER BY op_seq LIMIT ?",
        (after_seq, limit + 1),
    )
    ops = [op_from_row(r) for r in rows[:limit]]
    cursor = str(rows[limit - 1][28]) if len(rows) > limit else None
    return ops, cursor


def drop_history_link_schema(conn: apsw.Connection) -> None:
    """Remove what schemas v12 (the history link), v13 (the fence's witness), v17 (the kept
    digest) and v18 (the Session row's version) added, as a store made by a build before them
    has none of it (tests of older stores' migrations)."""
    for trigger in (
        "messages_digest_insert",
        "messages_digest_update",
        "messages_digest_delete",
        "turns_digest_update",
        "turns_digest_delete",
        "session_keys_digest_update",
        "session_keys_digest_delete",
        "messages_fenced_insert",
        "messages_fenced_update",
        "messages_fenced_delete",
        "turns_fenced_update",
        "turns_fenced_delete",
        "history_fences_released",
        "messages_linked_frozen",
        "messages_linked_kept",
    ):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP TABLE history_digests")
    conn.execute("DROP TABLE history_fences")
    conn.execute("DROP TABLE history_links")
    conn.execute("DROP TRIGGER sessions_version")
    conn.execute("ALTER TABLE sessions DROP COLUMN version")
