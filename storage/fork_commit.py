"""Law 2: the commit — child Session, cloned history and lineage written from the frozen
snapshot, with `committed`, in one transaction; the source identity re-proved first. A version
4 child reads its Messages from the source's boundary through a history link, written once
the boundary is proved what prepare froze — by the fence's witness, else by re-proving the
frozen count and digest (storage/history_links.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import apsw

from domain.errors import ForkOperationNotFound, ForkSnapshotCorrupt, InvalidTransition
from domain.fork_states import ForkStatus, stage_assignment
from storage.base import Database
from storage.fork_child import MESSAGE_COLUMNS, ChildPlan, ForkMemo, HistoryCopy, build_child
from storage.fork_snapshot import read_frozen, take_frozen_snapshot
from storage.fork_transitions import receipt_forked_from
from storage.history_links import boundary_proof, fenced_history_unchanged, link_messages
from storage.models import (
    ForkOperation,
    ForkOperationChanged,
    OperationKey,
    Session,
    SessionChanged,
)
from storage.rows import OP_COLUMNS, decode_op, json_column, op_from_row
from storage.schema import SESSION_KEY_OF
from storage.sqlite import TRANSIENT_ERRORS, Row, Tx, dumps

log = logging.getLogger(__name__)

_STAGE = stage_assignment(ForkStatus.PROVIDER_ACCEPTED, ForkStatus.COMMITTED)
"""`, stage = 1`: the commit leaves its source's fence (schema v23)."""


