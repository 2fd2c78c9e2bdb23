"""The durable fork operation, one concern per module behind this one class:

- `fork_rows`: the row and its decode; `fork_fence`: the source fence;
- `fork_prepare`: idempotency, barrier, reservation, boundary and snapshot in one transaction;
- `fork_transitions`: the guarded status changes and the client ACK;
- `fork_evidence`: the provider evidence that accepts an operation;
- `fork_commit`: the child written from the snapshot (law 2);
- `fork_recovery`: start-up leftovers and the restart rule; `fork_queries`: pure reads;
- `fork_workspace`: a worktree fork's tree, recorded before dispatch, removed when failed.
"""

from __future__ import annotations

from domain.errors import ForkEvidenceRejected, ForkSnapshotCorrupt
from storage.fork_commit import ForkCommit
from storage.fork_fence import ForkFence
from storage.fork_prepare import ForkPrepare
from storage.fork_queries import ForkQueries
from storage.fork_recovery import ForkRecovery
from storage.fork_transitions import ForkTransitions
from storage.fork_workspace import ForkWorkspace


class ForkStore(
    ForkPrepare, ForkTransitions, ForkCommit, ForkRecovery, ForkFence, ForkQueries, ForkWorkspace
):
    """The fork contract of seed 000 §3–§6, §8.3, §10; mixed into `storage.Store`."""


__all__ = ["ForkEvidenceRejected", "ForkSnapshotCorrupt", "ForkStore"]
