"""Prepare (seed 000 §4–§6, §11): idempotency by request id, the fork point resolved to its
Turn, the source + point barrier, the target reservation and the child's title, the boundary
checks and the frozen snapshot, in one transaction."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import apsw

from domain.enums import ProviderStateBindingMode
from domain.errors import (
    ForkBoundaryError,
    ForkBoundaryReason,
    ForkConflict,
    ForkRequestConflict,
    InvalidArgument,
    WorkspaceCheckpointMissing,
    checkpoint_refusal,
)
from domain.fork_states import STAGE_A_FORK_SQL, ForkStatus
from storage.base import Database
from storage.fork_child import (
    T_BINDING,
    T_ID,
    T_ROOT_PROVIDER_TURN,
    ForkMemo,
    OrdinalPrefixes,
    prove_child,
    remember_child_history,
)
from storage.fork_snapshot import freeze_snapshot, load_boundary, request_hash, source_blockers
from storage.fork_workspace import PLANNED, boundary_checkpoint
from storage.history_links import fence_history, history_section
from storage.models import (
    ChangeEvent,
    ForkOperation,
    ForkOperationChanged,
    ForkPointKind,
    ForkPrepareRequest,
    PlanWorkspace,
    Session,
    TurnPhase,
)
from storage.rows import BARRIER_OPS_SQL, OP_COLUMNS, OP_SEQ, decode_op, require_session
from storage.sqlite import Tx, dumps, loads

# -- Prepare ---------------------------------------------------------------------------------------


def prepared_events(op: ForkOperation) -> list[ChangeEvent]:
    """The change events a prepare emits: what the caller of a lazy one hands on. The
    operation's only: a prepare writes nothing of its source's `sessions` row (its fence is the
    operation's row and `history_fences`), so no Session changed (docs/design/store.md, "A
    fork announces no change of its source")."""
    return [ForkOperationChanged(op.workspace_id, op.operation_id)]


BARRIER_HOLDERS_SQL = (
    f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
    f" AND source_session_id = ? AND source_turn_id = ? AND {BARRIER_OPS_SQL}"
)
"""Every operation holding the barrier of `source + Turn` (`barrier_holder` picks the first)."""


def barrier_holder(conn: apsw.Connection, ws: str, source_session_id: str, turn_id: str) -> Any:
    """The operation row holding the boundary barrier of `source + turn_id`, or None.

    Keyed on the resolved boundary, not on the point kind (law 8): an `unknown` or un-ACKed
    `throughTurn(N)` holds Turn N against a `latestSettled` request that resolves to N, and the
    reverse, so one boundary is never dispatched twice.

    The first holder by `op_seq` is picked here, not by an `ORDER BY op_seq LIMIT 1`: with
    that clause SQLite recompiled the statement at every execution (its plan through the
    partial index `fork_operations_barrier_held` depends on the bound values), ~40 µs of CPU
    per prepare where the same lookup without it is ~4 µs. The rows are the handful the
    barrier holds for one source and Turn (usually none)."""
    held = conn.execute(BARRIER_HOLDERS_SQL, (ws, source_session_id, turn_id)).fetchall()
    if not held:
        return None
    return min(held, key=_op_seq)


def _op_seq(row: Any) -> int:
    return int(row[OP_SEQ])


def validate_request(req: ForkPrepareRequest) -> None:
    for field, value in (
        ("agentSessionId", req.source_session_id),
        ("requestId", req.request_id),
        ("targetAgentSessionId", req.target_session_id),
        ("point.turnId", req.turn_id),
        ("driverKind", req.driver_kind),
    ):
        if field == "point.turnId" and req.point_kind == ForkPointKind.LATEST_SETTLED:
            continue  # resolved inside the prepare transaction (`resolve_or_block` below)
        if not isinstance(value, str) or not value:
            raise InvalidArgument(field, f"{field} must be a non-empty string")
    if req.point_kind not in (ForkPointKind.THROUGH_TURN, ForkPointKind.LATEST_SETTLED):
        raise InvalidArgument("point.type", f"unsupported fork point {req.point_kind!r}")
    if req.binding_mode not in ProviderStateBindingMode.__members__.values():
        raise InvalidArgument("bindingMode", f"unknown binding mode {req.binding_mode!r}")
    if not isinstance(req.runtime_identity, Mapping):
        raise InvalidArgument("runtimeIdentity", "runtime identity must be a map")
    if req.workspace not in ("shared", "worktree"):
        raise InvalidArgument("workspace", "workspace must be 'shared' or 'worktree'")


class ForkPrepare:
    """`prepare_fork` and its pure-read twin `existing_fork`."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._submit = db.submit_write
        self._read = db.read
        self._db = db
        self._projections = db.projections

    @property
    def fork_memo(self) -> ForkMemo:
        """The owner's memo of what prepare froze (read each time: a test may swap it)."""
        return self._db.fork_memo

    def existing_fork(
        self,
        ws: str,
        *,
        source_session_id: str,
        request_id: str,
        target_session_id: str,
        turn_id: str,
        point_kind: str = ForkPointKind.THROUGH_TURN.value,
        workspace: str = "shared",
    ) -> ForkOperation | None:
        """The operation a `prepare_fork` of this request would return without creating one —
        a replay of `request_id` or the holder of the boundary barrier (source + resolved
        Turn) — or None.
        A pure read, so a replay never needs a provider runtime; `prepare_fork` re-checks
        both inside its transaction."""
        digest = request_hash(source_session_id, target_session_id, point_kind, turn_id, workspace)
        with self._read() as conn:
            existing = conn.execute(
                f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND request_id = ?",
                (ws, request_id),
            ).fetchone()
            if existing is not None:
                if existing[3] != digest:
                    raise ForkRequestConflict(
                        f"request {request_id} was used for a different fork",
                        params={"operationId": existing[1]},
                    )
                return decode_op(conn, existing, projections=self._projections)
            if point_kind == ForkPointKind.LATEST_SETTLED:
                turn_id = latest_settled_turn_id(conn, ws, source_session_id) or UNRESOLVED
            held = barrier_holder(conn, ws, source_session_id, turn_id)
            return None if held is None else decode_op(conn, held, projections=self._projections)

    def prepare_fork(
        self,
        ws: str,
        req: ForkPrepareRequest,
        *,
        turn_forkable: Callable[[str | None, str | None], bool] | None = None,
        plan_workspace: PlanWorkspace | None = None,
        durable: bool = True,
        dispatching: bool = False,
    ) -> tuple[ForkOperation, bool]:
        """Create the operation, fence and reservation and freeze the snapshot in one
        transaction; a replay or a held barrier returns the original with `created=False`.

        `turn_forkable(root_provider_turn_id, provider_turn_binding_json)` is the provider's
        per-Turn hook (seed 000 §3.2 `CanForkProviderTurn`): the store never parses a
        provider's binding JSON; the selected Turn is accepted only when the hook says so,
        inside this transaction.

        `plan_workspace(checkpoint, operation_id, title)` plans a `worktree` fork's tree from the
        fork Turn's checkpoint record (workspace.worktree.TreePlan's JSON, with `childCwd`, the
        child's frozen cwd); a Turn without an available checkpoint is refused
        (`workspace_checkpoint_missing`) before anything is written.

        `durable=False` (the saga's warm path, docs/design/fork-saga.md): a lazy COMMIT, in
        the WAL at once and on the disk with the caller's next fsync'd COMMIT (`dispatching`);
        it emits no change events: the caller hands `prepared_events` on once that fsync
        made the operation durable — with its own step's events, not with whichever writer's
        fsync came first (at 16 forking clients that was usually another fork's, so the
        operation and its source were read back and published twice per fork). Only for a
        caller that tells nobody of the operation before then.

        `dispatching=True` (the saga's warm path when the runtime's verdict already passed,
        docs/design/fork-saga.md "A warm fork's prepare is its dispatching marker"): the row is
        written at `dispatching` (law 1's marker, `dispatched_at_ms` its own transaction's
        time), fsync'd, so prepare and `dispatching` are one transaction; its change events
        carry the row as written. A replay or a held barrier is answered as ever."""
        validate_request(req)
        if dispatching and (not durable or req.workspace != "shared"):
            raise ValueError("a prepare writes `dispatching` only durably, for a shared fork")
        status = ForkStatus.DISPATCHING if dispatching else ForkStatus.PREPARED
        digest = request_hash(
            req.source_session_id, req.target_session_id, req.point_kind, req.turn_id, req.workspace
        )

        def body(tx: Tx) -> tuple[ForkOperation, bool]:
            existing = tx.one(
                f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ?"
                " AND request_id = ?",
                (ws, req.request_id),
            )
            if existing is not None:
                if existing[3] != digest:
                    raise ForkRequestConflict(
                        f"request {req.request_id} was used for a different fork",
                        params={"operationId": existing[1]},
                    )
                return decode_op(tx.conn, existing, projections=self._projections), False
            source = require_session(tx.conn, ws, req.source_session_id)
            # latestSettled: resolved here, in the same transaction, and frozen on the row.
            turn_id = resolve_or_block(tx.conn, ws, source, req.point_kind, req.turn_id)
            held = barrier_holder(tx.conn, ws, req.source_session_id, turn_id)
            if held is not None:
                return decode_op(tx.conn, held, projections=self._projections), False
            tx.check_fence(req.source_session_id)  # another fork on this source: retryable
            self._check_target_free(tx, ws, req)
            blockers = source_blockers(tx.conn, ws, source)
            # Static source facts first, then whether the Turn is a settled Turn of this source,
            # then quiescence, then the boundary's content (load_boundary).
            static = {
                ForkBoundaryReason.SOURCE_NOT_ROOT,
                ForkBoundaryReason.SOURCE_PROVIDER_SESSION_MISSING,
            }
            for reason in blockers:
                if reason in static:
                    raise ForkBoundaryError(reason)
            # The Messages stay in SQLite (snapshot versions 4 and 5, storage/history_links.py).
            boundary = load_boundary(
                tx.conn, ws, req.source_session_id, turn_id, messages=False, keep_digest=True
            )
            if blockers:
                raise ForkBoundaryError(blockers[0])
            selected = boundary.selected  # a `TURN_FIELDS` array
            if turn_forkable is not None and not turn_forkable(
                selected[T_ROOT_PROVIDER_TURN], selected[T_BINDING]
            ):
                raise ForkBoundaryError(ForkBoundaryReason.PROVIDER_TURN_NOT_BOUND)
            title = child_title(tx.conn, ws, req.source_session_id, source.title)
            op_id = str(uuid.uuid4())
            runtime_identity = req.runtime_identity
            plan: Mapping[str, Any] | None = None
            if req.workspace == "worktree":
                plan = self._plan_tree(tx, ws, req, turn_id, op_id, title, plan_workspace)
                # The child works in its own tree: frozen as its cwd (law 4: commit reads
                # only the snapshot).
                runtime_identity = {**runtime_identity, "cwd": str(plan["childCwd"])}
            assert boundary.history is not None
            prefixes = OrdinalPrefixes.of(op_id, ws, req.source_session_id, req.target_session_id)
            history, identity = history_section(
                tx.conn,
                ws,
                req.source_session_id,
                boundary.history,
                turns=boundary.turns,
                prefixes=prefixes,
            )
            snapshot, stored, snapshot_hash = freeze_snapshot(
                operation_id=op_id,
                workspace_id=ws,
                source=source,
                target_session_id=req.target_session_id,
                target_title=title,
                point_kind=req.point_kind,
                boundary=boundary,
                runtime_identity=runtime_identity,
                memo=self.fork_memo,
                history=history,
            )
            remember_child_history(self.fork_memo, snapshot_hash, identity, prefixes)
            # Prove now that commit can rewrite every reference (fail closed before dispatch).
            prove_child(
                snapshot,
                binding_mode=req.binding_mode,
                committed_at_ms=tx.now_ms,
                snapshot_hash=snapshot_hash,
                memo=self.fork_memo,
            )
            assert source.provider_session_id is not None
            worktree_json = None if plan is None else dumps(dict(plan))
            tx.execute(
                "INSERT INTO fork_operations (workspace_id, operation_id, request_id,"
                " request_hash, source_session_id, target_session_id, point_kind,"
                " source_turn_id, source_provider_session_id, source_provider_turn_id,"
                " source_provider_turn_ids, target_title, driver_kind, driver_version,"
                " binding_mode, snapshot_hash, status, created_at_ms, dispatched_at_ms,"
                " workspace_mode, workspace_json, workspace_state, barrier, stage)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " 1, 2)",
                (
                    ws,
                    op_id,
                    req.request_id,
                    digest,
                    req.source_session_id,
                    req.target_session_id,
                    req.point_kind,
                    turn_id,
                    source.provider_session_id,
                    selected[T_ROOT_PROVIDER_TURN],
                    dumps(list(boundary.provider_turn_ids)),
                    title,
                    req.driver_kind,
                    req.driver_version,
                    req.binding_mode,
                    snapshot_hash,
                    status.value,
                    tx.now_ms,
                    tx.now_ms if dispatching else None,
                    req.workspace,
                    worktree_json,
                    None if plan is None else PLANNED,
                ),
            )
            # The frozen bytes in their own row (schema v5): written once here, only read
            # after, so no status UPDATE of the operation row rewrites them.
            op_seq = tx.conn.last_insert_rowid()
            tx.execute(
                "INSERT INTO fork_snapshots (op_seq, snapshot_json) VALUES (?, ?)",
                (op_seq, stored),
            )
            # The witness (schema v13): from here SQLite counts any change of the source's
            # history, so the commit proves the boundary unchanged from one row.
            fence_history(tx.conn, ws, req.source_session_id, op_seq)
            tx.execute(
                "INSERT INTO session_reservations (workspace_id, session_id, operation_id)"
                " VALUES (?, ?, ?)",
                (ws, req.target_session_id, op_id),
            )
            # The row as just written (no read of it back, no parse of the JSON just encoded),
            # with the snapshot's own frozen bindings: the saga dispatches and verifies from
            # them, without re-reading the source timeline.
            prepared = ForkOperation(
                workspace_id=ws,
                operation_id=op_id,
                request_id=req.request_id,
                request_hash=digest,
                source_session_id=req.source_session_id,
                target_session_id=req.target_session_id,
                point_kind=str(req.point_kind),
                source_turn_id=turn_id,
                source_provider_session_id=source.provider_session_id,
                source_provider_turn_id=selected[T_ROOT_PROVIDER_TURN],
                source_provider_turn_ids=tuple(boundary.provider_turn_ids),
                target_provider_session_id=None,
                target_provider_turn_ids=None,
                target_turn_id=None,
                driver_kind=str(req.driver_kind),
                driver_version=str(req.driver_version),
                binding_mode=str(req.binding_mode),
                binding_receipt=None,
                snapshot_hash=snapshot_hash,
                status=status,
                error=None,
                created_at_ms=tx.now_ms,
                dispatched_at_ms=tx.now_ms if dispatching else None,
                accepted_at_ms=None,
                completed_at_ms=None,
                client_observed_at_ms=None,
                committed_session=None,
                lineage=None,
                target_title=title,
                # Lined up with the provider prefix: a host-only Turn (no provider turn id) is
                # in neither.
                frozen_turns=tuple(
                    (str(t[T_ID]), t[T_BINDING]) for t in boundary.turns if t[T_ROOT_PROVIDER_TURN]
                ),
                workspace_mode=req.workspace,
                worktree=loads(worktree_json),
                worktree_state=None if plan is None else PLANNED,
            )
            if durable:
                # A lazy prepare announces nothing: its caller tells of the operation once its
                # next write made it durable (`prepared_events`), with that write's events.
                # A durable one's change carries the row (the events thread reads none back).
                tx.emit(ForkOperationChanged(ws, op_id, row=prepared, seq=tx.seq))
            return prepared, True

        return self._submit(body, ws, durable=durable)

    @staticmethod
    def _plan_tree(
        tx: Tx,
        ws: str,
        req: ForkPrepareRequest,
        turn_id: str,
        op_id: str,
        title: str,
        plan_workspace: PlanWorkspace | None,
    ) -> Mapping[str, Any]:
        checkpoint = boundary_checkpoint(tx.conn, ws, req.source_session_id, turn_id)
        refusal = checkpoint_refusal(checkpoint, turn_id)
        if refusal is not None:
            raise refusal
        assert checkpoint is not None
        if plan_workspace is None:
            raise WorkspaceCheckpointMissing(
                "this host keeps no workspace checkpoints to make a worktree from",
                params={"turnId": turn_id},
            )
        return plan_workspace(checkpoint, op_id, title)

    @staticmethod
    def _check_target_free(tx: Tx, ws: str, req: ForkPrepareRequest) -> None:
        if req.target_session_id == req.source_session_id:
            raise ForkConflict(
                ForkBoundaryReason.TARGET_EQUALS_SOURCE,
                "the fork target must differ from the source",
                params={"field": "targetAgentSessionId"},
            )
        taken = tx.one(
            "SELECT 'session' FROM sessions WHERE workspace_id = ? AND session_id = ?"
            " UNION ALL SELECT 'reserved' FROM session_reservations WHERE workspace_id = ?"
            " AND session_id = ?",
            (ws, req.target_session_id, ws, req.target_session_id),
        )
        if taken is not None:
            raise ForkConflict(
                ForkBoundaryReason.TARGET_SESSION_EXISTS
                if taken[0] == "session"
                else ForkBoundaryReason.TARGET_SESSION_RESERVED,
                f"target session id {req.target_session_id} is already {taken[0]}",
                params={"field": "targetAgentSessionId"},
            )


