"""`session.delete` of a Session whose `cwd` is a tree a worktree fork made for it
(docs/design/workspace.md "Deleting a fork's tree"): `worktree: "keep"` (the default) leaves
the tree and its branch to the person; `"remove"` removes them, unless the tree holds work that
would be lost — files its newest checkpoint does not hold, or commits no other branch holds —
which needs `force`. Runs on the Session's actor (a `Mutate`), so no Turn of it starts between
the check and the delete.

Order, crash-safe: check → delete the Session and mark the tree `removing` (one transaction) →
remove the tree (`host.session.delete.after_tree_removed`) → mark it `removed`. A stop in
between leaves `removing`, which start-up finishes (`finish_removals`); the tree is never
recorded `made` while gone. A removal git cannot do now (a file it cannot unlink) leaves it
`removing` too and the reply says so (`state: "removing"`, `error`): the rest of the delete
goes on. Once the Session is deleted nothing here raises a store error: a
`removed` record the store refuses (busy, full) is retried with backoff on a thread of its own
until it lands (`mark_removed`), and the delete is answered as done — a raise there skipped the
rest of the delete (the deleted Session's runtime kept running, its runtime dir kept) and
answered 503 for a delete that had happened.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal, Protocol

from actors.checkpoints import DirectoryLocks
from actors.recovery import remove_then_record
from domain.errors import WorkspaceUnavailable, WorkspaceWorktreeDirty
from protocol.methods import DeletedTree, DeleteResult
from storage.fork_workspace import ChildTree
from storage.models import TreeToRemove
from storage.sqlite import typed_store_error
from workspace.git import GitUnavailable
from workspace.shadow import ShadowStore
from workspace.worktree import TreePlan, Worktrees

log = logging.getLogger(__name__)

WORKTREE_CHOICES = ("keep", "remove")


class ChildTreeRemovals(Protocol):
    """`store.fork_workspace`: a fork child's tree being removed."""

    def child_worktrees_removing(self) -> list[TreeToRemove]: ...

    def mark_child_worktree_removed(self, ws: str, op_id: str) -> bool: ...


class ChildTrees(ChildTreeRemovals, Protocol):
    """`store.fork_workspace`: a fork child's tree and its newest checkpoint."""

    def session_worktree(self, ws: str, sid: str) -> ChildTree | None: ...

    def newest_checkpoint(self, ws: str, sid: str) -> str | None: ...

    def tree_users(self, ws: str, sid: str, path: str) -> list[str]: ...


class SessionDeletes(Protocol):
    def delete_session(self, ws: str, sid: str, *, removing_tree: str | None = None) -> None: ...


class DeleteStore(Protocol):
    @property
    def fork_workspace(self) -> ChildTrees: ...

    @property
    def sessions(self) -> SessionDeletes: ...


class RemovalStore(Protocol):
    @property
    def fork_workspace(self) -> ChildTreeRemovals: ...


def _where(plan: TreePlan) -> dict[str, Any]:
    return {"path": plan.path, "cwd": plan.child_cwd, "branch": plan.branch}


def _tree(plan: TreePlan, state: Literal["kept", "removed", "removing"]) -> DeletedTree:
    """The reply's `worktree`: `_where`'s fields (in its order) and what became of the tree."""
    return {"path": plan.path, "cwd": plan.child_cwd, "branch": plan.branch, "state": state}


