"""A warm fork's WAL frames, counted: each COMMIT writes one 4 KiB frame per b-tree page it
changed (a leaf of each table and index its rows touch), so every index a fork's rows move is
a frame (and its checksum and `pwrite`s) in every fork. Schema v21 dropped the three that no
query needs (`turns_by_phase`, `history_fences_by_op`, `session_reservations_by_operation`) and
made `session_reservations` and `fork_lineage` WITHOUT ROWID (their key the table's own
b-tree): the steady warm fork here went from 38 frames to 32 (11 + 3 + 3 + 19 + 2 to
8 + 3 + 3 + 16 + 2; through the daemon 40 to 34, its larger snapshot row taking a new leaf and
the header page at each prepare; docs/performance.md, walpages). Schema v22 made the barrier's
partial index's WHERE a flag the status steps never set, so SQLite no longer rewrites its leaf at
dispatching, provider_accepted and committed: 32 to 29 (8 + 2 + 2 + 15 + 2; barrierflag). Schema
v23 keyed `fork_operations_by_source` on the operation's stage, not its status, so dispatching and
provider_accepted, which keep the stage, write the row alone: 29 to 27 (8 + 1 + 1 + 15 + 2; stage).
The saga's warm path prepares straight at `dispatching` (one transaction where there were two):
27 to 26 (8 + 1 + 15 + 2; forkstore) — the operation's leaf is written once, not twice.
Counts, never timings: the WAL's frame count after each COMMIT, as SQLite reports it to the
store's WAL hook, with the checkpointer held off so the log never restarts under the count.
"""

from __future__ import annotations

import uuid

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import request, run_to_commit, run_to_commit_from_dispatching

from storage.store import Store

pytestmark = pytest.mark.timeout(60)

FORKS = 8


def _frames_per_step(store: Store, sid: str, last: str, *, folded: bool = False) -> list[list[int]]:
    """The frames of each COMMIT of the last `FORKS - 1` of `FORKS` warm forks (lazy prepare,
    dispatching, accepted, commit, ACK; `folded`: the prepare at `dispatching`, then accepted,
    commit, ACK), one list per fork."""
    db = store.db
    db.checkpoint_pages = 10**9  # no checkpoint: the WAL only grows while we count
    conn = db._writer_connection()
    reported: list[int] = []
    original = db._wal_grew

    def hook(c: apsw.Connection, name: str, pages: int) -> int:
        reported.append(pages)
        return original(c, name, pages)

    conn.set_wal_hook(hook)
    forks: list[list[int]] = []
    try:
        for _ in range(FORKS):
            before = len(reported)
            op, created = store.fork_prepare.prepare_fork(
                WS,
                request(sid, last, target=str(uuid.uuid4())),
                durable=folded,
                dispatching=folded,
            )
            assert created
            if folded:
                run_to_commit_from_dispatching(store, op)
            else:
                run_to_commit(store, op)
            store.fork_transitions.acknowledge_fork(WS, op.operation_id)
            marks = reported[before:]
            # Five COMMITs (four folded), each its own group here.
            assert len(marks) == 4 + (not folded), marks
            if before:  # the hook's first report is the baseline, not a fork's frames
                start = reported[before - 1]
                assert all(b > a for a, b in zip([start, *marks], marks, strict=False)), (
                    start,
                    marks,
                )
                forks.append([b - a for a, b in zip([start, *marks], marks, strict=False)])
    finally:
        conn.set_wal_hook(original)
    return forks


def test_a_warm_fork_writes_at_most_27_wal_frames(store: Store) -> None:
    sid = new_session(store)
    last = ""
    for i in range(3):
        last = settled_turn(store, sid, text=f"turn {i}", provider_turn_id=f"p{i}").turn_id
    # One fork first: its rows' pages exist after it (the first of each b-tree's growth).
    first = store.fork_prepare.prepare_fork(
        WS, request(sid, last, target=str(uuid.uuid4())), durable=False
    )[0]
    run_to_commit(store, first)
    store.fork_transitions.acknowledge_fork(WS, first.operation_id)
    forks = _frames_per_step(store, sid, last)
    totals = [sum(f) for f in forks]
    # A b-tree page split adds a frame or two now and then (a new leaf and its parent) and a
    # snapshot row that needs a new leaf the header page; the median fork is the steady one.
    assert sorted(totals)[len(totals) // 2] <= 27, forks
    # prepare, dispatching, accepted, commit, ACK: dispatching and accepted each move the
    # operation's row alone — not `_by_source` (its key has the stage, which they do not
    # change: schema v23) nor the barrier's index (its WHERE is the flag they do not set);
    # the ACK the row and the barrier's index (the flag).
    steady = [f for f in forks if sum(f) == sorted(totals)[len(totals) // 2]]
    assert steady and steady[0][1:3] == [1, 1] and steady[0][4] == 2, forks


def test_a_warm_fork_prepared_at_dispatching_writes_at_most_26_wal_frames(store: Store) -> None:
    """The saga's warm path: prepare writes the row at `dispatching` (one transaction for
    both), so the operation's leaf is written once — 26 frames, not 27 (8 + 1 + 15 + 2)."""
    sid = new_session(store)
    last = ""
    for i in range(3):
        last = settled_turn(store, sid, text=f"turn {i}", provider_turn_id=f"p{i}").turn_id
    first = store.fork_prepare.prepare_fork(
        WS, request(sid, last, target=str(uuid.uuid4())), dispatching=True
    )[0]
    run_to_commit_from_dispatching(store, first)
    store.fork_transitions.acknowledge_fork(WS, first.operation_id)
    forks = _frames_per_step(store, sid, last, folded=True)
    totals = [sum(f) for f in forks]
    assert sorted(totals)[len(totals) // 2] <= 26, forks
    steady = [f for f in forks if sum(f) == sorted(totals)[len(totals) // 2]]
    # prepare (at dispatching), accepted, commit, ACK: the prepare's frames are the lazy
    # prepare's, dispatching's own frame is gone.
    assert steady and steady[0][0] == 8 and steady[0][1] == 1 and steady[0][3] == 2, forks