# -- Fork points -----------------------------------------------------------------------------------
# Fork points beyond `throughTurn` (seed 000 §11): `latestSettled`, the whole
# Session as it stands, resolved to a concrete settled Turn inside the prepare transaction and
# frozen on the operation (`source_turn_id`), so a replay after new Turns returns the same
# original boundary.
#
# The request hash of a `latestSettled` request carries no Turn (the client named none), so a
# replay of the same `requestId` matches whatever the Session's newest Turn is by then; the
# barrier is `source + latestSettled + the resolved Turn`.

# The turn id a `latestSettled` request carries before resolution (and in its request hash).
UNRESOLVED = ""


def latest_settled_turn_id(conn: apsw.Connection, ws: str, sid: str) -> str | None:
    """The Session's newest Turn if it is settled, else None (an active newest Turn is the
    source's own blocker, `source_turn_active`, reported by the caller)."""
    row = conn.execute(
        "SELECT turn_id, phase FROM turns WHERE workspace_id = ? AND session_id = ?"
        " ORDER BY sequence DESC LIMIT 1",
        (ws, sid),
    ).fetchone()
    if row is None or row[1] != TurnPhase.SETTLED:
        return None
    return str(row[0])


def resolve_point_turn(
    conn: apsw.Connection, ws: str, sid: str, point_kind: str, turn_id: str
) -> str:
    """The concrete boundary Turn of a fork point; `latestSettled` with no settled newest Turn
    raises `turn_not_found` (no Turns) or `turn_not_settled` (the newest one runs)."""
    if point_kind != ForkPointKind.LATEST_SETTLED:
        return turn_id
    resolved = latest_settled_turn_id(conn, ws, sid)
    if resolved is not None:
        return resolved
    any_turn = conn.execute(
        "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ? LIMIT 1", (ws, sid)
    ).fetchone()
    reason = ForkBoundaryReason.TURN_NOT_SETTLED if any_turn else ForkBoundaryReason.TURN_NOT_FOUND
    raise ForkBoundaryError(reason)