def delete_fn(
    shadow: ShadowStore | None,
    locks: DirectoryLocks,
    *,
    worktree: Literal["keep", "remove"] | str,
    force: bool,
    hit: Callable[[str], None] | None = None,
) -> Callable[[DeleteStore, str, str], DeleteResult]:
    """The delete, run on the Session's actor. Its result: `{deleted: true}`, plus `worktree:
    {path, cwd, branch, state: "kept"|"removed"|"removing", branchKept?, error?}` for a Session
    with a fork-made tree (`removing`: deleted, but the tree could not be removed now —
    `error` says why; the next start tries again)."""

    def _delete(store: DeleteStore, ws: str, sid: str) -> DeleteResult:
        child = store.fork_workspace.session_worktree(ws, sid)
        if child is None:
            store.sessions.delete_session(ws, sid)
            return {"deleted": True}
        plan = TreePlan.from_json(child.plan)
        if worktree != "remove":
            store.sessions.delete_session(ws, sid)
            return {"deleted": True, "worktree": _tree(plan, "kept")}
        if shadow is None:
            raise WorkspaceUnavailable(
                "this daemon keeps no workspace checkpoints: it cannot tell what removing "
                f'{plan.path} would lose (delete with worktree "keep")',
                params={"workspaceReason": "disabled"},
            )
        users = store.fork_workspace.tree_users(ws, sid, plan.path)
        if users:
            # Another live Session works in the tree (a shared-workspace fork of this one, or
            # one started there): removing it would take that Session's files and folder.
            store.sessions.delete_session(ws, sid)
            return {"deleted": True, "worktree": {**_tree(plan, "kept"), "inUseBy": users}}
        trees = Worktrees(shadow)
        try:
            # `held`: a lock file a git of the check left goes with the folder's lock.
            with locks.held(shadow, os.path.realpath(plan.child_cwd)):
                unsaved = trees.unsaved(plan, store.fork_workspace.newest_checkpoint(ws, sid))
        except GitUnavailable as exc:
            raise WorkspaceUnavailable(
                f"could not read the worktree {plan.path}: {exc}",
                params={"workspaceReason": "git_failed"},
            ) from exc
        if not unsaved.clean and not force:
            what = []
            if unsaved.uncaptured:
                what.append("changes made after its last checkpoint")
            if unsaved.commits:
                what.append(
                    f"{unsaved.commits} commit(s) on {plan.branch} that no other branch has"
                )
            raise WorkspaceWorktreeDirty(
                f"the worktree {plan.path} holds {' and '.join(what)}; nothing was deleted "
                "(keep the worktree, or `force: true` removes it — its branch is kept while "
                "it has commits of its own)",
                params={
                    **_where(plan),
                    "uncaptured": unsaved.uncaptured,
                    "commits": unsaved.commits,
                },
            )
        store.sessions.delete_session(ws, sid, removing_tree=child.operation_id)
        try:
            branch_kept = trees.remove_child(plan)
        except Exception as exc:  # noqa: BLE001 - the Session is deleted: the rest of it goes on
            # git (or the fallback's unlink) could not remove it now: the tree stays recorded
            # `removing` (what is left of it at `path`), which the next start finishes.
            log.exception("could not remove the worktree %s of deleted %s", plan.path, sid)
            return {
                "deleted": True,
                "worktree": {**_tree(plan, "removing"), "error": str(exc) or type(exc).__name__},
            }
        if hit is not None:
            hit("host.session.delete.after_tree_removed")
        mark_removed(store.fork_workspace, ws, child.operation_id)
        return {
            "deleted": True,
            "worktree": {**_tree(plan, "removed"), "branchKept": branch_kept},
        }

    return _delete


RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


def mark_removed(
    store: ChildTreeRemovals, ws: str, op_id: str, *, first_s: float = RETRY_FIRST_S
) -> None:
    """Record a deleted child's tree `removed`; one the store refuses (busy, full) is retried
    with backoff on a thread of its own until it lands (a stop meanwhile leaves `removing`,
    which the next start finishes). Any other failure is logged and left to that start."""
    try:
        store.mark_child_worktree_removed(ws, op_id)
        return
    except Exception as exc:  # noqa: BLE001 - the Session is deleted: the rest of it goes on
        if typed_store_error(exc) is None:
            log.exception("could not record the removed worktree of %s", op_id)
            return
        log.warning("recording the removed worktree of %s deferred: %r", op_id, exc)

    def again() -> None:
        delay = first_s
        while True:
            time.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)
            try:
                store.mark_child_worktree_removed(ws, op_id)
                return
            except Exception as exc:  # noqa: BLE001 - retried while the store is busy
                if typed_store_error(exc) is None:
                    log.exception("could not record the removed worktree of %s", op_id)
                    return

    threading.Thread(target=again, name="agenthost-tree-record", daemon=True).start()


def finish_removals(store: RemovalStore, trees: Worktrees | None) -> int:
    """Start-up: the trees a delete began removing when the daemon stopped. A `removed` mark
    the store refuses (busy, full) is retried with backoff before the ready line and past 30 s
    fails the start (`recovery.start_write`), as start-up's other writes do."""
    if trees is None:
        return 0
    done = 0
    for item in store.fork_workspace.child_worktrees_removing():
        if remove_then_record(
            partial(_remove_child, trees, item.plan),
            partial(
                store.fork_workspace.mark_child_worktree_removed,
                item.workspace_id,
                item.operation_id,
            ),
            f"the worktree of {item.operation_id}",
        ):
            done += 1
    return done


def _remove_child(trees: Worktrees, plan: Mapping[str, Any]) -> None:
    trees.remove_child(TreePlan.from_json(plan))


__all__ = ["WORKTREE_CHOICES", "delete_fn", "finish_removals"]
