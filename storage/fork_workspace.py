"""A worktree fork's tree on its operation row: the checkpoint the prepare reads from the fork
Turn, the tree recorded once whole (before dispatch), and the trees of failed operations that
start-up recovery and the saga remove. The tree itself is made and removed by the actors
(`workspace.worktree`); this module only keeps what is true of it durably."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import apsw

from domain.errors import InvalidTransition
from domain.fork_states import ACTIVE, ForkStatus
from storage.base import Database
from storage.models import ForkOperation, ForkOperationChanged, TreeToRemove
from storage.rows import load_op
from storage.sqlite import Row, Tx, loads

PLANNED = "planned"
MADE = "made"
REMOVED = "removed"
REMOVING = "removing"
"""A committed fork's tree its child's `session.delete {worktree: "remove"}` is removing: set
with the delete, `removed` once gone; a crash in between is finished at start-up."""


def ancestors(path: str) -> list[str]:
    """`path` and every prefix of it that ends before a `/` (`/a/b` → `/a/b`, `/a`): the paths
    a tree at which `path` is or lies in could be recorded by — `path == tree` or
    `path.startswith(tree + "/")`, as a handful of equality probes of an index."""
    found = [path[:i] for i, c in enumerate(path) if c == "/" and i > 0]
    return [*found, path] if path else found


def deleted_tree_at(tx: Tx, *cwds: str) -> tuple[str, str, str] | None:
    """The tree of a deleted fork child (recorded `removing`: git could not remove it yet, or
    `removed`) that one of `cwds` (a Session's cwd as given and its real path: a tree is
    recorded by its real path) is or lies in: its path, the fork operation that made it and
    its state; None when there is none. Read in the creating transaction, so no Session
    starts in a tree the daemon removes or removed (`session.create` refuses it: the worktree
    law, docs/design/workspace.md). Each ancestor of each cwd is probed in
    `fork_operations_deleted_trees` (schema v25), which holds only the deleted children's
    trees: a few index lookups however many there are (it decoded the plan of every one)."""
    probes = sorted({p for cwd in cwds for p in ancestors(cwd)})
    if not probes:
        return None
    row = tx.one(
        "SELECT deleted_tree_path, operation_id, workspace_state FROM fork_operations"
        " INDEXED BY fork_operations_deleted_trees"
        f" WHERE deleted_tree_path IN ({', '.join('?' * len(probes))})"
        " AND status = ? AND workspace_state IN (?, ?) ORDER BY op_seq LIMIT 1",
        (*probes, ForkStatus.COMMITTED.value, REMOVING, REMOVED),
    )
    return None if row is None else (str(row[0]), str(row[1]), str(row[2]))


# A live Session's path as known (schema v25): its real cwd where it differs from the cwd it
# was given, else that cwd.
_REAL = "coalesce(real_cwd, cwd)"


def tree_users_in(
    rows: Callable[[str, Sequence[Any]], list[Row]], ws: str, sid: str, path: str
) -> list[str]:
    """`ForkWorkspace.tree_users` read through `rows` (the store's reader, or a write
    transaction's `all`: the delete that marks the tree `removing` asks again in its own).
    Compared by real path (`path` is one: a tree is recorded by its real path): a Session's
    `real_cwd`, kept by `session.create` when its cwd was spelled otherwise (a symlink, `..`,
    a doubled slash), else its cwd. A fork child carries its source's cwd as spelled, not its
    real path: so a Session is a user too when its cwd is spelled as any Session's (live or
    deleted) whose real path is in the tree."""
    # The spellings: through `sessions_real_cwd` (schema v25), which holds only the Sessions
    # started by another spelling; "in the tree" as a range of it (`/` + 1 is `0`).
    users = [
        str(r[0])
        for r in rows(
            "SELECT session_id FROM sessions WHERE deleted = 0"
            " AND NOT (workspace_id = ?4 AND session_id = ?5)"
            f" AND ({_REAL} = ?1 OR substr({_REAL}, 1, ?2) = ?3 OR cwd IN (SELECT cwd FROM"
            " sessions INDEXED BY sessions_real_cwd WHERE real_cwd IS NOT NULL"
            " AND (real_cwd = ?1 OR (real_cwd >= ?3 AND real_cwd < ?6))))"
            " ORDER BY created_at_ms, session_id",
            (path, len(path) + 1, path + "/", ws, sid, path + "0"),
        )
    ]
    pending = sorted(s.value for s in ACTIVE | {ForkStatus.UNKNOWN})
    users += [
        str(r[0])
        for r in rows(
            "SELECT target_session_id FROM fork_operations WHERE workspace_id = ?"
            " AND source_session_id = ? AND workspace_mode <> 'worktree'"
            f" AND status IN ({', '.join('?' * len(pending))}) ORDER BY op_seq",
            (ws, sid, *pending),
        )
        if r[0] is not None and str(r[0]) not in users
    ]
    return users


@dataclass(frozen=True, slots=True)
class ChildTree:
    """The tree a worktree fork made for a Session (its `cwd` lies in it)."""

    operation_id: str
    plan: Mapping[str, Any]


def boundary_checkpoint(
    conn: apsw.Connection, ws: str, session_id: str, turn_id: str
) -> Mapping[str, Any] | None:
    """The fork Turn's workspace checkpoint record (`turns.checkpoint_json`), or None."""
    row = conn.execute(
        "SELECT checkpoint_json FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, session_id, turn_id),
    ).fetchone()
    value = None if row is None else loads(row[0])
    return value if isinstance(value, Mapping) else None


