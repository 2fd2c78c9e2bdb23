"""Turns: the idempotent submit claim (Turn + user Message + claim in one transaction), provider
turn bindings (seed 000 §10, including late re-binding), settle, and the Turn reads.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import fields
from operator import attrgetter
from typing import Any

from domain.enums import TurnOutcome
from domain.errors import (
    Conflict,
    ForkInProgress,
    InvalidArgument,
    SessionBusy,
    TurnNotFound,
    TurnRequestConflict,
)
from storage.base import Database
from storage.models import (
    Message,
    NewMessage,
    SequenceProvenance,
    Turn,
    TurnBound,
    TurnChanged,
    TurnPhase,
)
from storage.rows import (
    NEXT_POSITION,
    TURN_COLUMNS,
    finish_claims,
    insert_message,
    load_turn,
    next_position,
    position_of,
    require_live,
    require_live_session,
    require_mapping,
    require_session,
    require_text,
    require_turn,
    touch,
    turn_row,
)
from storage.schema import SESSION_KEY_OF
from storage.sqlite import Tx, dumps

_HOST = SequenceProvenance.HOST.value
_ACTIVE = TurnPhase.ACTIVE.value
"""A claimed Turn's provenance and phase, read once (an enum member's `.value` is two Python
calls, and a claim runs inside the writer's baton)."""

_CLAIM_READ = (
    "SELECT s.deleted,"
    " (SELECT turn_id FROM submit_claims WHERE workspace_id = ? AND session_id = ?"
    " AND request_id = ?),"
    " (SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
    " AND phase = 'active' LIMIT 1),"
    " (SELECT COALESCE(MAX(sequence), 0) + 1 FROM turns WHERE workspace_id = ?"
    " AND session_id = ?),"
    f" {NEXT_POSITION}"
    " FROM sessions s WHERE s.workspace_id = ? AND s.session_id = ?"
)
"""A submit claim's reads: the Session's `deleted`, the request's claimed Turn, the active
Turn, the next Turn sequence, the next Message position (`NEXT_POSITION`). The fence stays a
statement of its own: folded in as one more subquery it cost the statement ~5-8 us more CPU
than its own ~3 us statement (docs/performance.md, baton)."""


