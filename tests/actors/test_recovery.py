"""Start-up recovery over a real store file: every non-terminal operation ends as the contract
says, page by page, and terminal ones are left alone (seed 000 §10)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import apsw

from actors.recovery import (
    DISPATCHING_ERROR,
    PREPARED_ERROR,
    DeferredCommits,
    recover_fork_operations,
    recover_resolutions,
)
from domain.fork_states import ForkStatus
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store
from tests.storage.store_builders import WS, new_session, settled_turn
from tests.support.store_reads import find_session, recoverable_fork_operations


def _prepare(store: Store) -> tuple[str, str]:
    sid = new_session(store)
    turn = settled_turn(store, sid)
    op, created = store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=str(uuid.uuid4()),
            target_session_id=str(uuid.uuid4()),
            turn_id=turn.turn_id,
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
        ),
    )
    assert created
    return op.operation_id, str(turn.root_provider_turn_id)


def _accepted(store: Store) -> str:
    """A prepared operation taken to `provider_accepted` with evidence of one child."""
    op_id, provider_turn = _prepare(store)
    store.fork_transitions.mark_fork_dispatching(WS, op_id)
    store.fork_transitions.mark_fork_provider_accepted(
        WS,
        op_id,
        ProviderForkEvidence(
            child_provider_session_id=f"child-{uuid.uuid4().hex[:6]}",
            provider_turn_ids=(provider_turn,),
            binding_mode="host_copy",
            receipt={"sha256": "x"},
        ),
    )
    return op_id


def test_recovery_fails_prepared_marks_dispatching_unknown_and_commits_accepted(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        prepared = [_prepare(store)[0] for _ in range(7)]
        dispatching = []
        for _ in range(5):
            op_id, _ = _prepare(store)
            store.fork_transitions.mark_fork_dispatching(WS, op_id)
            dispatching.append(op_id)
        accepted = []
        for _ in range(3):
            accepted.append(_accepted(store))
        done, _ = _prepare(store)
        store.fork_transitions.mark_fork_dispatching(WS, done)
        store.fork_transitions.mark_fork_unknown(WS, done, "earlier")

        # A small page size exercises the stable cursor across pages.
        report = recover_fork_operations(store, page_size=4)
        assert (report.failed, report.unknown, report.committed, report.errors) == (7, 5, 3, 0)
        for op_id in prepared:
            assert store.fork_queries.get_fork_operation(WS, op_id).status is ForkStatus.FAILED
        for op_id in dispatching:
            assert store.fork_queries.get_fork_operation(WS, op_id).status is ForkStatus.UNKNOWN
        for op_id in accepted:
            op = store.fork_queries.get_fork_operation(WS, op_id)
            assert op.status is ForkStatus.COMMITTED and op.committed_session is not None
        assert store.fork_queries.get_fork_operation(WS, done).error == "earlier"
        assert recoverable_fork_operations(store)[0] == []
        # Running it again changes nothing.
        again = recover_fork_operations(store)
        assert (again.failed, again.unknown, again.committed) == (0, 0, 0)
    finally:
        store.close()


def test_a_bad_operation_in_a_recovery_page_is_rolled_back_alone(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        accepted = []
        for _ in range(3):
            accepted.append(_accepted(store))
        # The middle one's frozen snapshot no longer matches its hash: its commit must fail
        # closed without undoing the others in the same transaction.
        conn = apsw.Connection(str(tmp_path / "store.sqlite3"))
        conn.execute(
            "UPDATE fork_snapshots SET snapshot_json = snapshot_json || ' ' WHERE op_seq ="
            " (SELECT op_seq FROM fork_operations WHERE operation_id = ?)",
            (accepted[1],),
        )
        conn.close()
        report = recover_fork_operations(store)
        assert (report.committed, report.errors) == (2, 1)
        statuses = [store.fork_queries.get_fork_operation(WS, op_id).status for op_id in accepted]
        assert statuses == [
            ForkStatus.COMMITTED,
            ForkStatus.PROVIDER_ACCEPTED,
            ForkStatus.COMMITTED,
        ]
        bad = store.fork_queries.get_fork_operation(WS, accepted[1])
        assert find_session(store, WS, bad.target_session_id) is None
    finally:
        store.close()


def test_one_restart_rule_for_a_single_leftover_and_for_a_recovery_page(tmp_path: Path) -> None:
    """`apply_restart_rule` (fork.get on a leftover, a saga's abort) moves each status where
    `domain.fork_states.after_restart` says, exactly as start-up recovery does a page."""
    from actors.recovery import DISPATCHING_ERROR, PREPARED_ERROR, apply_restart_rule
    from domain.fork_states import after_restart

    store = Store.open(tmp_path / "store.sqlite3")
    try:
        prepared = _prepare(store)[0]
        dispatching = _prepare(store)[0]
        store.fork_transitions.mark_fork_dispatching(WS, dispatching)
        accepted = _accepted(store)
        failed = _prepare(store)[0]
        store.fork_transitions.mark_fork_failed(WS, failed, "given up")
        for op_id in (prepared, dispatching, accepted, failed):
            before = store.fork_queries.get_fork_operation(WS, op_id)
            after = apply_restart_rule(store, before)
            assert after.status is (after_restart(before.status) or before.status)
            assert store.fork_queries.get_fork_operation(WS, op_id).status is after.status
        assert store.fork_queries.get_fork_operation(WS, prepared).error == PREPARED_ERROR
        assert store.fork_queries.get_fork_operation(WS, dispatching).error == DISPATCHING_ERROR
        assert store.fork_queries.get_fork_operation(WS, accepted).status is ForkStatus.COMMITTED
        assert store.fork_queries.get_fork_operation(WS, failed).error == "given up"
    finally:
        store.close()


def _reserved(path: Path, op_id: str) -> bool:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute(
            "SELECT 1 FROM session_reservations WHERE operation_id = ?", (op_id,)
        ).fetchone()
    finally:
        conn.close()
    return row is not None


def test_every_leftover_status_change_is_settled_in_one_transaction(tmp_path: Path) -> None:
    """The `prepared` and `dispatching` leftovers of the whole store are settled in one COMMIT
    whatever the page size (one fsync, not one per page), each exactly as the restart rule says:
    a failed one's reservation released, an unknown one's kept, a terminal row left alone."""
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    try:
        prepared = [_prepare(store)[0] for _ in range(6)]
        dispatching = []
        for _ in range(6):
            op_id, _ = _prepare(store)
            store.fork_transitions.mark_fork_dispatching(WS, op_id)
            dispatching.append(op_id)
        earlier, _ = _prepare(store)
        store.fork_transitions.mark_fork_dispatching(WS, earlier)
        store.fork_transitions.mark_fork_unknown(WS, earlier, "earlier")
        assert all(_reserved(path, op_id) for op_id in prepared + dispatching)
        commits = store.db.write_stats.commits

        report = recover_fork_operations(store, page_size=4)

        assert (report.failed, report.unknown, report.committed, report.errors) == (6, 6, 0, 0)
        assert store.db.write_stats.commits - commits == 1
        for op_id in prepared:
            op = store.fork_queries.get_fork_operation(WS, op_id)
            assert (op.status, op.error) == (ForkStatus.FAILED, PREPARED_ERROR)
            assert op.completed_at_ms is not None
            assert not _reserved(path, op_id)
        for op_id in dispatching:
            op = store.fork_queries.get_fork_operation(WS, op_id)
            assert (op.status, op.error) == (ForkStatus.UNKNOWN, DISPATCHING_ERROR)
            assert _reserved(path, op_id)
        kept = store.fork_queries.get_fork_operation(WS, earlier)
        assert (kept.status, kept.error) == (ForkStatus.UNKNOWN, "earlier")
    finally:
        store.close()


def test_commits_past_the_bound_are_deferred_and_then_made_after_ready(tmp_path: Path) -> None:
    """With `commit_before_ready`, start-up recovery commits only that many `provider_accepted`
    leftovers (the rest stay `provider_accepted`, returned as deferred); `DeferredCommits`
    then commits every one of them, counting one that a `fork.get` committed first as no
    change (the same idempotent commit)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        accepted = [_accepted(store) for _ in range(7)]
        prepared, _ = _prepare(store)

        report = recover_fork_operations(store, page_size=3, commit_before_ready=2)

        assert (report.failed, report.committed, report.errors) == (1, 2, 0)
        assert [op.operation_id for op in report.deferred] == accepted[2:]
        statuses = [store.fork_queries.get_fork_operation(WS, o).status for o in accepted]
        assert statuses == [ForkStatus.COMMITTED] * 2 + [ForkStatus.PROVIDER_ACCEPTED] * 5
        # A `fork.get` of a deferred one commits it first (fork_saga.advance_leftover).
        store.fork_commit.commit_fork(WS, accepted[4])

        deferred = DeferredCommits(store, report.deferred, batch=2)
        deferred.start()
        assert deferred.wait(30)
        deferred.close()

        assert (deferred.committed, deferred.errors, deferred.pending) == (4, 0, 0)
        for op_id in accepted:
            op = store.fork_queries.get_fork_operation(WS, op_id)
            assert op.status is ForkStatus.COMMITTED and op.committed_session is not None
        assert recoverable_fork_operations(store)[0] == []
    finally:
        store.close()


def test_deferred_commits_stopped_early_leave_the_rest_for_the_next_start(
    tmp_path: Path,
) -> None:
    """Closed before it ran, `DeferredCommits` commits nothing and leaves its operations
    `provider_accepted`: the next start's recovery (or a `fork.get`) commits them."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        accepted = [_accepted(store) for _ in range(3)]
        report = recover_fork_operations(store, commit_before_ready=0)
        assert report.committed == 0 and len(report.deferred) == 3

        deferred = DeferredCommits(store, report.deferred)
        deferred.close()  # a daemon stopped at once
        deferred.start()
        assert deferred.wait(30)
        assert (deferred.committed, deferred.pending) == (0, 3)
        statuses = {store.fork_queries.get_fork_operation(WS, o).status for o in accepted}
        assert statuses == {ForkStatus.PROVIDER_ACCEPTED}

        again = recover_fork_operations(store)
        assert (again.committed, again.deferred) == (3, ())
    finally:
        store.close()


def test_deferred_commits_grow_their_transactions_from_the_pace_of_the_last(
    tmp_path: Path,
) -> None:
    """`DeferredCommits` starts at `batch` leftovers to a transaction and sizes each next one
    to `batch_s` of its thread's CPU, at most doubling: with room to spare, 14 leftovers from a
    batch of 2 take three COMMITs (2, 4, 8), not seven; with no room it stays at `batch`.
    Every leftover is committed either way."""
    for batch_s, transactions in ((60.0, 3), (0.0, 7)):
        store = Store.open(tmp_path / f"store-{transactions}.sqlite3")
        try:
            accepted = [_accepted(store) for _ in range(14)]
            report = recover_fork_operations(store, commit_before_ready=0)
            assert [op.operation_id for op in report.deferred] == accepted
            commits = store.db.write_stats.commits

            deferred = DeferredCommits(store, report.deferred, batch=2, batch_s=batch_s)
            deferred.start()
            assert deferred.wait(60)
            deferred.close()

            assert (deferred.committed, deferred.errors, deferred.pending) == (14, 0, 0)
            assert deferred.transactions == transactions
            assert store.db.write_stats.commits - commits == transactions
            statuses = {store.fork_queries.get_fork_operation(WS, o).status for o in accepted}
            assert statuses == {ForkStatus.COMMITTED}
        finally:
            store.close()


def test_recovery_waits_for_a_store_another_process_holds(tmp_path: Path) -> None:
    """Start-up recovery's transactions that meet a store another process holds past the busy
    budget are tried again with backoff (each rolled back whole; each idempotent): the lock let
    go, every leftover is settled. Before, the first raised and the start failed."""
    import threading

    from tests.support.store_lock import WriteLockHolder

    path = tmp_path / "store.sqlite3"
    store = Store.open(path, busy_timeout_ms=100)
    try:
        prepared, _ = _prepare(store)
        accepted = _accepted(store)
        holder = WriteLockHolder(path).acquire()
        timer = threading.Timer(1.0, holder.release)
        timer.start()
        try:
            report = recover_fork_operations(store)
        finally:
            timer.join()
        assert (report.failed, report.unknown, report.committed, report.errors) == (1, 0, 1, 0)
        assert store.fork_queries.get_fork_operation(WS, prepared).status is ForkStatus.FAILED
        assert store.fork_queries.get_fork_operation(WS, accepted).status is ForkStatus.COMMITTED
    finally:
        store.close()


def test_leftover_commits_wait_for_a_store_taken_after_the_statuses_settled(
    tmp_path: Path,
) -> None:
    """The store taken by another process exactly between the status changes and the
    `provider_accepted` commits (at `host.recovery.before_commits`): the commit page meets the
    lock, backs off (`start_write`), and lands once the lock is let go. Without its retry the
    page raised StoreBusy and the start failed."""
    from tests.support.store_lock import ReleaseWhenLogged, WriteLockHolder

    path = tmp_path / "store.sqlite3"
    store = Store.open(path, busy_timeout_ms=100)
    try:
        prepared, _ = _prepare(store)
        accepted = [_accepted(store) for _ in range(3)]
        holder = WriteLockHolder(path)
        taken: list[str] = []

        def hit(point: str) -> None:
            taken.append(point)
            holder.acquire()

        with ReleaseWhenLogged(holder, "committing leftover fork operations deferred") as seen:
            report = recover_fork_operations(store, page_size=2, hit=hit)
        assert taken == ["host.recovery.before_commits"]
        assert seen.seen >= 1  # the commit page met the lock (not vacuous)
        assert (report.failed, report.unknown, report.committed, report.errors) == (1, 0, 3, 0)
        assert store.fork_queries.get_fork_operation(WS, prepared).status is ForkStatus.FAILED
        statuses = {store.fork_queries.get_fork_operation(WS, o).status for o in accepted}
        assert statuses == {ForkStatus.COMMITTED}
    finally:
        store.close()


def test_a_half_done_resolution_waits_for_a_store_another_process_holds(
    tmp_path: Path,
) -> None:
    """A `fork.resolve` a stop interrupted (`started`, its operation still `unknown`) is
    rolled back at start-up; the store held by another process as that runs, the rollback
    backs off and lands once the lock is let go. Without its retry it raised StoreBusy."""
    from tests.support.store_lock import ReleaseWhenLogged, WriteLockHolder

    path = tmp_path / "store.sqlite3"
    store = Store.open(path, busy_timeout_ms=100)
    try:
        op_id, _ = _prepare(store)
        store.fork_transitions.mark_fork_dispatching(WS, op_id)
        store.fork_transitions.mark_fork_unknown(WS, op_id, "lost")
        store.resolution.begin_resolution(
            WS,
            op_id,
            request_id=str(uuid.uuid4()),
            action="abandon",
            child_id=None,
            evidence={"verdict": "absent"},
        )
        holder = WriteLockHolder(path).acquire()
        with ReleaseWhenLogged(holder, "recovering fork resolutions deferred") as seen:
            assert recover_resolutions(store) == (0, 1)
        assert seen.seen >= 1
        resolution = store.resolution.get_fork_resolution(WS, op_id)
        assert resolution is not None and resolution.state == "rolled_back"
        assert store.fork_queries.get_fork_operation(WS, op_id).status is ForkStatus.UNKNOWN
    finally:
        store.close()


def test_a_start_write_on_a_full_disk_fails_at_once_saying_so(tmp_path: Path) -> None:
    """A real full disk (a 1 MiB tmpfs filled up; ENOSPC, SQLite's SQLITE_FULL) under the
    store as start-up settles an orphaned Turn: the write fails at once with `StoreDiskFull`
    ("the disk holding the store ... is full"), no "deferred" retry (before, it was retried as
    a busy store for 30 s, then "the store is busy or full, try again"). Space again, the
    same settlement lands."""
    import logging
    import subprocess

    import pytest

    from actors.recovery import StoreDiskFull, settle_orphaned_turns

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mounted.stderr.decode().strip()}")
    deferred: list[str] = []

    class Deferred(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "deferred" in record.getMessage():
                deferred.append(record.getMessage())

    handler = Deferred(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        store = Store.open(disk / "store.sqlite3", busy_timeout_ms=100)
        try:
            sid = new_session(store)
            turn, _ = store.turns.claim_submit(WS, sid, "req-1", "left active by a kill")
            filler = disk / "filler"
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass  # ENOSPC: the disk is full
            with pytest.raises(StoreDiskFull) as full:
                settle_orphaned_turns(store)
            assert full.value.full, full.value
            assert "is full" in str(full.value) and "settling orphaned turn" in str(full.value)
            assert deferred == []
            filler.unlink()
            assert settle_orphaned_turns(store) == 1
            got = store.turns.get_turn(WS, sid, turn.turn_id)
            assert (got.phase, got.outcome) == ("settled", "interrupted"), got
        finally:
            store.close()
    finally:
        logging.getLogger().removeHandler(handler)
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _big_accepted(store: Store, turns: int = 40) -> str:
    """A `provider_accepted` operation through a Session of `turns` Turns: its commit writes
    pages of its own (the child's Turns)."""
    sid = new_session(store)
    for _ in range(turns):
        last = settled_turn(store, sid, text="x" * 300)
    op, _ = store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=str(uuid.uuid4()),
            target_session_id=str(uuid.uuid4()),
            turn_id=last.turn_id,
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
        ),
    )
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(
        WS,
        op.operation_id,
        ProviderForkEvidence(
            child_provider_session_id=f"child-{uuid.uuid4().hex[:6]}",
            provider_turn_ids=op.source_provider_turn_ids,
            binding_mode="host_copy",
            receipt={"sha256": "x"},
        ),
    )
    return op.operation_id


def _disk_full_now(store: Store) -> None:
    """SQLite's SQLITE_FULL for every write that grows the store file from now on, on the
    store's writer connection (`max_page_count` at the current size): what a full disk
    answers a write mid-transaction, and SQLite rolls that whole transaction back."""
    with store.db.write(None) as tx:
        row = tx.one("PRAGMA page_count")
        assert row is not None
        tx.one(f"PRAGMA max_page_count = {int(row[0])}")


def _disk_freed(store: Store) -> None:
    with store.db.write(None) as tx:
        tx.one("PRAGMA max_page_count = 1073741823")


def test_a_full_disk_in_recovery_s_commit_page_fails_the_start_saying_so(tmp_path: Path) -> None:
    """The disk fills while start-up recovery commits a page of `provider_accepted` leftovers
    (each in its own savepoint): SQLite rolls the whole transaction back, and the page's
    `ROLLBACK TO` its savepoint raised "no such savepoint: recover_commit", untyped, over the
    disk's error: the start failed with that, naming neither the store nor the disk (and
    logged the leftover as a bad one). Now the start fails at once with `StoreDiskFull`;
    nothing of the page was written, and with space again every leftover commits."""
    import pytest

    from actors.recovery import StoreDiskFull

    store = Store.open(tmp_path / "store.sqlite3")
    try:
        accepted = [_big_accepted(store) for _ in range(3)]
        _disk_full_now(store)
        with pytest.raises(StoreDiskFull) as full:
            recover_fork_operations(store)
        assert full.value.full and "committing leftover fork operations" in str(full.value)
        statuses = {store.fork_queries.get_fork_operation(WS, o).status for o in accepted}
        assert statuses == {ForkStatus.PROVIDER_ACCEPTED}
        _disk_freed(store)
        report = recover_fork_operations(store)
        assert (report.committed, report.errors) == (3, 0)
    finally:
        store.close()


def test_deferred_commits_on_a_full_disk_retry_the_batch_and_drop_no_leftover(
    tmp_path: Path,
) -> None:
    """The same full disk under `DeferredCommits`: the batch is tried again (nothing of it
    was written) until the disk has room, then every leftover commits, none counted as an
    error."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        accepted = [_big_accepted(store) for _ in range(3)]
        report = recover_fork_operations(store, commit_before_ready=0)
        assert len(report.deferred) == 3
        _disk_full_now(store)
        deferred = DeferredCommits(store, report.deferred)
        deferred.start()
        try:
            deadline = time.monotonic() + 60
            while deferred.retries == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert deferred.retries >= 1 and deferred.pending == 3  # tried, refused, kept
            _disk_freed(store)
            assert deferred.wait(30)
        finally:
            deferred.close()
        assert (deferred.committed, deferred.errors, deferred.pending) == (3, 0, 0)
        for op_id in accepted:
            assert store.fork_queries.get_fork_operation(WS, op_id).status is ForkStatus.COMMITTED
    finally:
        store.close()
