"""Concurrency on one store file: threads with their own connections race on one boundary."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from store_builders import WS, new_session, settled_turn

from domain.errors import ForkInProgress
from storage.fork_snapshot import decode_frozen
from storage.models import ForkOperation, ForkPrepareRequest
from storage.store import Store

pytestmark = pytest.mark.timeout(60)


def test_sixteen_threads_prepare_one_boundary_and_exactly_one_operation_is_created(
    store_path: Path,
) -> None:
    setup = Store.open(store_path)
    sid = new_session(setup)
    turn = settled_turn(setup, sid)
    setup.close()

    # One Store per thread as well as one connection per thread: nothing shared in-process.
    barrier = threading.Barrier(16)
    results: list[tuple[ForkOperation, bool]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        store = Store.open(store_path)
        try:
            barrier.wait()
            got = store.fork_prepare.prepare_fork(
                WS,
                ForkPrepareRequest(
                    source_session_id=sid,
                    request_id=f"request-{i}",
                    target_session_id=f"target-{i}",
                    turn_id=turn.turn_id,
                    driver_kind="tutti-agent",
                    driver_version="0.0.10",
                    binding_mode="host_copy",
                ),
            )
            with lock:
                results.append(got)
        except BaseException as exc:  # collected and asserted below
            with lock:
                errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(created for _, created in results) == 1
    assert len({op.operation_id for op, _ in results}) == 1
    check = Store.open(store_path)
    rows = check.db.connection().execute("SELECT COUNT(*) FROM fork_operations").fetchone()[0]
    reservations = (
        check.db.connection().execute("SELECT COUNT(*) FROM session_reservations").fetchone()
    )
    assert (rows, reservations[0]) == (1, 1)
    check.close()


def test_mutations_racing_a_prepare_are_in_the_snapshot_or_rejected(store_path: Path) -> None:
    setup = Store.open(store_path)
    sid = new_session(setup)
    turn = settled_turn(setup, sid)
    setup.close()
    start = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def mutate() -> None:
        store = Store.open(store_path)
        start.wait()
        applied = 0
        try:
            for i in range(50):
                store.sessions.update_settings(WS, sid, {"n": i})
                applied += 1
        except ForkInProgress:
            outcome["rejected"] = True
        outcome["applied"] = applied
        store.close()

    def fork() -> None:
        store = Store.open(store_path)
        start.wait()
        op, _ = store.fork_prepare.prepare_fork(
            WS,
            ForkPrepareRequest(
                source_session_id=sid,
                request_id="r",
                target_session_id="child",
                turn_id=turn.turn_id,
                driver_kind="tutti-agent",
                driver_version="0.0.10",
                binding_mode="host_copy",
            ),
        )
        outcome["op"] = op
        store.close()

    threads = [threading.Thread(target=mutate), threading.Thread(target=fork)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = Store.open(store_path)
    final = store.sessions.get_session(WS, sid).settings
    raw = store.db.connection().execute("SELECT snapshot_json FROM fork_snapshots").fetchone()[0]
    frozen = decode_frozen(raw)["target"]["settings"]
    # Whatever was applied before prepare is what the snapshot froze; nothing after it landed.
    assert frozen == final
    applied = outcome["applied"]
    assert isinstance(applied, int)
    assert applied == 50 or outcome.get("rejected") is True
    store.close()
