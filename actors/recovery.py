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

from storage import Store
from storage.models import ForkStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    failed: int = 0
    unknown: int = 0
    committed: int = 0
    errors: int = 0


PREPARED_ERROR = "not dispatched before the host restarted"
DISPATCHING_ERROR = "dispatch outcome lost with the previous host process"


def recover_fork_operations(store: Store, *, page_size: int = 500) -> RecoveryReport:
    failed = unknown = committed = errors = 0
    cursor = None
    while True:
        ops, cursor = store.recoverable_fork_operations(after=cursor, limit=page_size)
        # One transaction (one fsync) per page for the two pure status changes.
        page_failed, page_unknown = store.settle_leftover_fork_operations(
            ops, prepared_error=PREPARED_ERROR, dispatching_error=DISPATCHING_ERROR
        )
        failed += page_failed
        unknown += page_unknown
        accepted = [op for op in ops if op.status is ForkStatus.PROVIDER_ACCEPTED]
        if accepted:
            page_committed, page_errors = store.commit_fork_operations(accepted)
            committed += page_committed
            errors += page_errors
        if cursor is None:
            break
    return RecoveryReport(failed, unknown, committed, errors)


ORPHANED_TURN_ERROR = "the host restarted during this turn"


def settle_orphaned_turns(store: Store) -> int:
    """Turns left active by a previous process can never receive their provider's events
    (its runtimes died with it): settle them `interrupted`, which also finishes their submit
    claims and supersedes pending Interactions, so the Session takes turns (and forks) again."""
    settled = 0
    for ws, sid, turn_id in store.all_active_turns():
        try:
            _, changed = store.settle_turn(
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
