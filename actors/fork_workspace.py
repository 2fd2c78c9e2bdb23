"""A `worktree` fork's tree from the actors' side: made off the actor's thread (a checkout of a
large tree takes seconds), and removed when its fork failed — by the saga at its end, by
`fork.get` on a leftover, and by start-up recovery for whatever a stop left. An `unknown` or
`abandoned` fork keeps its tree as evidence; a committed one (adopted too) keeps it for the
child."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

from actors.recovery import remove_then_record
from actors.store_ports import WorktreeStore
from domain.fork_states import ForkStatus
from storage.models import ForkOperation
from workspace.worktree import ForkTrees

log = logging.getLogger(__name__)

T = TypeVar("T")


def in_thread(fn: Callable[[], T], name: str) -> Future[T]:
    """`fn` on a thread of its own; its outcome in the future (the actor's `later` takes it)."""
    fut: Future[T] = Future()

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - the future carries every outcome
            fut.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


def remove_failed_tree(
    store: WorktreeStore,
    trees: ForkTrees | None,
    op: ForkOperation,
    hit: Callable[[str], None] | None = None,
    git_failed: Callable[[str], None] | None = None,
) -> bool:
    """Remove the tree (whole or half-made) and branch of a failed fork and mark it removed;
    False when git cannot remove it now (`git_failed` called with its error: the daemon's
    live retries take it on; without them start-up recovery does). The mark's store error
    is raised: a live caller retries it (`fork_saga.end_failed_tree`), so a tree removed is
    never left recorded `made` until a restart. `hit`: the failpoint
    `host.workspace.after_remove` (the tree gone, not yet recorded so)."""
    if op.status is not ForkStatus.FAILED or op.worktree is None:
        return False
    if op.worktree_state not in ("planned", "made"):
        return False
    if trees is None:
        return False
    try:
        trees.remove(op.worktree)
    except Exception as exc:  # noqa: BLE001 - retried live (`git_failed`), or at the next start
        log.exception("could not remove the worktree of failed fork %s", op.operation_id)
        if git_failed is not None:
            git_failed(str(exc) or type(exc).__name__)
        return False
    if hit is not None:
        hit("host.workspace.after_remove")
    return store.fork_workspace.mark_fork_worktree_removed(op.workspace_id, op.operation_id)


def remove_failed_trees(
    store: WorktreeStore, trees: ForkTrees | None, left: dict[str, str] | None = None
) -> int:
    """Start-up: the trees of every failed fork not yet known removed (a crash before the
    record leaves no tree; one after a failure leaves none either). A `removed` mark the store
    refuses (busy, full) is retried with backoff before the ready line and past 30 s fails the
    start (`recovery.start_write`): a dropped one left the tree recorded `made`, gone on disk,
    until the next start. `left`: filled with git's error for each tree it could not remove
    (operation id → error), which the live daemon then retries."""
    if trees is None:
        return 0
    left = {} if left is None else left
    removed = 0
    while True:
        batch = store.fork_workspace.fork_worktrees_to_remove(limit=500)
        progress = 0
        for item in batch:
            if remove_then_record(
                partial(_remove, trees, item.plan, item.operation_id, left),
                partial(
                    store.fork_workspace.mark_fork_worktree_removed,
                    item.workspace_id,
                    item.operation_id,
                ),
                f"the worktree of failed fork {item.operation_id}",
            ):
                progress += 1
        removed += progress
        if len(batch) < 500 or progress == 0:
            return removed


def _remove(trees: ForkTrees, plan: Mapping[str, Any], op_id: str, left: dict[str, str]) -> None:
    """`trees.remove(plan)`; why it failed is kept in `left[op_id]` (and raised on)."""
    try:
        trees.remove(plan)
    except Exception as exc:
        left[op_id] = str(exc) or type(exc).__name__
        raise
