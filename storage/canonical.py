"""Canonical Session history: sessions, Turns, Messages, Interactions, goal control, runtime
operations and submit claims, each write in one fenced transaction.

Fenced writes call `_write(ws, fence=sid)` (or `tx.check_fence` after an idempotent replay
check), so an active fork operation on the Session rejects them inside the same transaction.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

import apsw

from storage.base import StoreBase, Tx, dumps
from storage.errors import (
    Conflict,
    InteractionNotFound,
    InvalidArgument,
    NotFound,
    SessionBusy,
    SessionIdTaken,
    SessionNotFound,
    TurnNotFound,
)
from storage.models import (
    Interaction,
    InteractionStatus,
    Message,
    SequenceProvenance,
    Session,
    SessionChanged,
    SessionKind,
    Turn,
    TurnChanged,
    TurnOutcome,
    TurnPhase,
)
from storage.rows import (
    INTERACTION_COLUMNS,
    MESSAGE_COLUMNS,
    SESSION_SELECT,
    TURN_COLUMNS,
    hydrate_turns,
    interaction_from_row,
    message_from_row,
    session_from_row,
    turn_from_row,
)

# A session.list cursor's time part: at most 15 ASCII digits (well inside int64).
_CURSOR_MS = re.compile(r"[0-9]{1,15}")


def _require_text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(field, f"{field} must be a non-empty string")
    return value


def _require_mapping(field: str, value: object) -> Mapping[str, Any]:
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


def load_turn(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Turn | None:
    row = conn.execute(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, sid, turn_id),
    ).fetchone()
    if row is None:
        return None
    return hydrate_turns(conn, ws, sid, [row])[0]


def require_turn(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Turn:
    turn = load_turn(conn, ws, sid, turn_id)
    if turn is None:
        raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
    return turn


def _turn_row(tx: Tx, ws: str, sid: str, turn_id: str) -> Turn:
    row = tx.one(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, sid, turn_id),
    )
    if row is None:
        raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
    return turn_from_row(row)


def _touch(tx: Tx, ws: str, sid: str) -> None:
    tx.execute(
        "UPDATE sessions SET updated_at_ms = ? WHERE workspace_id = ? AND session_id = ?",
        (tx.now_ms, ws, sid),
    )
    tx.emit(SessionChanged(ws, sid))


def _finish_claims(tx: Tx, ws: str, sid: str, turn_id: str) -> None:
    tx.execute(
        "UPDATE submit_claims SET status = 'finished', finished_at_ms = ?"
        " WHERE workspace_id = ? AND session_id = ? AND turn_id = ? AND status = 'active'",
        (tx.now_ms, ws, sid, turn_id),
    )


def _next_position(tx: Tx, ws: str, sid: str) -> int:
    row = tx.one(
        "SELECT COALESCE(MAX(position), 0) + 1 FROM messages WHERE workspace_id = ?"
        " AND session_id = ?",
        (ws, sid),
    )
    return int(row[0]) if row else 1


class CanonicalStore(StoreBase):
    """Sessions and their history; mixed into `storage.Store`."""

    # -- sessions ----------------------------------------------------------------------------

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
        _require_text("workspaceId", ws)
        _require_text("agentSessionId", session_id)
        _require_text("provider", provider)
        if kind not in SessionKind.__members__.values():
            raise InvalidArgument("kind", f"unknown session kind {kind!r}")
        settings = _require_mapping("settings", settings)
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
            tx.execute(
                "INSERT INTO sessions (workspace_id, session_id, kind, provider,"
                " provider_session_id, title, cwd, settings_json, runtime_context_json, model,"
                " pinned, deleted, goal, parent_session_id, parent_turn_id, rail_placement,"
                " visibility, created_at_ms, updated_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, ?, ?, ?, ?, ?, ?)",
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
                ),
            )
            tx.emit(SessionChanged(ws, session_id))
            return require_session(tx.conn, ws, session_id)

    def get_session(self, ws: str, sid: str) -> Session:
        return self._with_conn(lambda c: require_session(c, ws, sid))

    def find_session(self, ws: str, sid: str) -> Session | None:
        return self._with_conn(lambda c: load_session(c, ws, sid))

    def list_sessions(
        self, ws: str, *, cursor: str | None = None, limit: int = 50
    ) -> tuple[list[Session], str | None]:
        """Live Sessions in stable (created, id) order; `cursor` is the opaque next page key."""
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
        rows = self._all(
            SESSION_SELECT + " WHERE s.workspace_id = ? AND s.deleted = 0"
            " AND (s.created_at_ms > ? OR (s.created_at_ms = ? AND s.session_id > ?))"
            " ORDER BY s.created_at_ms, s.session_id LIMIT ?",
            (ws, after_created, after_created, after_id, limit + 1),
        )
        sessions = [session_from_row(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = sessions[-1]
            next_cursor = f"{last.created_at_ms}:{last.session_id}"
        return sessions, next_cursor

    def update_settings(self, ws: str, sid: str, settings: Mapping[str, Any]) -> Session:
        settings = _require_mapping("settings", settings)
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            tx.execute(
                "UPDATE sessions SET settings_json = ? WHERE workspace_id = ? AND session_id = ?",
                (dumps(dict(settings)), ws, sid),
            )
            _touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)

    def update_title(self, ws: str, sid: str, title: str) -> Session:
        # Not fenced: the snapshot froze the child title at prepare (seed 000 §6.2).
        if not isinstance(title, str):
            raise InvalidArgument("title", "title must be a string")
        with self._write(ws) as tx:
            require_session(tx.conn, ws, sid)
            tx.execute(
                "UPDATE sessions SET title = ? WHERE workspace_id = ? AND session_id = ?",
                (title, ws, sid),
            )
            _touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)

    def set_pinned(self, ws: str, sid: str, pinned: bool) -> Session:
        # Not fenced: pin is never inherited by a fork child.
        with self._write(ws) as tx:
            require_session(tx.conn, ws, sid)
            tx.execute(
                "UPDATE sessions SET pinned = ? WHERE workspace_id = ? AND session_id = ?",
                (1 if pinned else 0, ws, sid),
            )
            _touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)

    def delete_session(self, ws: str, sid: str) -> None:
        """Soft delete: the id stays taken, history stays for committed fork projections."""
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            # A Turn still running would never settle once its Session is gone (issue 15
            # defect 9): interrupt it first.
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
            tx.execute(
                "UPDATE sessions SET deleted = 1, updated_at_ms = ? WHERE workspace_id = ?"
                " AND session_id = ?",
                (tx.now_ms, ws, sid),
            )
            tx.emit(SessionChanged(ws, sid, removed=True))

    def deleted_sessions(self) -> list[tuple[str, str]]:
        """`(workspace, session)` of every deleted Session (start-up sweeps their runtimes)."""
        rows = (
            self._conn()
            .execute("SELECT workspace_id, session_id FROM sessions WHERE deleted = 1")
            .fetchall()
        )
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
                context.update(_require_mapping("runtimeContext", runtime_context))
            tx.execute(
                "UPDATE sessions SET provider_session_id = COALESCE(?, provider_session_id),"
                " runtime_context_json = ?, model = COALESCE(?, model)"
                " WHERE workspace_id = ? AND session_id = ?",
                (provider_session_id, dumps(context), model, ws, sid),
            )
            _touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)

    # -- goal control and runtime operations ---------------------------------------------------

    def set_goal(self, ws: str, sid: str, goal: str) -> Session:
        _require_text("goal", goal)
        return self._apply_goal(ws, sid, "set", goal)

    def clear_goal(self, ws: str, sid: str) -> Session:
        return self._apply_goal(ws, sid, "clear", None)

    def _apply_goal(self, ws: str, sid: str, action: str, goal: str | None) -> Session:
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            tx.execute(
                "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal,"
                " status, created_at_ms, finished_at_ms) VALUES (?, ?, ?, ?, ?, 'finished', ?, ?)",
                (ws, sid, str(uuid.uuid4()), action, goal, tx.now_ms, tx.now_ms),
            )
            tx.execute(
                "UPDATE sessions SET goal = ? WHERE workspace_id = ? AND session_id = ?",
                (goal, ws, sid),
            )
            _touch(tx, ws, sid)
            return require_session(tx.conn, ws, sid)

    def begin_goal_control(self, ws: str, sid: str, action: str, goal: str | None = None) -> str:
        """Open a goal-control operation that spans a provider call (blocks forks until done)."""
        if action not in ("set", "clear"):
            raise InvalidArgument("action", "goal control action must be 'set' or 'clear'")
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            control_id = str(uuid.uuid4())
            tx.execute(
                "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal,"
                " status, created_at_ms) VALUES (?, ?, ?, ?, ?, 'active', ?)",
                (ws, sid, control_id, action, goal, tx.now_ms),
            )
            return control_id

    def finish_goal_control(self, ws: str, control_id: str, *, apply: bool = True) -> Session:
        """Finish a goal control; `apply` writes its goal to the Session. Idempotent."""
        with self._write(ws) as tx:
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
                _touch(tx, ws, sid)
            session = load_session(tx.conn, ws, sid, include_deleted=True)
            assert session is not None  # FK guarantees the row
            return session

    def begin_runtime_operation(self, ws: str, sid: str, kind: str) -> str:
        _require_text("kind", kind)
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            op_id = str(uuid.uuid4())
            tx.execute(
                "INSERT INTO runtime_operations (workspace_id, session_id, operation_id, kind,"
                " status, created_at_ms) VALUES (?, ?, ?, ?, 'active', ?)",
                (ws, sid, op_id, kind, tx.now_ms),
            )
            return op_id

    def finish_runtime_operation(self, ws: str, op_id: str) -> None:
        # Not fenced: finishing can never be what a frozen snapshot depends on.
        with self._write(ws) as tx:
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

    # -- turns ---------------------------------------------------------------------------------

    def claim_submit(self, ws: str, sid: str, request_id: str, text: str) -> tuple[Turn, bool]:
        """Idempotent `turn.submit`: a claim, an active Turn and its user Message, atomically."""
        _require_text("requestId", request_id)
        if not isinstance(text, str):
            raise InvalidArgument("input", "text must be a string")
        with self._write(ws) as tx:
            require_session(tx.conn, ws, sid)
            claimed = tx.one(
                "SELECT turn_id FROM submit_claims WHERE workspace_id = ? AND session_id = ?"
                " AND request_id = ?",
                (ws, sid, request_id),
            )
            if claimed is not None:
                # A replay is a read, so it is answered even while the fence holds.
                return require_turn(tx.conn, ws, sid, claimed[0]), False
            tx.check_fence(sid)
            active = tx.one(
                "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND phase = 'active' LIMIT 1",
                (ws, sid),
            )
            if active is not None:
                raise SessionBusy(
                    f"session {sid} already has an active turn", params={"turnId": active[0]}
                )
            seq_row = tx.one(
                "SELECT COALESCE(MAX(sequence), 0) + 1 FROM turns WHERE workspace_id = ?"
                " AND session_id = ?",
                (ws, sid),
            )
            sequence = int(seq_row[0]) if seq_row else 1
            turn_id = str(uuid.uuid4())
            tx.execute(
                f"INSERT INTO turns ({TURN_COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, 'active', NULL, NULL, NULL, NULL, NULL, ?, NULL)",
                (ws, sid, turn_id, sequence, SequenceProvenance.HOST.value, tx.now_ms),
            )
            tx.execute(
                "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
                " payload_json, version, position, created_at_ms)"
                " VALUES (?, ?, ?, ?, 'user', ?, '{}', 1, ?, ?)",
                (ws, sid, str(uuid.uuid4()), turn_id, text, _next_position(tx, ws, sid), tx.now_ms),
            )
            tx.execute(
                "INSERT INTO submit_claims (workspace_id, session_id, request_id, turn_id, text,"
                " status, created_at_ms) VALUES (?, ?, ?, ?, ?, 'active', ?)",
                (ws, sid, request_id, turn_id, text, tx.now_ms),
            )
            tx.emit(TurnChanged(ws, sid, turn_id))
            _touch(tx, ws, sid)
            return require_turn(tx.conn, ws, sid, turn_id), True

    def bind_provider_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        root_provider_turn_id: str,
        binding_json: str | None = None,
    ) -> Turn:
        """Record the provider's own Turn id (and binding) and finish the submit claim."""
        _require_text("rootProviderTurnId", root_provider_turn_id)
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            turn = _turn_row(tx, ws, sid, turn_id)
            if turn.root_provider_turn_id not in (None, root_provider_turn_id):
                raise Conflict(
                    f"turn {turn_id} is already bound to provider turn {turn.root_provider_turn_id}"
                )
            tx.execute(
                "UPDATE turns SET root_provider_turn_id = ?,"
                " provider_turn_binding_json = COALESCE(?, provider_turn_binding_json)"
                " WHERE workspace_id = ? AND session_id = ? AND turn_id = ?",
                (root_provider_turn_id, binding_json, ws, sid, turn_id),
            )
            _finish_claims(tx, ws, sid, turn_id)
            tx.emit(TurnChanged(ws, sid, turn_id))
            return require_turn(tx.conn, ws, sid, turn_id)

    def turns_missing_binding(self, ws: str, sid: str) -> list[str]:
        """Settled `completed` Turns with no provider turn id (a binding the host never
        recorded), in sequence order: candidates for a re-bind from the provider's history."""
        rows = self._all(
            "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND phase = 'settled' AND outcome = 'completed' AND root_provider_turn_id IS NULL"
            " ORDER BY sequence",
            (ws, sid),
        )
        return [str(r[0]) for r in rows]

    def update_turn_binding(self, ws: str, sid: str, turn_id: str, binding_json: str) -> Turn:
        """Replace the opaque provider binding JSON; allowed on settled Turns (late checkpoints)."""
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            _turn_row(tx, ws, sid, turn_id)
            tx.execute(
                "UPDATE turns SET provider_turn_binding_json = ? WHERE workspace_id = ?"
                " AND session_id = ? AND turn_id = ?",
                (binding_json, ws, sid, turn_id),
            )
            tx.emit(TurnChanged(ws, sid, turn_id))
            return require_turn(tx.conn, ws, sid, turn_id)

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
        _require_text("kind", kind)
        payload_json = dumps(dict(_require_mapping("payload", payload or {})))
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            if turn_id is not None:
                _turn_row(tx, ws, sid, turn_id)
            if message_id is not None:
                existing = tx.one(
                    "SELECT turn_id FROM messages WHERE workspace_id = ? AND session_id = ?"
                    " AND message_id = ?",
                    (ws, sid, message_id),
                )
                if existing is not None:
                    if existing[0] != turn_id:
                        raise Conflict(f"message {message_id} belongs to another turn")
                    tx.execute(
                        "UPDATE messages SET kind = ?, text = ?, payload_json = ?,"
                        " version = version + 1 WHERE workspace_id = ? AND session_id = ?"
                        " AND message_id = ?",
                        (kind, text, payload_json, ws, sid, message_id),
                    )
                    return self._message_after(tx, ws, sid, message_id, turn_id)
            message_id = message_id or str(uuid.uuid4())
            tx.execute(
                "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
                " payload_json, version, position, created_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                (
                    ws,
                    sid,
                    message_id,
                    turn_id,
                    kind,
                    text,
                    payload_json,
                    _next_position(tx, ws, sid),
                    tx.now_ms,
                ),
            )
            return self._message_after(tx, ws, sid, message_id, turn_id)

    def _message_after(
        self, tx: Tx, ws: str, sid: str, message_id: str, turn_id: str | None
    ) -> Message:
        row = tx.one(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE workspace_id = ? AND session_id = ?"
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
        _require_text("requestId", request_id)
        _require_text("kind", kind)
        input_json = dumps(dict(_require_mapping("input", input)))
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            turn = _turn_row(tx, ws, sid, turn_id)
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
        self, ws: str, sid: str, turn_id: str, request_id: str, output: Mapping[str, Any]
    ) -> Interaction:
        output_json = dumps(dict(_require_mapping("response", output)))
        with self._write(ws, fence=sid) as tx:
            require_session(tx.conn, ws, sid)
            row = tx.one(
                "SELECT interaction_id, status FROM interactions WHERE workspace_id = ?"
                " AND session_id = ? AND turn_id = ? AND request_id = ?",
                (ws, sid, turn_id, request_id),
            )
            if row is None:
                raise InteractionNotFound(f"interaction {request_id} not found in turn {turn_id}")
            if row[1] != InteractionStatus.PENDING:
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

    def settle_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        *,
        outcome: str,
        final_assistant_message_id: str | None = None,
        error: str | None = None,
        include_deleted: bool = False,
    ) -> tuple[Turn, bool]:
        """Settle an active Turn; a second settle is `changed=False` and keeps the first result.
        `include_deleted`: recovery settles a Turn a deleted Session left active (an older
        daemon allowed deleting mid-turn), so it stops failing at every start."""
        if outcome not in TurnOutcome.__members__.values():
            raise InvalidArgument("outcome", f"unknown outcome {outcome!r}")
        with self._write(ws) as tx:
            if load_session(tx.conn, ws, sid, include_deleted=include_deleted) is None:
                raise SessionNotFound(f"session {sid} not found")
            turn = _turn_row(tx, ws, sid, turn_id)
            if turn.phase == TurnPhase.SETTLED:
                return require_turn(tx.conn, ws, sid, turn_id), False
            tx.check_fence(sid)
            if final_assistant_message_id is not None:
                owner = tx.one(
                    "SELECT turn_id FROM messages WHERE workspace_id = ? AND session_id = ?"
                    " AND message_id = ?",
                    (ws, sid, final_assistant_message_id),
                )
                # A dangling final message id would make the turn unforkable (law 5).
                if owner is None or owner[0] != turn_id:
                    raise InvalidArgument(
                        "finalAssistantMessageId", "final assistant message is not in this turn"
                    )
            tx.execute(
                "UPDATE turns SET phase = 'settled', outcome = ?, final_assistant_message_id = ?,"
                " error = ?, settled_at_ms = ? WHERE workspace_id = ? AND session_id = ?"
                " AND turn_id = ?",
                (outcome, final_assistant_message_id, error, tx.now_ms, ws, sid, turn_id),
            )
            tx.execute(
                "UPDATE interactions SET status = 'superseded', resolved_at_ms = ?"
                " WHERE workspace_id = ? AND session_id = ? AND turn_id = ? AND status = 'pending'",
                (tx.now_ms, ws, sid, turn_id),
            )
            _finish_claims(tx, ws, sid, turn_id)
            tx.emit(TurnChanged(ws, sid, turn_id))
            _touch(tx, ws, sid)
            return require_turn(tx.conn, ws, sid, turn_id), True

    def get_turn(self, ws: str, sid: str, turn_id: str) -> Turn:
        with self._read() as conn:
            require_session(conn, ws, sid)
            return require_turn(conn, ws, sid, turn_id)

    def timeline(
        self, ws: str, sid: str, *, after_sequence: int = 0, limit: int = 100
    ) -> tuple[list[Turn], int | None]:
        """Turns after `after_sequence` in order; `next_sequence` is set when more remain."""
        if not 1 <= limit <= 100_000:
            raise InvalidArgument("limit", "limit must be between 1 and 100000")
        with self._read() as conn:
            require_session(conn, ws, sid)
            rows = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND sequence > ? ORDER BY sequence LIMIT ?",
                (ws, sid, after_sequence, limit + 1),
            ).fetchall()
            turns = hydrate_turns(conn, ws, sid, rows[:limit])
        next_sequence = turns[-1].sequence if len(rows) > limit else None
        return turns, next_sequence

    def active_turn(self, ws: str, sid: str) -> Turn | None:
        with self._read() as conn:
            session = require_session(conn, ws, sid)
            if session.active_turn_id is None:
                return None
            return load_turn(conn, ws, sid, session.active_turn_id)

    def all_active_turns(self) -> list[tuple[str, str, str]]:
        """(workspace, session, turn) of every active Turn, across workspaces: at start-up
        these are orphans of the previous process, whose provider runtimes died with it."""
        rows = self._all(
            "SELECT workspace_id, session_id, turn_id FROM turns WHERE phase = 'active'"
            " ORDER BY workspace_id, session_id, sequence"
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def session_messages(self, ws: str, sid: str) -> list[Message]:
        """Every Message of a Session in presentation order (session-level ones included)."""
        with self._read() as conn:
            require_session(conn, ws, sid)
            return [
                message_from_row(r)
                for r in conn.execute(
                    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE workspace_id = ?"
                    " AND session_id = ? ORDER BY position",
                    (ws, sid),
                )
            ]


__all__ = ["CanonicalStore", "InteractionNotFound", "SessionIdTaken"]