class ForkCommit:
    """`commit_fork` and the batched commit start-up recovery uses."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._submit = db.submit_write
        self._db = db
        self._projections = db.projections

    @property
    def fork_memo(self) -> ForkMemo:
        """The owner's memo of what prepare froze (read each time: a test may swap it)."""
        return self._db.fork_memo

    def commit_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """Law 2: child, cloned history, lineage and `committed` in one transaction, computed
        from the snapshot only; a replay returns the same result with `changed=False`."""
        op, changed = self._submit(lambda tx: self._commit_in(tx, ws, op_id), ws)
        assert op is not None  # asked for below (`operation=True`)
        return op, changed

    def commit_fork_operations(self, ops: Sequence[OperationKey]) -> tuple[int, int]:
        """Start-up recovery: commit many `provider_accepted` operations in one transaction
        (one fsync), each inside its own savepoint so a bad one is rolled back alone; a write
        the store refuses (busy, full, an I/O error: no row's fault, and SQLite may have rolled
        the whole transaction back) fails the page whole. Returns (committed, errors)."""
        committed = errors = 0
        with self._write(None) as tx:
            for op in ops:
                tx.execute("SAVEPOINT recover_commit")
                try:
                    # Recovery reads nothing back: no operation value built per commit.
                    _, changed = self._commit_in(
                        tx, op.workspace_id, op.operation_id, operation=False
                    )
                except Exception as exc:  # noqa: BLE001 - recovery goes on with the next row
                    if tx.conn.getautocommit() or isinstance(exc, TRANSIENT_ERRORS):
                        # Not this row's fault: the store refused the write (busy, a full
                        # disk, an I/O error), and SQLite may have rolled the whole page back
                        # (its savepoint gone with it). The page fails whole, its caller
                        # tries it again or fails the start saying why.
                        raise
                    log.exception("recovery commit of fork operation %s failed", op.operation_id)
                    tx.execute("ROLLBACK TO recover_commit")
                    errors += 1
                else:
                    committed += int(changed)
                tx.execute("RELEASE recover_commit")
        return committed, errors

    def _commit_in(
        self, tx: Tx, ws: str, op_id: str, *, operation: bool = True
    ) -> tuple[ForkOperation | None, bool]:
        """The commit inside `tx`; with `operation=False` the committed operation is not built
        (nor a committed one decoded) and `None` is returned in its place."""
        r = tx.one(
            f"SELECT {OP_COLUMNS} FROM fork_operations WHERE workspace_id = ? AND operation_id = ?",
            (ws, op_id),
        )
        if r is None:
            raise ForkOperationNotFound(f"fork operation {op_id} not found")
        status = ForkStatus(r[19])
        if status is ForkStatus.COMMITTED:
            if not operation:
                return None, False
            return decode_op(tx.conn, r, projections=self._projections), False
        if status is not ForkStatus.PROVIDER_ACCEPTED:
            raise InvalidTransition(
                f"fork operation {op_id} cannot commit from {status}",
                params={"operationId": op_id, "status": status.value},
            )
        stored = read_frozen(tx.conn, r[28])
        # The stored bytes are hashed here; their parse may be the document prepare froze
        # (same hash, same bytes) instead of a second decode of a multi-MB text.
        snapshot = take_frozen_snapshot(stored, r[18], self.fork_memo)
        self._reprove_identity(tx, ws, r, snapshot)
        plan = build_child(
            snapshot,
            child_provider_session_id=r[11],
            binding_mode=r[16],
            turn_bindings=json_column(r[27]),
            committed_at_ms=tx.now_ms,
            snapshot_hash=r[18],
            last_use=True,
            memo=self.fork_memo,
        )
        top = 0
        if plan.copy is not None:
            top = _check_source_history(tx, ws, int(r[28]), plan.copy)
        self._insert_child(tx, plan, top)
        tx.execute(
            "UPDATE fork_operations SET status = 'committed', target_turn_id = ?,"
            f" completed_at_ms = ?{_STAGE} WHERE workspace_id = ? AND operation_id = ?"
            " AND status = 'provider_accepted'",
            (plan.lineage.target_turn_id, tx.now_ms, ws, op_id),
        )
        committed: ForkOperation | None = None
        if operation:
            # The row as the UPDATE above left it (target Turn, status, completion time), built
            # once with its projection (not built from the row read, then copied), and carried
            # by its change: the events thread publishes it without reading it back.
            written = list(r)
            written[13], written[19], written[24] = (
                plan.lineage.target_turn_id,
                ForkStatus.COMMITTED.value,
                tx.now_ms,
            )
            committed = op_from_row(tuple(written), (plan.session, plan.lineage))
        tx.emit(ForkOperationChanged(ws, op_id, row=committed, seq=tx.seq))
        # The child's row as the INSERT above left it (version 0, no active Turn: only settled
        # Turns are cloned; its lineage the row written to `fork_lineage`), carried: the events
        # thread announces the child without reading it back. The source's row is not written
        # here (its fence is the operation's row and `history_fences`): no change of it to
        # announce (docs/design/store.md, "A fork announces no change of its source").
        tx.emit(SessionChanged(ws, plan.session.session_id, row=plan.session, seq=tx.seq))
        # The row as written, projected from the plan just built from the snapshot:
        # the same Session and lineage `committed_projection` rebuilds on a read (law 4),
        # without reading and re-hashing the snapshot a second time in this transaction.
        # Readers of this operation (its ACK first) find the projection without decoding the
        # snapshot: the key is what `committed_projection` rebuilds it from, and the value is
        # that same pure function's result (should this transaction roll back, a retry commits
        # at another time, a different key).
        self._projections.put((r[18], r[11], tx.now_ms), (plan.session, plan.lineage), miss=False)
        return committed, True

    @staticmethod
    def _reprove_identity(tx: Tx, ws: str, r: Row, snapshot: Mapping[str, Any]) -> None:
        """Commit re-proves the source provider identity from the snapshot and the evidence."""
        source = snapshot["source"]
        if (
            snapshot["operation_id"] != r[1]
            or snapshot["workspace_id"] != ws
            or source["session_id"] != r[4]
            or snapshot["target"]["session_id"] != r[5]
            or snapshot["point"]["turn_id"] != r[7]
        ):
            raise ForkSnapshotCorrupt("snapshot does not belong to this operation")
        if source["provider_session_id"] != r[8]:
            raise ForkSnapshotCorrupt("snapshot source provider session differs from operation")
        if tuple(snapshot["provider_turn_ids"]) != tuple(json_column(r[10])):
            raise ForkSnapshotCorrupt("snapshot provider turn prefix differs from operation")
        receipt = json_column(r[17]) or {}
        forked_from = receipt_forked_from(receipt)
        if forked_from is not None and forked_from != source["provider_session_id"]:
            raise ForkSnapshotCorrupt("evidence forkedFromId does not name the source")
        if not r[11] or r[11] == source["provider_session_id"]:
            raise ForkSnapshotCorrupt("provider child identity is not independent of the source")
        reserved = tx.one(
            "SELECT operation_id FROM session_reservations WHERE workspace_id = ?"
            " AND session_id = ?",
            (ws, r[5]),
        )
        if reserved is None or reserved[0] != r[1]:
            raise ForkSnapshotCorrupt("target session id is not reserved by this operation")
        # A target that already exists is refused by the child's INSERT itself (its primary
        # key), in this same transaction: `_insert_child`. No read of `sessions` first.

    @staticmethod
    def _insert_child(tx: Tx, plan: ChildPlan, through_position: int) -> None:
        s = plan.session
        try:
            _insert_session(tx, s)
        except apsw.ConstraintError:
            # The primary key (or another constraint): say which, from the row that is there.
            if tx.one(
                "SELECT 1 FROM sessions WHERE workspace_id = ? AND session_id = ?",
                (s.workspace_id, s.session_id),
            ):
                raise ForkSnapshotCorrupt("target session already exists before commit") from None
            raise
        tx.executemany(
            "INSERT INTO turns (workspace_id, session_id, turn_id, sequence, sequence_provenance,"
            " phase, outcome, root_provider_turn_id, provider_turn_binding_json,"
            " final_assistant_message_id, error, created_at_ms, settled_at_ms, host_only)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            plan.turn_rows,
        )
        # Every cloned Message is created at the commit, in the child's Session (its key, schema
        # v7, made by the trigger on the insert above): two integers in the statement (`int`, so
        # nothing but digits reaches the SQL text), the rows as prepare built them.
        key = tx.one(f"SELECT {SESSION_KEY_OF}", (s.workspace_id, s.session_id))
        assert key is not None
        if plan.copy is not None:
            _link_history(tx, plan, int(key[0]), through_position)
        else:
            tx.executemany(
                f"INSERT INTO messages ({MESSAGE_COLUMNS}, created_at_ms, session_key)"
                f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {int(plan.committed_at_ms)}, {int(key[0])})",
                plan.message_rows,
            )
        tx.executemany(
            "INSERT INTO interactions (workspace_id, session_id, interaction_id, request_id,"
            " turn_id, kind, status, input_json, output_json, created_at_ms, resolved_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            plan.interaction_rows,
        )
        lin = plan.lineage
        tx.execute(
            "INSERT INTO fork_lineage (workspace_id, target_session_id, source_session_id,"
            " source_turn_id, target_turn_id, operation_id, forked_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                s.workspace_id,
                lin.target_session_id,
                lin.source_session_id,
                lin.source_turn_id,
                lin.target_turn_id,
                lin.operation_id,
                lin.forked_at_ms,
            ),
        )
        # No event per cloned Turn: the child is new, so no client holds any of its
        # Turns; `_commit_in`'s `SessionChanged` for it announces the whole child (a client
        # reads its Turns with `session.timeline`). With one, a 1,000-Turn fork would publish
        # 1,000 `turn.updated`, each re-read from the store, past a subscriber's 1,000-event queue.


