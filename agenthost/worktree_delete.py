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
from dataclasses import dataclass
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


class RetriedTrees(ChildTreeRemovals, Protocol):
    """`store.fork_workspace` for `RemovalRetries`: the trees left `removing`, the failed
    forks' trees not yet removed, who works in one, their `removed` records."""

    def tree_users(self, ws: str, sid: str, path: str) -> list[str]: ...

    def fork_worktrees_to_remove(self, limit: int = 500) -> list[TreeToRemove]: ...

    def failed_fork_tree(self, ws: str, op_id: str) -> TreeToRemove | None: ...

    def mark_fork_worktree_removed(self, ws: str, op_id: str) -> bool: ...


class ChildTrees(ChildTreeRemovals, Protocol):
    """`store.fork_workspace`: a fork child's tree and its newest checkpoint."""

    def session_worktree(self, ws: str, sid: str) -> ChildTree | None: ...

    def newest_checkpoint(self, ws: str, sid: str) -> str | None: ...

    def tree_users(self, ws: str, sid: str, path: str) -> list[str]: ...


class SessionDeletes(Protocol):
    def delete_session(
        self, ws: str, sid: str, *, removing_tree: str | None = None
    ) -> list[str]: ...


class DeleteStore(Protocol):
    @property
    def fork_workspace(self) -> ChildTrees: ...

    @property
    def sessions(self) -> SessionDeletes: ...


class RetryStore(Protocol):
    @property
    def fork_workspace(self) -> RetriedTrees: ...


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
    retry: Callable[[str, str, str, Waiting], None] | None = None,
) -> Callable[[DeleteStore, str, str], DeleteResult]:
    """The delete, run on the Session's actor. Its result: `{deleted: true}`, plus `worktree:
    {path, cwd, branch, state: "kept"|"removed"|"removing", branchKept?, error?}` for a Session
    with a fork-made tree (`removing`: deleted, but the tree could not be removed now —
    `error` says why; `retry(ws, operation_id, path, why)` has the live daemon try again later,
    `RemovalRetries`, and the next start tries too)."""

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
        late = store.sessions.delete_session(ws, sid, removing_tree=child.operation_id)
        if late:
            # A Session started in the tree since the check above (seen by the deleting
            # transaction itself): the tree stays `made`, kept as for `users`.
            return {"deleted": True, "worktree": {**_tree(plan, "kept"), "inUseBy": late}}
        try:
            branch_kept = trees.remove_child(plan)
        except Exception as exc:  # noqa: BLE001 - the Session is deleted: the rest of it goes on
            # git (or the fallback's unlink) could not remove it now: the tree stays recorded
            # `removing` (what is left of it at `path`), which the next start finishes.
            log.exception("could not remove the worktree %s of deleted %s", plan.path, sid)
            error = str(exc) or type(exc).__name__
            if retry is not None:
                retry(ws, child.operation_id, plan.path, Waiting(GIT_FAILED, error=error))
            return {"deleted": True, "worktree": {**_tree(plan, "removing"), "error": error}}
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