class ForkWorkspace:
    """The worktree state of fork operations."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._write = db.write
        self._all = db.rows
        self._one = db.one

    def record_fork_worktree(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        """The planned tree is whole at its path: recorded while the operation is still
        `prepared`, so a crash after this keeps it (and a dispatch needs it)."""
        with self._write(ws) as tx:
            op = load_op(tx.conn, ws, op_id, project=False)
            if op.worktree_state == MADE:
                return op, False
            if op.worktree_state != PLANNED or op.status is not ForkStatus.PREPARED:
                raise InvalidTransition(
                    f"fork operation {op_id} ({op.status}, worktree {op.worktree_state}) cannot"
                    " record a worktree",
                    params={"operationId": op_id, "status": op.status.value},
                )
            tx.execute(
                "UPDATE fork_operations SET workspace_state = ? WHERE workspace_id = ?"
                " AND operation_id = ? AND workspace_state = ?",
                (MADE, ws, op_id, PLANNED),
            )
            tx.emit(ForkOperationChanged(ws, op_id))
            return replace(op, worktree_state=MADE), True

    def mark_fork_worktree_removed(self, ws: str, op_id: str) -> bool:
        """The tree of a failed operation is gone from disk (only a failed one's is removed)."""
        with self._write(ws) as tx:
            tx.execute(
                "UPDATE fork_operations SET workspace_state = ? WHERE workspace_id = ?"
                " AND operation_id = ? AND status = ? AND workspace_state IN (?, ?)",
                (REMOVED, ws, op_id, ForkStatus.FAILED.value, PLANNED, MADE),
            )
            changed = tx.changes() == 1
            if changed:
                tx.emit(ForkOperationChanged(ws, op_id))
            return changed

    def fork_worktrees_to_remove(self, limit: int = 500) -> list[TreeToRemove]:
        """Failed operations whose tree (whole, half-made or never begun) is not yet known
        removed; recovery removes each and marks it. Every start asks, so the rows are found
        through `fork_operations_worktrees` (the operations that have a tree at all) and the few
        found are sorted: ordered by a plain `op_seq` SQLite walked `(status, op_seq)` instead,
        reading every failed operation the store ever kept (4,000 on the store of months: 3–10
        ms a start warm, ~47 ms cold)."""
        rows = self._all(
            "SELECT workspace_id, operation_id, workspace_json FROM fork_operations"
            " WHERE status = ? AND workspace_state IN (?, ?) ORDER BY +op_seq LIMIT ?",
            (ForkStatus.FAILED.value, PLANNED, MADE, limit),
        )
        return [TreeToRemove(r[0], r[1], loads(r[2])) for r in rows]

    def failed_fork_tree(self, ws: str, op_id: str) -> TreeToRemove | None:
        """The tree of failed operation `op_id` while it is not yet known removed (None once
        it is, or for any other operation): what a live retry of it asks each round."""
        row = self._one(
            "SELECT workspace_json FROM fork_operations WHERE workspace_id = ?"
            " AND operation_id = ? AND status = ? AND workspace_state IN (?, ?)",
            (ws, op_id, ForkStatus.FAILED.value, PLANNED, MADE),
        )
        return None if row is None else TreeToRemove(ws, op_id, loads(row[0]))

    def session_worktree(self, ws: str, sid: str) -> ChildTree | None:
        """The tree a worktree fork made for `sid` (the committed child), while it stands."""
        row = self._one(
            "SELECT operation_id, workspace_json FROM fork_operations WHERE workspace_id = ?"
            " AND target_session_id = ? AND status = ? AND workspace_mode = 'worktree'"
            " AND workspace_state = ? ORDER BY op_seq DESC LIMIT 1",
            (ws, sid, ForkStatus.COMMITTED.value, MADE),
        )
        if row is None:
            return None
        plan = loads(row[1])
        return ChildTree(str(row[0]), plan) if isinstance(plan, Mapping) else None

    def tree_users(self, ws: str, sid: str, path: str) -> list[str]:
        """Who else works in the tree at `path` (a worktree fork made it for `sid`): every
        live Session but `sid` whose `cwd` is `path` or lies below it (a shared-workspace fork
        of `sid`, a Session a person started there), in any workspace; and the target of every
        fork of `sid` that may still commit a child sharing its `cwd` (not worktree mode,
        in flight or `unknown`). A tree any of them names is not removed with `sid`."""
        return tree_users_in(self._all, ws, sid, path)

    def newest_checkpoint(self, ws: str, sid: str) -> str | None:
        """The `after` tree of the Session's newest settled Turn that has one."""
        for (raw,) in self._all(
            "SELECT checkpoint_json FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND phase = 'settled' AND checkpoint_json IS NOT NULL ORDER BY sequence DESC",
            (ws, sid),
        ):
            record = loads(raw)
            if isinstance(record, Mapping) and record.get("after"):
                return str(record["after"])
        return None

    def mark_child_worktree_removed(self, ws: str, op_id: str) -> bool:
        """The tree a deleted child's `session.delete` was removing is gone."""
        with self._write(ws) as tx:
            tx.execute(
                "UPDATE fork_operations SET workspace_state = ? WHERE workspace_id = ?"
                " AND operation_id = ? AND workspace_state = ?",
                (REMOVED, ws, op_id, REMOVING),
            )
            changed = tx.changes() == 1
            if changed:
                tx.emit(ForkOperationChanged(ws, op_id))
            return changed

    def child_worktrees_removing(self) -> list[TreeToRemove]:
        """Trees a delete began removing that are not yet gone: a stop interrupted it, or git
        could not remove the tree (start-up finishes them; the live daemon retries the
        latter, `worktree_delete.RemovalRetries`)."""
        rows = self._all(
            "SELECT workspace_id, operation_id, workspace_json, target_session_id"
            " FROM fork_operations WHERE status = ? AND workspace_state = ? ORDER BY op_seq",
            (ForkStatus.COMMITTED.value, REMOVING),
        )
        return [TreeToRemove(r[0], r[1], loads(r[2]), r[3]) for r in rows]