def _check_source_history(tx: Tx, ws: str, op_seq: int, copy: HistoryCopy) -> int:
    """A version 4 child reads the source's boundary: it must still be, row for row, what
    prepare digested (the fence keeps every store path off it; anything else fails closed, the
    operation stays `provider_accepted`, as for a snapshot that no longer matches its hash).
    Returns the boundary's highest position (the link's bound).

    The fence's witness (schema v13) decides it from one row when it can: a source that is no
    linked child, whose witness counted no change of its Messages or Turns since prepare, holds
    the very rows prepare digested, so the frozen highest position is the bound. Otherwise — a
    change counted (by a store path or raw SQL), an operation prepared before the witness, a
    source that reads rows through a link of its own — the digest is recomputed and compared
    as before."""
    source = copy.source_session_id
    if copy.through_position is not None and fenced_history_unchanged(tx.conn, ws, source, op_seq):
        return copy.through_position
    count, digest, top = boundary_proof(tx.conn, ws, source, copy.through)
    if (count, digest) != (copy.count, copy.digest):
        raise ForkSnapshotCorrupt(
            "the source's history through the fork Turn changed since prepare"
            f" ({copy.count} Messages frozen, {count} found)"
        )
    return top


def _link_history(tx: Tx, plan: ChildPlan, key: int, through_position: int) -> None:
    """The child's Messages: a link to the source's boundary (nothing copied), and the payloads
    prepare rewrote (allowlisted references) as the child's own rows."""
    copy = plan.copy
    assert copy is not None
    s = plan.session
    link_messages(
        tx.conn,
        ws=s.workspace_id,
        source_session_id=copy.source_session_id,
        through=copy.through,
        through_position=through_position,
        target_session_id=s.session_id,
        target_key=key,
        message_prefix=copy.prefixes.message,
        turn_prefix=copy.prefixes.turn,
        linked_at_ms=plan.committed_at_ms,
        rewritten=copy.rewritten,
    )


def _insert_session(tx: Tx, s: Session) -> None:
    """The child's Session row (its key made by the trigger on the insert)."""
    tx.execute(
        "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
        " title, cwd, settings_json, runtime_context_json, model, pinned, deleted, goal,"
        " parent_session_id, parent_turn_id, rail_placement, visibility, created_at_ms,"
        " updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, NULL, NULL, ?,"
        " ?, ?, ?)",
        (
            s.workspace_id,
            s.session_id,
            s.kind,
            s.provider,
            s.provider_session_id,
            s.title,
            s.cwd,
            dumps(dict(s.settings)),
            dumps(dict(s.runtime_context)),
            s.model,
            s.rail_placement,
            s.visibility,
            s.created_at_ms,
            s.updated_at_ms,
        ),
    )