IN_USE = "in_use"
GIT_FAILED = "git_failed"
NOT_RECORDED = "not_recorded"
NOT_TRIED = "not_tried"


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a tree left `removing` is not removed yet (`host.status` → `worktreeRemovals` →
    `trees[]`): another live Session works in it (`in_use`, `in_use_by`), git (or the
    fallback's unlink) could not remove it (`git_failed`, `error`), it went but its `removed`
    record did not land (`not_recorded`, `error`), or this daemon has not tried it yet
    (`not_tried`)."""

    reason: str
    error: str | None = None
    in_use_by: tuple[str, ...] = ()

    def wire(self, path: str) -> dict[str, Any]:
        tree: dict[str, Any] = {"path": path, "reason": self.reason}
        if self.reason == IN_USE:
            tree["inUseBy"] = list(self.in_use_by)
        elif self.error is not None:
            tree["error"] = self.error
        return tree


def finish_removals(
    store: RetryStore, trees: Worktrees | None, left: dict[str, Waiting] | None = None
) -> int:
    """Start-up: the trees a delete began removing when the daemon stopped. A `removed` mark
    the store refuses (busy, full) is retried with backoff before the ready line and past 30 s
    fails the start (`recovery.start_write`), as start-up's other writes do. `left`: filled
    with why each tree it could not finish is still there (`RemovalRetries.retry_left`)."""
    if trees is None:
        return 0
    left = {} if left is None else left
    done = 0
    for item in store.fork_workspace.child_worktrees_removing():
        path = str(item.plan.get("path", ""))
        users = store.fork_workspace.tree_users(item.workspace_id, item.session_id or "", path)
        if users:
            # A Session started in it since (or a pending fork of its child): never removed
            # under them; it stays `removing` (`RemovalRetries` tries it again later).
            log.warning("the worktree %s left removing is in use by %s: kept", path, users)
            left[item.operation_id] = Waiting(IN_USE, in_use_by=tuple(users))
            continue
        failed: list[str] = []
        if remove_then_record(
            partial(_remove_child, trees, item.plan, failed),
            partial(
                store.fork_workspace.mark_child_worktree_removed,
                item.workspace_id,
                item.operation_id,
            ),
            f"the worktree of {item.operation_id}",
        ):
            done += 1
        elif failed:
            left[item.operation_id] = Waiting(GIT_FAILED, error=failed[0])
        else:
            left[item.operation_id] = Waiting(NOT_RECORDED, error="see the daemon's log")
    return done


TREE_RETRY_MAX_S = 600.0
"""The longest wait between two retries of a tree left `removing` (they double from the
first, `[workspace] tree_retry_s`, 30 s by default)."""


@dataclass(frozen=True, slots=True)
class _Pending:
    """A tree `RemovalRetries` tries again: a deleted child's (`removing`) or a failed fork's
    (`failed`: its operation failed, its tree `planned` or `made`, whole or half-made)."""

    ws: str
    path: str
    why: Waiting
    failed: bool = False


class RemovalRetries:
    """The live daemon's retries of the trees git could not remove (`removing`: a delete's
    step 3 failed, or start-up's `finish_removals` did; a failed fork's tree the saga, a
    `fork.get` or start-up could not remove): one thread, so at most one retry in
    flight, trying every such tree after `first_s`, then at doubling waits up to `max_s`,
    until none is left; a new one (`retry`) starts the waits again from `first_s` (the round
    already due, if sooner, is kept). A tree gone
    is recorded `removed` (a record the store refuses is tried again at the next round: the
    removal is idempotent). A tree another live Session works in, or a pending fork of its
    child may still commit into (`tree_users`), is never removed: it stays `removing` and is
    tried again later — at once when one of those Sessions is deleted (`user_gone`). Without
    it such a tree stayed `removing`, on disk, until a restart."""

    def __init__(
        self,
        store: RetryStore,
        trees: Worktrees | None,
        shadow: ShadowStore | None,
        locks: DirectoryLocks,
        *,
        first_s: float,
        max_s: float = TREE_RETRY_MAX_S,
    ) -> None:
        self._store = store
        self._trees = trees
        self._shadow = shadow
        self._locks = locks
        self._first_s = first_s
        self._max_s = max(first_s, max_s)
        self._mutex = threading.Lock()
        # operation id -> its tree, and why it is not removed yet
        self._pending: dict[str, _Pending] = {}
        self._wake = threading.Event()
        self._now = False  # the next wake asks for a round now (`user_gone`)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.removed = 0

    @property
    def pending(self) -> int:
        with self._mutex:
            return len(self._pending)

    def retry(
        self, ws: str, op_id: str, path: str, why: Waiting | None = None, *, failed: bool = False
    ) -> None:
        """Try the tree at `path` of `op_id` (recorded `removing`; `failed`: a failed fork's)
        again later; `why` it is not removed now (unknown: `not_tried`)."""
        if self._trees is None or self._stop.is_set():
            return
        with self._mutex:
            self._pending[op_id] = _Pending(ws, path, why or Waiting(NOT_TRIED), failed)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agenthost-tree-retry", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def retry_failed(self, ws: str, op_id: str, path: str, error: str) -> None:
        """A failed fork's tree git could not remove (`error`), handed on by its Session's
        actor (`HostContext.retry_failed_tree`): tried again as a deleted child's is."""
        self.retry(ws, op_id, path, Waiting(GIT_FAILED, error=error), failed=True)

    def user_gone(self, sid: str) -> None:
        """Session `sid` was deleted: a tree kept only while it worked there (`in_use`) is
        tried again now, not at the next of the doubling waits (up to 10 minutes later)."""
        with self._mutex:
            if not any(sid in p.why.in_use_by for p in self._pending.values()):
                return
            self._now = True
        self._wake.set()

    def retry_left(self, why: Mapping[str, Waiting] | None = None) -> int:
        """After start-up: every tree still `removing`, and every failed fork's tree still not
        removed (their removal failed there too: `why`, what `finish_removals` and
        `remove_failed_trees` found)."""
        store = self._store.fork_workspace
        left = [(item, False) for item in store.child_worktrees_removing()]
        left += [(item, True) for item in store.fork_worktrees_to_remove()]
        for item, failed in left:
            path = str(item.plan.get("path", ""))
            self.retry(
                item.workspace_id,
                item.operation_id,
                path,
                (why or {}).get(item.operation_id),
                failed=failed,
            )
        return len(left)

    def status(self) -> dict[str, Any]:
        """`host.status` → `worktreeRemovals`: the trees left `removing` that this daemon
        tries again (`paths`; `trees`: each with why it is not removed yet, `Waiting`), its
        rounds so far and the trees they removed."""
        with self._mutex:
            trees = sorted(((p.path, p.why) for p in self._pending.values()), key=lambda t: t[0])
        return {
            "pending": len(trees),
            "paths": [path for path, _ in trees],
            "trees": [why.wire(path) for path, why in trees],
            "rounds": self.rounds,
            "removed": self.removed,
        }

    def stop(self) -> None:
        """No retry starts from now on (one under way ends with its git)."""
        self._stop.set()
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self.stop()
        with self._mutex:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        # The next round's time (None: nothing to retry, wait for `retry`). A new tree brings
        # it to `first_s` from now at the latest, never later: restarting the wait at each
        # `retry` let a stream of them (sooner than `first_s` apart) hold every round back.
        due: float | None = None
        delay = self._first_s
        while not self._stop.is_set():
            timeout = None if due is None else max(0.0, due - time.monotonic())
            woken = self._wake.wait(timeout)
            if self._stop.is_set():
                return
            if woken:
                self._wake.clear()
                with self._mutex:
                    now, self._now = self._now, False
                delay = self._first_s
                soon = time.monotonic() + (0.0 if now else delay)
                due = soon if due is None else min(due, soon)
                continue
            try:
                left = self._round()
            except Exception:  # noqa: BLE001 - a store read refused: the next round tries again
                log.exception("retrying the removal of worktrees left removing")
                left = self.pending
            self.rounds += 1
            if left == 0:
                due = None
            else:
                delay = min(self._max_s, delay * 2)
                due = time.monotonic() + delay

    def _round(self) -> int:
        """One try of every pending tree; how many are left."""
        with self._mutex:
            wanted = dict(self._pending)
        store = self._store.fork_workspace
        removing: dict[str, tuple[TreeToRemove, bool]] = {
            item.operation_id: (item, False)
            for item in store.child_worktrees_removing()
            if item.operation_id in wanted and not wanted[item.operation_id].failed
        }
        for op_id, pending in wanted.items():
            if not pending.failed:
                continue
            tree = self._store.fork_workspace.failed_fork_tree(pending.ws, op_id)
            if tree is not None:
                removing[op_id] = (tree, True)
        for op_id in wanted.keys() - removing.keys():
            self._done(op_id)  # removed meanwhile (a start, a record that landed late)
        for op_id, (item, failed) in removing.items():
            if self._stop.is_set():
                break
            why = self._try(item, failed)
            if why is None:
                self._done(op_id)
            else:
                self._waiting(op_id, why)
        return self.pending

    def _done(self, op_id: str) -> None:
        with self._mutex:
            self._pending.pop(op_id, None)

    def _waiting(self, op_id: str, why: Waiting) -> None:
        with self._mutex:
            if op_id in self._pending:
                p = self._pending[op_id]
                self._pending[op_id] = _Pending(p.ws, p.path, why, p.failed)

    def _try(self, item: TreeToRemove, failed: bool = False) -> Waiting | None:
        """Remove the tree and record it `removed` (None); else why it must wait for a later
        round (in use, git still cannot remove it, the store refused the record). `failed`: a
        failed fork's tree (whole or half-made, its `.partial-` registration too; its branch
        only at the checkpoint's HEAD commit: `Worktrees.remove`), no child Session's."""
        assert self._trees is not None
        plan = TreePlan.from_json(item.plan)
        ws, op_id = item.workspace_id, item.operation_id
        store = self._store.fork_workspace
        users = store.tree_users(ws, item.session_id or "", plan.path)
        if users:
            log.info("the worktree %s left removing is in use by %s: kept", plan.path, users)
            return Waiting(IN_USE, in_use_by=tuple(users))
        remove = self._trees.remove if failed else self._trees.remove_child
        try:
            if self._shadow is None:
                remove(plan)
            else:
                with self._locks.held(self._shadow, os.path.realpath(plan.child_cwd)):
                    remove(plan)
        except Exception as exc:  # noqa: BLE001 - tried again at the next round
            log.warning("the worktree %s is still not removable: %s", plan.path, exc)
            return Waiting(GIT_FAILED, error=str(exc) or type(exc).__name__)
        try:
            if failed:
                store.mark_fork_worktree_removed(ws, op_id)
            else:
                store.mark_child_worktree_removed(ws, op_id)
        except Exception as exc:  # noqa: BLE001 - tried again at the next round
            log.warning("recording the removed worktree of %s deferred: %r", op_id, exc)
            return Waiting(NOT_RECORDED, error=str(exc) or type(exc).__name__)
        self.removed += 1
        log.info("removed the worktree %s left removing (of %s)", plan.path, op_id)
        return None


def _remove_child(trees: Worktrees, plan: Mapping[str, Any], failed: list[str]) -> None:
    """`remove_child`; why it failed is kept in `failed` (and raised on)."""
    try:
        trees.remove_child(TreePlan.from_json(plan))
    except Exception as exc:
        failed.append(str(exc) or type(exc).__name__)
        raise


__all__ = ["WORKTREE_CHOICES", "RemovalRetries", "Waiting", "delete_fn", "finish_removals"]
