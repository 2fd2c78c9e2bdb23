"""Start-up recovery of fork operations left non-terminal by a previous process (seed 000 §10).

Runs before the daemon serves requests, paging by the store's stable cursor:
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


def recover_fork_operations(store: Store, *, page_size: int = 500) -> RecoveryReport:
    failed = unknown = committed = errors = 0
    cursor = None
    while True:
        ops, cursor = store.recoverable_fork_operations(after=cursor, limit=page_size)
        for op in ops:
            ws, op_id = op.workspace_id, op.operation_id
            try:
                if op.status is ForkStatus.PREPARED:
                    store.mark_fork_failed(ws, op_id, "not dispatched before the host restarted")
                    failed += 1
                elif op.status is ForkStatus.DISPATCHING:
                    store.mark_fork_unknown(
                        ws, op_id, "dispatch outcome lost with the previous host process"
                    )
                    unknown += 1
                elif op.status is ForkStatus.PROVIDER_ACCEPTED:
                    store.commit_fork(ws, op_id)
                    committed += 1
            except Exception:  # noqa: BLE001 - one bad row must not stop recovery of the rest
                log.exception("recovery of fork operation %s failed", op_id)
                errors += 1
        if cursor is None:
            break
    return RecoveryReport(failed, unknown, committed, errors)
