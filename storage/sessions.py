"""Sessions: create, read, list (by a stable cursor), settings, title, pin, delete, runtime
facts. Each write one fenced transaction (`_write(ws, fence=sid)`), so an active fork
operation on the Session rejects it inside the same transaction.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from domain.errors import (
    ForkUnresolved,
    InvalidArgument,
    SessionBusy,
    SessionIdTaken,
    SessionNotFound,
    WorkspaceWorktreeDeleted,
)
from storage.base import Database
from storage.fork_workspace import deleted_tree_at, tree_users_in
from storage.models import Session, SessionChanged, SessionKind
from storage.rows import (
    SESSION_SELECT,
    require_live_session,
    require_mapping,
    require_session,
    require_text,
    session_from_row,
    touch,
)
from storage.sqlite import Tx, dumps, loads

# What a listed Session adds to a page beyond its stored text (ids, enums, times, lineage).
_SESSION_OVERHEAD = 512
# A session.list cursor's time part: at most 15 ASCII digits (well inside int64).
_CURSOR_MS = re.compile(r"[0-9]{1,15}")


PROVIDERS_REMEMBERED = 65_536
"""Sessions whose provider `provider_of` keeps in memory (a few MiB at most); past it the
memory starts over."""


class SessionStore:
    """Sessions and their own fields."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._submit = db.submit_write
        self._all = db.rows
        self._one = db.one
        self._read = db.read
        self._with_conn = db.with_conn
        # (workspace, session) → provider: fixed at create, and a Session's row is never
        # removed nor its id reused (a delete is soft), so an entry never goes stale.
        self._providers: dict[tuple[str, str], str] = {}

    def create_session(
        self,
        ws: str,
        *,
        session_id: str,
        provider: str,
        title: str,
        cwd: str,
        settings: Mapping[str, Any],
        model: str | None = None,
        kind: str = SessionKind.ROOT.value,
        provider_session_id: str | None = None,
        runtime_context: Mapping[str, Any] | None = None,
        rail_placement: str | None = None,
        visibility: str = "visible",
        parent_session_id: str | None = None,
        parent_turn_id: str | None = None,
    ) -> Session:
        require_text("workspaceId", ws)
        require_text("agentSessionId", session_id)
        require_text("provider", provider)
        if kind not in SessionKind.__members__.values():
            raise InvalidArgument("kind", f"unknown session kind {kind!r}")
        settings = require_mapping("settings", settings)
        # A tree is recorded by its real path: a cwd reaching it by a symlink or `..` is in it.
        # Kept beside the cwd as given when they differ (`sessions.real_cwd`, schema v25), so
        # who works in a tree is asked by real path (`tree_users_in`).
        real_cwd = os.path.realpath(cwd)
        with self._write(ws) as tx:
            tx.execute(
                "INSERT OR IGNORE INTO workspaces (workspace_id, created_at_ms) VALUES (?, ?)",
                (ws, tx.now_ms),
            )
            taken = tx.one(
                "SELECT 1 FROM sessions WHERE workspace_id = ? AND session_id = ?"
                " UNION ALL SELECT 1 FROM session_reservations WHERE workspace_id = ?"
                " AND session_id = ?",
                (ws, session_id, ws, session_id),
            )
            if taken is not None:
                raise SessionIdTaken(
                    f"session id {session_id} is taken or reserved",
                    params={"field": "agentSessionId"},
                )
            deleted = deleted_tree_at(tx, cwd, real_cwd)
            if deleted is not None:
                path, op_id, state = deleted
                where = "is" if path in (cwd, real_cwd) else f"is in {path},"
                raise WorkspaceWorktreeDeleted(
                    f"{cwd} {where} the worktree of a deleted fork child, which the daemon"
                    f" {'is removing' if state == 'removing' else 'removed'}: start the Session"
                    " in another folder",
                    params={"path": path, "operationId": op_id, "state": state},
                )
            tx.execute(
                "INSERT INTO sessions (workspace_id, session_id, kind, provider,"
                " provider_session_id, title, cwd, settings_json, runtime_context_json, model,"
                " pinned, deleted, goal, parent_session_id, parent_turn_id, rail_placement,"
                " visibility, created_at_ms, updated_at_ms, real_cwd)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, ?, ?, ?, ?, ?, ?, ?)",
                (
                    ws,
                    session_id,
                    kind,
                    provider,
                    provider_session_id,
                    title,
                    cwd,
                    dumps(dict(settings)),
                    dumps(dict(runtime_context or {})),
                    model,
                    parent_session_id,
                    parent_turn_id,
                    rail_placement,
                    visibility,
                    tx.now_ms,
                    tx.now_ms,
                    None if real_cwd == cwd else real_cwd,
                ),
            )
            return written(tx, require_session(tx.conn, ws, session_id))

    def get_session(self, ws: str, sid: str) -> Session:
        return self._with_conn(lambda c: require_session(c, ws, sid))

    def require_session_live(self, ws: str, sid: str) -> None:
        """Raise `SessionNotFound` unless the Session exists and is not deleted: a primary-key
        lookup, for a caller that needs no more (a request's check before it is routed)."""
        self._with_conn(lambda c: require_live_session(c, ws, sid))

    def provider_of(self, ws: str, sid: str) -> str:
        """The provider of a Session that exists or existed (deleted ones too): read once,
        then from memory (every Turn event the publisher projects, and every `turn.submit`
        reply, reads it). A caller that must refuse a deleted Session
        checks that itself, as its read of the Session's rows does. `SessionNotFound` for an
        id no Session ever had."""
        key = (ws, sid)
        provider = self._providers.get(key)
        if provider is None:
            row = self._one(
                "SELECT provider FROM sessions WHERE workspace_id = ? AND session_id = ?",
                (ws, sid),
            )
            if row is None:
                raise SessionNotFound(f"session {sid} not found")
            provider = str(row[0])
            if len(self._providers) >= PROVIDERS_REMEMBERED:
                self._providers.clear()
            self._providers[key] = provider
        return provider

    def list_sessions(
        self, ws: str, *, cursor: str | None = None, limit: int = 50, max_bytes: int | None = None
    ) -> tuple[list[Session], str | None]:
        """Live Sessions in stable (created, id) order; `cursor` is the opaque next page key.

        `max_bytes`: the page ends before the Session that would take its stored text (settings,
        runtime context, title, cwd, goal) past it — never before the first — and `nextCursor`
        continues from there; only the Sessions of the page are read whole. The sizes and the
        page are one read snapshot: a Session deleted between two statements would let one
        that was never measured into the page, past `max_bytes`."""
        if not 1 <= limit <= 1000:
            raise InvalidArgument("limit", "limit must be between 1 and 1000")
        after_created, after_id = -1, ""
        if cursor is not None:
            created_text, sep, after_id = cursor.partition(":")
            # ASCII digits only (int() also takes '١٢٣' and '1_000'), and inside SQLite's
            # int64 so an overflowing cursor is a 400, never a 500.
            if not sep or not _CURSOR_MS.fullmatch(created_text):
                raise InvalidArgument("cursor", "malformed cursor")
            after_created = int(created_text)
        where = (
            " WHERE s.workspace_id = ? AND s.deleted = 0"
            " AND (s.created_at_ms > ? OR (s.created_at_ms = ? AND s.session_id > ?))"
            " ORDER BY s.created_at_ms, s.session_id LIMIT ?"
        )
        args = (ws, after_created, after_created, after_id)
        more = False
        if max_bytes is None:
            rows = self._all(SESSION_SELECT + where, (*args, limit + 1))
        else:
            with self._read() as conn:
                # Sizes first: a page of huge settings is not read whole only to be cut.
                sizes = conn.execute(
                    "SELECT length(s.settings_json) + length(s.runtime_context_json)"
                    " + length(s.title) + length(s.cwd) + coalesce(length(s.goal), 0)"
                    " FROM sessions s" + where,
                    (*args, limit + 1),
                ).fetchall()
                fit, total = 0, 0
                for (size,) in sizes[:limit]:
                    total += int(size or 0) + _SESSION_OVERHEAD
                    if fit and total > max_bytes:
                        break
                    fit += 1
                more = len(sizes) > fit
                limit = fit
                rows = conn.execute(SESSION_SELECT + where, (*args, limit + 1)).fetchall()
        sessions = [session_from_row(r) for r in rows[:limit]]
        next_cursor = None
        if (more or len(rows) > limit) and sessions:
            last = sessions[-1]
            next_cursor = f"{last.created_at_ms}:{last.session_id}"
        return sessions, next_cursor

    def update_settings(self, ws: str, sid: str, settings: Mapping[str, Any]) -> Session:
        settings = require_mapping("settings", settings)
        with self._write(ws, fence=sid) as tx:
            require_live_session(tx.conn, ws, sid)
            tx.execute(
                "UPDATE sessions SET settings_json = ? WHERE workspace_id = ? AND session_id = ?",
                (dumps(dict(settings)), ws, sid),
            )
            touch(tx, ws, sid)
            return written(tx, require_session(tx.conn, ws, sid))

    def update_title(self, ws: str, sid: str, title: str) -> Session:
        # Not fenced: the snapshot froze the child title at prepare (seed 000 §6.2).
        if not isinstance(title, str):
            raise InvalidArgument("title", "title must be a string")

        def body(tx: Tx) -> Session:
            return _update_live(tx, ws, sid, "title = ?", title)

        return self._submit(body, ws)

    def set_pinned(self, ws: str, sid: str, pinned: bool) -> Session:
        # Not fenced: pin is never inherited by a fork child.
        with self._write(ws) as tx:
            return _update_live(tx, ws, sid, "pinned = ?", 1 if pinned else 0)

    def delete_session(self, ws: str, sid: str, *, removing_tree: str | None = None) -> list[str]:
        """Soft delete: the id stays taken, history stays for committed fork projections.
        `removing_tree`: the fork operation whose tree (this Session's) the caller removes next;
        marked `removing` in the same transaction, so a crash before it is gone is finished at
        start-up — unless another live Session works in it by now (`tree_users_in`, asked in
        this transaction: one started there since the caller's own check): then the tree stays
        `made` and those Sessions are returned (the caller must keep the tree); else []."""
        with self._write(ws, fence=sid) as tx:
            require_live_session(tx.conn, ws, sid)
            # A Turn still running would never settle once its Session is gone:
            # interrupt it first.
            active = tx.one(
                "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND phase = 'active' LIMIT 1",
                (ws, sid),
            )
            if active is not None:
                raise SessionBusy(
                    f"session {sid} has an active turn ({active[0]}); interrupt it first",
                    params={"turnId": active[0]},
                )
            # Seed 000 §10: `unknown` is kept for good, awaiting a person's decision; its
            # evidence lives in this Session's runtime folder, which a delete removes (law 9).
            # An `unknown` operation holds its barrier (the CHECK on `barrier`): found through
            # the barrier's index, the source's few holders (schema v23).
            unresolved = [
                str(r[0])
                for r in tx.conn.execute(
                    "SELECT operation_id FROM fork_operations INDEXED BY"
                    " fork_operations_barrier_held WHERE workspace_id = ?"
                    " AND source_session_id = ? AND barrier = 1 AND status = 'unknown'"
                    " ORDER BY op_seq",
                    (ws, sid),
                )
            ]
            if unresolved:
                raise ForkUnresolved(
                    f"session {sid} has {len(unresolved)} unresolved fork operation(s)"
                    f" ({', '.join(unresolved)}) whose evidence lives with it: resolve them"
                    " first (fork.resolve: inspect, then adopt or abandon; in the CLI"
                    " `agenthost resolve <operation>`)",
                    params={"operationIds": unresolved},
                )
            tx.execute(
                "UPDATE sessions SET deleted = 1, updated_at_ms = ? WHERE workspace_id = ?"
                " AND session_id = ?",
                (tx.now_ms, ws, sid),
            )
            users: list[str] = []
            path = ""
            if removing_tree is not None:
                row = tx.one(
                    "SELECT workspace_json FROM fork_operations WHERE workspace_id = ?"
                    " AND operation_id = ? AND target_session_id = ?"
                    " AND workspace_state = 'made'",
                    (ws, removing_tree, sid),
                )
                plan = loads(row[0]) if row is not None and row[0] else None
                path = str(plan.get("path") or "") if isinstance(plan, Mapping) else ""
                users = tree_users_in(tx.all, ws, sid, path) if path else []
            if removing_tree is not None and not users:
                # Its path kept beside, indexed: `session.create` refuses a cwd in it
                # (`deleted_tree_at`).
                tx.execute(
                    "UPDATE fork_operations SET workspace_state = 'removing',"
                    " deleted_tree_path = ? WHERE workspace_id = ? AND operation_id = ?"
                    " AND target_session_id = ? AND workspace_state = 'made'",
                    (path or None, ws, removing_tree, sid),
                )
            tx.emit(SessionChanged(ws, sid, removed=True))
            return users

    def deleted_sessions(self) -> list[tuple[str, str]]:
        """`(workspace, session)` of every deleted Session (start-up sweeps their runtimes)."""
        rows = self._with_conn(
            lambda c: c.execute(
                "SELECT workspace_id, session_id FROM sessions INDEXED BY sessions_deleted"
                " WHERE deleted = 1"
            ).fetchall()
        )
        return [(str(ws), str(sid)) for ws, sid in rows]

    def runtime_owners(self) -> list[tuple[str, str]]:
        """`(workspace, session)` of every Session (live or deleted) and of every fork target
        not `failed` or `abandoned` (its reservation: an operation holds it from its prepare
        until it fails or is abandoned): whose runtime directory the start-up sweep keeps."""
        rows = self._with_conn(
            lambda c: c.execute(
                "SELECT workspace_id, session_id FROM sessions"
                " UNION SELECT workspace_id, session_id FROM session_reservations"
            ).fetchall()
        )
        return [(str(ws), str(sid)) for ws, sid in rows]

    def runtime_owners_among(self, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        """`runtime_owners` narrowed to the given session ids (in any workspace): the sweep's
        candidate folders, each looked up by the key of the sessions and of the reservations
        (workspace, session) in every workspace (workspaces are few) — no row read per stored
        Session or fork operation."""
        if not session_ids:
            return []
        ids = dumps(list(session_ids))
        rows = self._with_conn(lambda c: c.execute(RUNTIME_OWNERS_AMONG_SQL, (ids,)).fetchall())
        return [(str(ws), str(sid)) for ws, sid in rows]

    def update_runtime(
        self,
        ws: str,
        sid: str,
        *,
        provider_session_id: str | None = None,
        runtime_context: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> Session:
        """Record what the provider runtime reported; `runtime_context` is merged (shallow)."""
        with self._write(ws, fence=sid) as tx:
            session = require_session(tx.conn, ws, sid)
            context = dict(session.runtime_context)
            if runtime_context is not None:
                context.update(require_mapping("runtimeContext", runtime_context))
            tx.execute(
                "UPDATE sessions SET provider_session_id = COALESCE(?, provider_session_id),"
                " runtime_context_json = ?, model = COALESCE(?, model)"
                " WHERE workspace_id = ? AND session_id = ?",
                (provider_session_id, dumps(context), model, ws, sid),
            )
            touch(tx, ws, sid)
            return written(tx, require_session(tx.conn, ws, sid))


RUNTIME_OWNERS_AMONG_SQL = (
    "WITH candidate(sid) AS (SELECT value FROM json_each(?1))"
    " SELECT s.workspace_id, s.session_id FROM workspaces AS w"
    " CROSS JOIN candidate AS k"
    " CROSS JOIN sessions AS s ON s.workspace_id = w.workspace_id AND s.session_id = k.sid"
    " UNION SELECT r.workspace_id, r.session_id FROM workspaces AS w"
    " CROSS JOIN candidate AS k"
    " CROSS JOIN session_reservations AS r"
    " ON r.workspace_id = w.workspace_id AND r.session_id = k.sid"
)
"""`runtime_owners_among`'s read (`?1`: the ids, a JSON array): each candidate looked up by the
primary keys of `sessions` and `session_reservations` in each workspace. A fork target's
reservation stands for its operation (the `reservation` law): `fork_operations` has no index
on its target, so asking it was a scan of every operation the store ever had."""


def _update_live(tx: Tx, ws: str, sid: str, assignment: str, value: object) -> Session:
    """`require_live_session`, one column's UPDATE and `touch` as one statement: a client's
    rename or pin runs its body inside the writer baton, where each SQLite call lets the GIL go
    and takes it back behind whichever thread holds it (three calls were two GIL hand-offs
    more for every queued writer to wait behind). Returns the Session as written, which its
    change event carries (the events thread projects it without reading it back)."""
    tx.execute(
        f"UPDATE sessions SET {assignment}, updated_at_ms = ? WHERE workspace_id = ?"
        " AND session_id = ? AND deleted = 0",
        (value, tx.now_ms, ws, sid),
    )
    if tx.changes() != 1:
        raise SessionNotFound(f"session {sid} not found")
    return written(tx, require_session(tx.conn, ws, sid))


def written(tx: Tx, session: Session) -> Session:
    """Emit `session`'s change carrying it: the caller's write read it after its last change
    of the row and changes the row no further (docs/design/store.md, "Change events that
    carry their row")."""
    tx.emit(SessionChanged(session.workspace_id, session.session_id, row=session, seq=tx.seq))
    return session
