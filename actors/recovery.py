"""Start-up recovery of fork operations left non-terminal by a previous process (seed 000 §10).

Runs before the daemon serves requests (together with `settle_orphaned_turns`), paging by
the store's stable cursor:
`prepared` → failed (fence and reservation released), `dispatching` → unknown (no provider
call: the request may have left), `provider_accepted` → commit. Terminal rows are untouched;
a committed-but-unACKed operation keeps its barrier.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from actors.store_ports import RestartRuleStore, StartupRecoveryStore
from domain.fork_states import ForkStatus, after_restart
from domain.interrupts import HOST_RESTART_ERROR
from storage.models import ForkOperation

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    failed: int = 0
    unknown: int = 0
    committed: int = 0
    errors: int = 0


PREPARED_ERROR = "not dispatched before the host restarted"
DISPATCHING_ERROR = "dispatch outcome lost with the previous host process"


def apply_restart_rule(
    store: RestartRuleStore,
    op: ForkOperation,
    *,
    prepared_error: str = PREPARED_ERROR,
    dispatching_error: str = DISPATCHING_ERROR,
) -> ForkOperation:
    """The restart rule (`domain.fork_states.after_restart`) applied to one operation that no
    live saga owns: `prepared` → failed, `dispatching` → unknown (never re-sent),
    `provider_accepted` → committed; a terminal operation is returned as it is. Used by
    `fork.get` on a leftover and by a saga's abort; start-up recovery applies the same rule
    to every leftover's status change at once (`Store.settle_leftover_fork_statuses`) and to
    the commits a page at a time (`commit_fork_operations`)."""
    ws, op_id = op.workspace_id, op.operation_id
    to = after_restart(op.status)
    if to is ForkStatus.FAILED:
        return store.fork_transitions.mark_fork_failed(ws, op_id, prepared_error)[0]
    if to is ForkStatus.UNKNOWN:
        return store.fork_transitions.mark_fork_unknown(ws, op_id, dispatching_error)[0]
    if to is ForkStatus.COMMITTED:
        return store.fork_commit.commit_fork(ws, op_id)[0]
    return op


def recover_fork_operations(store: StartupRecoveryStore, *, page_size: int = 500) -> RecoveryReport:
    # The two pure status changes first, for every leftover at once (one transaction, one
    # fsync, no row decoded); what is left active then is only `provider_accepted`.
    failed, unknown = store.fork_recovery.settle_leftover_fork_statuses(
        prepared_error=PREPARED_ERROR, dispatching_error=DISPATCHING_ERROR
    )
    committed = errors = 0
    cursor = None
    while True:
        ops, cursor = store.fork_recovery.recoverable_fork_operations(after=cursor, limit=page_size)
        accepted = [op for op in ops if after_restart(op.status) is ForkStatus.COMMITTED]
        if accepted:
            page_committed, page_errors = store.fork_commit.commit_fork_operations(accepted)
            committed += page_committed
            errors += page_errors
        if cursor is None:
            break
    return RecoveryReport(failed, unknown, committed, errors)


ORPHANED_TURN_ERROR = HOST_RESTART_ERROR


def settle_orphaned_turns(store: StartupRecoveryStore) -> int:
    """Turns left active by a previous process can never receive their provider's events
    (its runtimes died with it): settle them `interrupted`, which also finishes their submit
    claims and supersedes pending Interactions, so the Session takes turns (and forks) again."""
    settled = 0
    for ws, sid, turn_id in store.turns.all_active_turns():
        try:
            _, changed = store.turns.settle_turn(
                ws,
                sid,
                turn_id,
                outcome="interrupted",
                error=ORPHANED_TURN_ERROR,
                include_deleted=True,
            )
            settled += int(changed)
        except Exception:  # noqa: BLE001 - one bad row must not stop the rest
            log.exception("could not settle orphaned turn %s/%s", sid, turn_id)
    return settled