def resolve_or_block(
    conn: apsw.Connection, ws: str, source: Session, point_kind: str, turn_id: str
) -> str:
    """`resolve_point_turn`, but an unresolvable `latestSettled` reports the source's own
    blocker first (an active Turn refuses as `source_turn_active`, as for `throughTurn`)."""
    try:
        return resolve_point_turn(conn, ws, source.session_id, point_kind, turn_id)
    except ForkBoundaryError:
        blockers = source_blockers(conn, ws, source)
        if blockers:
            raise ForkBoundaryError(blockers[0]) from None
        raise


# -- The child's title -----------------------------------------------------------------------------
# The title a fork child is minted with (seed 000 §5): `<source title> (<n>)`, where `n` is
# this fork's ordinal among the valid forks of that same source, the first child being `(2)`.
#
# A valid fork is one that is not `failed` or `abandoned` (neither ever became a child), so a
# failed or abandoned attempt does not use up a number. A fork of a fork stacks the suffix
# (`Trip (2)` forks to `Trip (2) (2)`); a shorter label is a client's to draw from the lineage.


def child_title(conn: Any, ws: str, source_session_id: str, source_title: str) -> str:
    """`conn` is the prepare transaction's connection; the count reads the source's operations
    inside it, so two forks of one source never mint the same number."""
    row = conn.execute(
        "SELECT COUNT(*) FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
        f" AND {STAGE_A_FORK_SQL}",
        (ws, source_session_id),
    ).fetchone()
    return f"{source_title} ({(int(row[0]) if row else 0) + 2})"
