"""Seed 004 §10, §12.4: source reservations, durable references, cancellation and the
cleanup of a child whose initialization fails."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import pytest

from tests.tutti_agent.items import explicit_turn
from tests.tutti_agent.storeutil import write_root
from tutti_agent.errors import ForkInitFailed, ThreadReferenced, ThreadReserved
from tutti_agent.fork import ForkOptions, ForkPersistence, ForkService, Latest, PreparedFork
from tutti_agent.rollout import iter_rollout_paths
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "tutti-home")


class GateHooks:
    """Blocks materialization until opened; can fail after the child rollout is written."""

    def __init__(self, *, fail_after_write: bool = False, fail_before: bool = False) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fail_after_write = fail_after_write
        self.fail_before = fail_before
        self.written: list[str] = []

    def before_materialize(self, prepared: PreparedFork) -> None:
        self.entered.set()
        assert self.gate.wait(30)
        if self.fail_before:
            raise RuntimeError("injected failure before materialization")

    def after_child_write(self, child_thread_id: str) -> None:
        self.written.append(child_thread_id)
        if self.fail_after_write:
            raise RuntimeError("injected failure after the child rollout was written")


def test_prepared_fork_reservation_blocks_source_delete(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    prepared = ForkService(store).prepare(source, Latest())
    with pytest.raises(ThreadReserved, match=f"cannot delete thread {source}"):
        store.delete(source)
    prepared.reservation.release()
    store.delete(source)
    assert not store.exists(source)


@pytest.mark.parametrize("persistence", list(ForkPersistence))
def test_cancelled_fork_keeps_source_reserved(
    store: ThreadStore, persistence: ForkPersistence
) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    hooks = GateHooks()
    service = ForkService(store, hooks)
    future = service.fork_async(source, ForkOptions(persistence=persistence))
    assert hooks.entered.wait(30)
    # The caller gives up: a running materialization cannot be cancelled away.
    assert future.cancel() is False
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        deleting = pool.submit(store.delete, source, wait_s=30.0)
        assert store.is_reserved(source)
        assert not deleting.done()
        hooks.gate.set()
        child = future.result(timeout=30).child
        if persistence == ForkPersistence.REFERENCED:
            # Once the child reference is durable the source refuses deletion for good.
            with pytest.raises(ThreadReferenced):
                deleting.result(timeout=30)
            assert store.exists(source)
        else:
            deleting.result(timeout=30)
            assert not store.exists(source)
    assert store.load(child.thread_id).forked_from_id == source


def test_durable_referenced_child_blocks_source_delete_until_child_is_deleted(
    store: ThreadStore,
) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    child = (
        ForkService(store).fork(source, ForkOptions(persistence=ForkPersistence.REFERENCED)).child
    )
    with pytest.raises(ThreadReferenced, match="forked history still references it"):
        store.delete(source)
    store.delete(child.thread_id)
    store.delete(source)


def test_copied_child_does_not_reserve_its_source(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    ForkService(store).fork(source, ForkOptions())
    store.delete(source)
    assert not store.exists(source)


@pytest.mark.parametrize("persistence", list(ForkPersistence))
def test_child_whose_initialization_fails_leaves_no_rollout(
    store: ThreadStore, persistence: ForkPersistence
) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    before = store.path_of(source).read_bytes()
    hooks = GateHooks(fail_after_write=True)
    hooks.gate.set()
    with pytest.raises(ForkInitFailed, match="injected failure"):
        ForkService(store, hooks).fork(source, ForkOptions(persistence=persistence))
    assert len(hooks.written) == 1
    assert not store.exists(hooks.written[0])
    assert list(iter_rollout_paths(store.home)) == [store.path_of(source)]
    assert store.path_of(source).read_bytes() == before
    assert not store.is_reserved(source)
    store.delete(source)  # nothing references it


def test_failure_before_materialization_releases_reservation_and_writes_nothing(
    store: ThreadStore,
) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    hooks = GateHooks(fail_before=True)
    hooks.gate.set()
    with pytest.raises(RuntimeError, match="before materialization"):
        ForkService(store, hooks).fork(source, ForkOptions())
    assert hooks.written == []
    assert list(iter_rollout_paths(store.home)) == [store.path_of(source)]
    assert not store.is_reserved(source)


def test_delete_waits_for_reservation_release_within_wait_budget(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    reservation = store.reserve(source)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        deleting = pool.submit(store.delete, source, wait_s=30.0)
        assert not deleting.done()
        reservation.release()
        deleting.result(timeout=30)
    assert not store.exists(source)