class TurnStore:
    """Turns, their bindings and their settlement."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._submit = db.submit_write
        self._read = db.read
        self._all = db.rows

    def claim_submit(
        self, ws: str, sid: str, request_id: str, text: str, turn_id: str | None = None
    ) -> tuple[Turn, bool]:
        """Idempotent `turn.submit`: a claim, an active Turn and its user Message, atomically.
        `turn_id`: the id a new Turn gets (the caller may already work under it, e.g. its
        `before` checkpoint); a new one when None. A replay answers the claimed Turn."""
        require_text("requestId", request_id)
        if not isinstance(text, str):
            raise InvalidArgument("input", "text must be a string")
        # Its ids and column values made before the writer's baton, not inside the body (a
        # replay answers the claimed Turn and drops them).
        new_turn_id, message_id = turn_id or str(uuid.uuid4()), str(uuid.uuid4())

        def body(tx: Tx) -> tuple[Turn, bool]:
            # What the claim reads, as one statement: the Session live, a claim of this
            # request, the active Turn, the next sequence and the next Message position.
            read = tx.one(_CLAIM_READ, (ws, sid, request_id, ws, sid, ws, sid, ws, sid, ws, sid))
            deleted, claimed, active, next_sequence, next_at = read or (None,) * 5
            require_live(sid, deleted)  # no row: `deleted` None, not found
            if claimed is not None:
                # A replay is a read, so it is answered even while the fence holds. Its text
                # read here only: a replay is rare, the claim's read stays one statement.
                claimed_text = tx.one(
                    "SELECT text FROM submit_claims WHERE workspace_id = ? AND session_id = ?"
                    " AND request_id = ?",
                    (ws, sid, request_id),
                )
                if claimed_text is None or claimed_text[0] != text:
                    raise TurnRequestConflict(
                        f"request {request_id} was used for another input (Turn {claimed})",
                        params={"turnId": claimed},
                    )
                return require_turn(tx.conn, ws, sid, claimed), False
            tx.check_fence(sid)
            if active is not None:
                raise SessionBusy(
                    f"session {sid} already has an active turn", params={"turnId": active}
                )
            sequence = int(next_sequence)
            turn_id = new_turn_id
            position = position_of(next_at)
            tx.execute(
                f"INSERT INTO turns ({TURN_COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, 'active', NULL, NULL, NULL, NULL, NULL, ?, NULL, NULL, 0)",
                (ws, sid, turn_id, sequence, _HOST, tx.now_ms),
            )
            tx.execute(
                "INSERT INTO messages (session_key, workspace_id, session_id, message_id, turn_id,"
                " kind, text, payload_json, version, position, created_at_ms)"
                f" VALUES ({SESSION_KEY_OF}, ?, ?, ?, ?, 'user', ?, '{{}}', 1, ?, ?)",
                (ws, sid, ws, sid, message_id, turn_id, text, position, tx.now_ms),
            )
            tx.execute(
                "INSERT INTO submit_claims (workspace_id, session_id, request_id, turn_id, text,"
                " status, created_at_ms) VALUES (?, ?, ?, ?, ?, 'active', ?)",
                (ws, sid, request_id, turn_id, text, tx.now_ms),
            )
            # The Turn as just inserted, built here instead of read back (a
            # read-back and its hydration would run inside the writer's baton on every submit);
            # `test_store_canonical` pins it equal to a fresh read. Its event carries it, so
            # the events thread publishes the claim without reading the Turn back.
            user = Message(message_id, turn_id, "user", text, {}, 1, position)
            turn = Turn(
                ws, sid, turn_id, sequence, _HOST, _ACTIVE,
                None, None, None, None, None, tx.now_ms, None, (user,), (),
            )  # fmt: skip
            tx.emit(TurnChanged(ws, sid, turn_id, row=turn, seq=tx.seq))
            touch(tx, ws, sid, claimed=turn_id)
            return turn, True

        return self._submit(body, ws)

    def bind_provider_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        root_provider_turn_id: str,
        binding_json: str | None = None,
    ) -> Turn:
        """Record the provider's own Turn id (and binding) and finish the submit claim."""
        require_text("rootProviderTurnId", root_provider_turn_id)
        with self._write(ws, fence=sid) as tx:
            _bind(tx, ws, sid, turn_id, root_provider_turn_id, binding_json)
            return require_turn(tx.conn, ws, sid, turn_id)

    def record_provider_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        root_provider_turn_id: str,
        binding_json: str | None = None,
    ) -> None:
        """`bind_provider_turn` for a caller that needs nothing back (the Session actor): the
        same write and event, without reading the whole Turn back inside the writer's baton
        (its Messages and Interactions would be hydrated only to be dropped)."""
        require_text("rootProviderTurnId", root_provider_turn_id)
        with self._write(ws, fence=sid) as tx:
            _bind(tx, ws, sid, turn_id, root_provider_turn_id, binding_json)

    def mark_host_only(self, ws: str, sid: str, turn_id: str) -> bool:
        """Mark a settled Turn host-only after the fact: the re-bind read a *final* provider
        history that holds no Turn for it (actors/rebind.py `prove_absent`), so its
        `turn.start` never reached the provider. Its own statement, fenced as the re-bind's
        binds are; only a settled, not `completed`, unbound Turn not marked yet is marked (a
        Turn the provider named, or one that answered, never is). Whether this write marked
        it (False: it was not such a Turn, or was marked already)."""
        with self._write(ws, fence=sid) as tx:
            require_live_session(tx.conn, ws, sid)
            turn_row(tx, ws, sid, turn_id)
            tx.execute(
                "UPDATE turns SET host_only = 1 WHERE workspace_id = ? AND session_id = ?"
                " AND turn_id = ? AND phase = 'settled' AND outcome != 'completed'"
                " AND root_provider_turn_id IS NULL AND host_only = 0",
                (ws, sid, turn_id),
            )
            if tx.changes() != 1:
                return False
            tx.emit(TurnChanged(ws, sid, turn_id))
            return True

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

    def has_bound_turn(self, ws: str, sid: str) -> bool:
        """Whether a Turn of the Session carries its provider turn id: the provider's
        history of the Session holds a Turn of it."""
        rows = self._all(
            "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND root_provider_turn_id IS NOT NULL LIMIT 1",
            (ws, sid),
        )
        return bool(rows)

    def last_completed_provider_turn(self, ws: str, sid: str) -> str | None:
        """The provider turn id of the Session's last Turn (by sequence) settled `completed`
        with one: the Turn whose end the provider's history must still hold."""
        rows = self._all(
            "SELECT root_provider_turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND phase = 'settled' AND outcome = 'completed'"
            " AND root_provider_turn_id IS NOT NULL ORDER BY sequence DESC LIMIT 1",
            (ws, sid),
        )
        return str(rows[0][0]) if rows else None

    def unanswered_turns_missing_binding(self, ws: str, sid: str) -> list[str]:
        """Settled Turns not `completed` with no provider turn id, in sequence order: a Turn
        the provider ran (and perhaps answered) whose bind was lost with a killed daemon, which
        recovery settled `interrupted`, is among them — a re-bind candidate like those of
        `turns_missing_binding` (one the provider never got simply matches nothing; one the
        host knows it never got, `host_only`, is not asked about)."""
        rows = self._all(
            "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND phase = 'settled' AND outcome != 'completed' AND root_provider_turn_id IS NULL"
            " AND host_only = 0 ORDER BY sequence",
            (ws, sid),
        )
        return [str(r[0]) for r in rows]

    def record_turn_binding(self, ws: str, sid: str, turn_id: str, binding_json: str) -> None:
        """Replace the opaque provider binding JSON; allowed on settled Turns (late
        checkpoints). Nothing is read back (the Session actor's, as `record_provider_turn`)."""
        with self._write(ws, fence=sid) as tx:
            _rebind(tx, ws, sid, turn_id, binding_json)

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
        if outcome not in _OUTCOMES:
            raise InvalidArgument("outcome", f"unknown outcome {outcome!r}")

        def body(tx: Tx) -> tuple[Turn, bool]:
            changed = _settle(
                tx, ws, sid, turn_id, outcome, final_assistant_message_id, error, include_deleted
            )
            return require_turn(tx.conn, ws, sid, turn_id), changed

        return self._submit(body, ws)

    def record_settlement(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        *,
        outcome: str,
        final_assistant_message_id: str | None = None,
        error: str | None = None,
        checkpoint_json: str | None = None,
        turn: Turn | None = None,
        bound: TurnBound | None = None,
        messages: tuple[NewMessage, ...] = (),
        host_only: bool = False,
    ) -> bool:
        """`settle_turn` without the read-back (the Session actor's, as
        `record_provider_turn`): whether this write settled it (False: it already was).
        `checkpoint_json`: the Turn's workspace checkpoint record, written in the same
        transaction, so a settled Turn is never seen without its `after` checkpoint.
        `bound`: the provider bind and binding its caller had queued and not yet written,
        set by this write's own statement, exactly as `record_provider_turn` and
        `record_turn_binding` would have set them just before it (design/store.md, "A Turn's
        start writes in its settlement").
        `turn`: the active Turn exactly as the store holds it before this write (its claim's
        row with every write of it since applied, built by its only writer, the Session
        actor): the settled Turn is built from it and carried by the change event, so the
        events thread publishes it without reading it back (design/store.md, "A Turn's claim
        and settlement carry their Turn"). None, or a Turn with Interactions (the settlement
        supersedes the pending ones in SQL): read back.
        `messages`: the Turn's new Messages its caller had queued and not yet written (its
        reply), inserted by this write first, in order, as the lone appends would have inserted
        them just before it (design/store.md, "A Turn's reply in its settlement").
        `host_only`: the Turn's `turn.start` was provably never sent (its caller knows: the
        runtime's preparation failed, or the link answered "not sent"), so the provider's
        thread holds no Turn for it; marked by this write, it is left out of a fork's provider
        prefix (design/store.md, "A Turn the provider never got"). Ignored with a `bound`
        provider turn id (the provider named the Turn: it got it)."""
        if outcome not in _OUTCOMES:
            raise InvalidArgument("outcome", f"unknown outcome {outcome!r}")
        carried = turn if turn is not None and _carriable(turn, ws, sid, turn_id) else None
        rows = []
        for m in messages:  # checked as `append_message` checks them, off the baton
            require_text("kind", m.kind)
            rows.append((m, dumps(dict(require_mapping("payload", m.payload)))))

        def body(tx: Tx) -> bool:
            return _settle(
                tx,
                ws,
                sid,
                turn_id,
                outcome,
                final_assistant_message_id,
                error,
                False,
                checkpoint_json=checkpoint_json,
                carried=carried,
                bound=bound,
                messages=tuple(rows),
                host_only=host_only,
            )

        return self._submit(body, ws)

    def newest_settled_turn_id(self, ws: str, sid: str) -> str | None:
        """The Session's newest settled Turn (None if it has none)."""
        with self._read() as conn:
            require_session(conn, ws, sid)
            row = conn.execute(
                "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND phase = 'settled' ORDER BY sequence DESC LIMIT 1",
                (ws, sid),
            ).fetchone()
        return None if row is None else str(row[0])

    def live_session_cwds(self) -> list[tuple[str, str, str]]:
        """`(workspace, session, cwd)` of every Session not deleted, across workspaces (who
        else works in a directory a restore would change)."""
        rows = self._all(
            "SELECT workspace_id, session_id, cwd FROM sessions WHERE deleted = 0"
            " ORDER BY workspace_id, session_id"
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def droppable_checkpoints(self, limit: int = 64) -> list[tuple[str, str, str, str]]:
        """`(workspace, session, turn, checkpoint_json)` of settled Turns of live Sessions
        whose record names a checkpoint, oldest Session first and oldest Turn first within
        it (the row id breaks ties within a millisecond): the order the checkpoint store's size
        cap drops them in."""
        rows = self._all(
            "SELECT t.workspace_id, t.session_id, t.turn_id, t.checkpoint_json FROM turns t"
            " JOIN sessions s ON s.workspace_id = t.workspace_id AND s.session_id = t.session_id"
            " WHERE s.deleted = 0 AND t.phase = 'settled' AND t.checkpoint_json IS NOT NULL"
            " AND (json_extract(t.checkpoint_json, '$.after') IS NOT NULL"
            " OR json_extract(t.checkpoint_json, '$.before') IS NOT NULL)"
            " ORDER BY s.created_at_ms, s.rowid, t.sequence LIMIT ?",
            (limit,),
        )
        return [(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]

    def session_checkpoint_trees(self, ws: str, sid: str) -> set[str]:
        """Every checkpoint tree (`before`, `after`) a Turn record of the Session names and
        has not had dropped: what its shared tree refs (actors/checkpoints.py `commit_ref`)
        must keep."""
        rows = self._all(
            "SELECT json_extract(checkpoint_json, '$.before'),"
            " json_extract(checkpoint_json, '$.after') FROM turns"
            " WHERE workspace_id = ? AND session_id = ? AND checkpoint_json IS NOT NULL",
            (ws, sid),
        )
        return {str(tree) for row in rows for tree in row if tree}

    def mark_checkpoint_dropped(
        self, ws: str, sid: str, turn_id: str, seen_json: str, message: str
    ) -> bool:
        """Record on the Turn that its checkpoint is being dropped (`unavailable: dropped`),
        unless its record changed since `seen_json` was read or a fork operation not yet
        finished goes through it (its prepare or tree may still read it). One write, so a fork
        prepared after it sees the Turn `unavailable` and is refused in words; the refs are
        dropped only after it (a crash between leaves a ref no record names, never a record
        naming a missing checkpoint)."""
        record = json.dumps(
            {"state": "unavailable", "reason": "dropped", "message": message},
            separators=(",", ":"),
        )
        # Not finished: active or `unknown`, each a barrier holder (the CHECK on `barrier`),
        # so the barrier's index finds them by source and Turn (schema v23 keyed
        # `fork_operations_by_source` on `stage`, not the status).
        with self._write(ws) as tx:
            tx.execute(
                "UPDATE turns SET checkpoint_json = ? WHERE workspace_id = ? AND session_id = ?"
                " AND turn_id = ? AND checkpoint_json = ? AND NOT EXISTS (SELECT 1 FROM"
                " fork_operations f WHERE f.workspace_id = ? AND f.source_session_id = ?"
                " AND f.source_turn_id = ? AND f.barrier = 1 AND f.status <> 'committed')",
                (record, ws, sid, turn_id, seen_json, ws, sid, turn_id),
            )
            changed = tx.changes() == 1
            if changed:
                tx.emit(TurnChanged(ws, sid, turn_id))
            return changed

    def turn_checkpoint(self, ws: str, sid: str, turn_id: str) -> dict[str, Any] | None:
        """The Turn's workspace checkpoint record (docs/design/workspace.md), or None when it
        has none (settled before checkpoints existed, or a fork child's cloned Turn). Unknown
        Session or Turn: `NotFound`."""
        with self._read() as conn:
            require_session(conn, ws, sid)
            row = conn.execute(
                "SELECT checkpoint_json FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND turn_id = ?",
                (ws, sid, turn_id),
            ).fetchone()
        if row is None:
            raise TurnNotFound(f"turn {turn_id} not found in session {sid}")
        text = row[0]
        if not text:
            return None
        value = json.loads(text)
        return value if isinstance(value, dict) else None

    def get_turn(self, ws: str, sid: str, turn_id: str) -> Turn:
        with self._read() as conn:
            require_live_session(conn, ws, sid)
            return require_turn(conn, ws, sid, turn_id)

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
            "SELECT workspace_id, session_id, turn_id FROM turns INDEXED BY turns_active"
            " WHERE phase = 'active' ORDER BY workspace_id, session_id, sequence"
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def _bind(
    tx: Tx,
    ws: str,
    sid: str,
    turn_id: str,
    root_provider_turn_id: str,
    binding_json: str | None,
) -> None:
    require_live_session(tx.conn, ws, sid)
    turn = turn_row(tx, ws, sid, turn_id)
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
    finish_claims(tx, ws, sid, turn_id)
    tx.emit(TurnChanged(ws, sid, turn_id))


def _rebind(tx: Tx, ws: str, sid: str, turn_id: str, binding_json: str) -> None:
    require_live_session(tx.conn, ws, sid)
    turn_row(tx, ws, sid, turn_id)
    tx.execute(
        "UPDATE turns SET provider_turn_binding_json = ? WHERE workspace_id = ?"
        " AND session_id = ? AND turn_id = ?",
        (binding_json, ws, sid, turn_id),
    )
    tx.emit(TurnChanged(ws, sid, turn_id))


_OUTCOMES = frozenset(TurnOutcome.__members__.values())
"""The outcomes a settlement takes (read once: `__members__` is a Python call, and a Turn's
settlement runs inside the writer's baton when its batch does)."""
_SETTLED = TurnPhase.SETTLED.value
"""A settled Turn's phase, read once (an enum member's `.value` is two Python calls)."""


_ROW_OF = attrgetter(*(f.name for f in fields(Turn) if f.name not in ("messages", "interactions")))
"""A Turn's row columns, as one tuple: a carried image is compared with the row the settlement
read by them (and by the row's empty Messages and Interactions) without a copy of the image."""


def _settle(
    tx: Tx,
    ws: str,
    sid: str,
    turn_id: str,
    outcome: str,
    final_assistant_message_id: str | None,
    error: str | None,
    include_deleted: bool,
    *,
    checkpoint_json: str | None = None,
    carried: Turn | None = None,
    bound: TurnBound | None = None,
    messages: tuple[tuple[NewMessage, str], ...] = (),
    host_only: bool = False,
) -> bool:
    """The settle write; False (no settlement written) if the Turn was already settled.
    `checkpoint_json`: the Turn's checkpoint record, set by the same statement (None: the
    record is left as it is). `carried`: the active Turn as the store holds it (no
    Interactions); its event then carries the settled Turn built from it. `bound`: the
    provider bind and binding written by the same statement (`TurnBound`). `messages`: new
    Messages of the Turn (each with its payload's JSON) inserted first, as lone appends
    would have (also on a Turn found settled, unless a fork fences the Session)."""
    # Three statements, not one: a single statement of the three reads (the liveness, the
    # fence and the Turn's row as subqueries of one SELECT) ran ~26-38 us of CPU against
    # ~11 us for the three (docs/performance.md, baton), inside the writer's baton.
    require_live_session(tx.conn, ws, sid, include_deleted=include_deleted)
    turn = turn_row(tx, ws, sid, turn_id)
    root, binding = (None, None) if bound is None else bound.applied_to(turn)
    if turn.phase == TurnPhase.SETTLED:
        if root is not None or binding is not None:
            # What the bind and binding would have written alone (both allowed on a settled
            # Turn): the settlement does not land, they still do.
            _set_bound(tx, ws, sid, turn_id, root, binding)
        if messages:
            # So would the appends (on a settled Turn too), each refused by a fork's fence.
            try:
                tx.check_fence(sid)
            except ForkInProgress:
                return False
            _insert_messages(tx, ws, sid, turn_id, messages)
            tx.emit(TurnChanged(ws, sid, turn_id))
        return False
    tx.check_fence(sid)
    if carried is not None and (
        turn.messages or turn.interactions or _ROW_OF(carried) != _ROW_OF(turn)
    ):
        # Its row is not the one this write read (no cost: read above): not trusted.
        carried = None
    if messages:
        # The reply before the statements that may name it (its final Message).
        added = _insert_messages(tx, ws, sid, turn_id, messages)
        if carried is not None:
            carried = _with_messages(carried, added)
    # A trusted image (its only writer's: design/store.md, "A Turn's claim and settlement
    # carry their Turn") names the Turn's Messages and has no Interactions, so what the two
    # statements below would find is known without them.
    known = False
    if carried is not None and final_assistant_message_id is not None:
        for m in carried.messages:  # a loop, not a generator: no call per Message
            if m.message_id == final_assistant_message_id:
                known = True
                break
    if final_assistant_message_id is not None and not known:
        owner = tx.one(
            f"SELECT turn_id FROM messages WHERE session_key = {SESSION_KEY_OF} AND message_id = ?",
            (ws, sid, final_assistant_message_id),
        )
        # A dangling final message id would make the turn unforkable (law 5).
        if owner is None or owner[0] != turn_id:
            raise InvalidArgument(
                "finalAssistantMessageId", "final assistant message is not in this turn"
            )
    marked = root is None and binding is None and host_only and turn.root_provider_turn_id is None
    if marked:
        # The provider never got it (`record_settlement`): marked by the settlement itself.
        tx.execute(
            "UPDATE turns SET phase = 'settled', outcome = ?, final_assistant_message_id = ?,"
            " error = ?, settled_at_ms = ?, checkpoint_json = COALESCE(?, checkpoint_json),"
            " host_only = 1 WHERE workspace_id = ? AND session_id = ? AND turn_id = ?",
            (outcome, final_assistant_message_id, error, tx.now_ms, checkpoint_json, ws, sid,
             turn_id),
        )  # fmt: skip
    elif root is None and binding is None:
        tx.execute(
            "UPDATE turns SET phase = 'settled', outcome = ?, final_assistant_message_id = ?,"
            " error = ?, settled_at_ms = ?, checkpoint_json = COALESCE(?, checkpoint_json)"
            " WHERE workspace_id = ? AND session_id = ? AND turn_id = ?",
            (outcome, final_assistant_message_id, error, tx.now_ms, checkpoint_json, ws, sid,
             turn_id),
        )  # fmt: skip
    else:
        tx.execute(
            "UPDATE turns SET phase = 'settled', outcome = ?, final_assistant_message_id = ?,"
            " error = ?, settled_at_ms = ?, checkpoint_json = COALESCE(?, checkpoint_json),"
            " root_provider_turn_id = COALESCE(?, root_provider_turn_id),"
            " provider_turn_binding_json = COALESCE(?, provider_turn_binding_json)"
            " WHERE workspace_id = ? AND session_id = ? AND turn_id = ?",
            (outcome, final_assistant_message_id, error, tx.now_ms, checkpoint_json, root,
             binding, ws, sid, turn_id),
        )  # fmt: skip
    if carried is None:
        tx.execute(
            "UPDATE interactions SET status = 'superseded', resolved_at_ms = ?"
            " WHERE workspace_id = ? AND session_id = ? AND turn_id = ? AND status = 'pending'",
            (tx.now_ms, ws, sid, turn_id),
        )
    finish_claims(tx, ws, sid, turn_id)
    if carried is None:
        tx.emit(TurnChanged(ws, sid, turn_id))
    else:
        # What the statement above wrote, on the Turn as it stood: no read inside the baton,
        # and no `dataclasses.replace` (its walk of the fields is ~20 calls more in the baton).
        c = carried
        settled = Turn(
            c.workspace_id, c.session_id, c.turn_id, c.sequence, c.sequence_provenance,
            _SETTLED, outcome,
            c.root_provider_turn_id if root is None else root,
            c.provider_turn_binding_json if binding is None else binding,
            final_assistant_message_id, error, c.created_at_ms, tx.now_ms, c.messages,
            c.interactions, c.checkpoint_json if checkpoint_json is None else checkpoint_json,
            c.host_only or marked,
        )  # fmt: skip
        tx.emit(TurnChanged(ws, sid, turn_id, row=settled, seq=tx.seq))
    touch(tx, ws, sid, settled=turn_id)
    return True


def _insert_messages(
    tx: Tx, ws: str, sid: str, turn_id: str, messages: tuple[tuple[NewMessage, str], ...]
) -> tuple[Message, ...]:
    """Insert `messages` as new Messages of the Turn, last in the Session, in order."""
    position = next_position(tx, ws, sid)
    added = []
    for m, payload_json in messages:
        added.append(
            insert_message(
                tx, ws, sid, turn_id, m.message_id, m.kind, m.text, payload_json, position
            )
        )
        position += 1
    return tuple(added)


def _with_messages(t: Turn, added: tuple[Message, ...]) -> Turn:
    """`t` with `added` appended to its Messages (no `dataclasses.replace`: its walk of the
    fields runs inside the writer's baton)."""
    return Turn(
        t.workspace_id, t.session_id, t.turn_id, t.sequence, t.sequence_provenance, t.phase,
        t.outcome, t.root_provider_turn_id, t.provider_turn_binding_json,
        t.final_assistant_message_id, t.error, t.created_at_ms, t.settled_at_ms,
        (*t.messages, *added), t.interactions, t.checkpoint_json, t.host_only,
    )  # fmt: skip


def _set_bound(
    tx: Tx, ws: str, sid: str, turn_id: str, root: str | None, binding: str | None
) -> None:
    tx.execute(
        "UPDATE turns SET root_provider_turn_id = COALESCE(?, root_provider_turn_id),"
        " provider_turn_binding_json = COALESCE(?, provider_turn_binding_json)"
        " WHERE workspace_id = ? AND session_id = ? AND turn_id = ?",
        (root, binding, ws, sid, turn_id),
    )
    if root is not None:
        finish_claims(tx, ws, sid, turn_id)
    tx.emit(TurnChanged(ws, sid, turn_id))


def _carriable(turn: Turn, ws: str, sid: str, turn_id: str) -> bool:
    """Whether a settlement can carry its Turn built from `turn`: this Turn, still active,
    without Interactions (the settlement supersedes the pending ones in SQL)."""
    return (
        (turn.workspace_id, turn.session_id, turn.turn_id) == (ws, sid, turn_id)
        and turn.phase == TurnPhase.ACTIVE
        and not turn.interactions
    )
