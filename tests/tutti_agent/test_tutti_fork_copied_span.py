"""A Copied fork through a settled turn writes the source's prefix lines verbatim (one read of
their bytes, no encode per line), knows its child's turns from the prefix, and falls back to
encoding every item wherever the source file is not provably the one it parsed."""

from __future__ import annotations

import gc
import json
import os
import threading
import weakref
from pathlib import Path

import pytest

from tests.tutti_agent.items import explicit_turn, task_started, user_msg
from tests.tutti_agent.storeutil import write_root
from tutti_agent.fork import ForkOptions, ForkPersistence, ForkService, Latest, ThroughTurn
from tutti_agent.history import build_turns
from tutti_agent.rollout import FREEZE_AFTER, LineType, gc_paused, read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "tutti-home")


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_a_settled_copied_fork_writes_the_prefix_bytes_of_the_source(
    store: ThreadStore,
) -> None:
    root = write_root(
        store,
        explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2") + [user_msg("after")],
    )
    source = store.load(root)
    through = ThroughTurn("t1")
    result = ForkService(store).fork(root, ForkOptions(boundary=through))
    end = result.prepared_end
    child_lines = _lines(result.child.path)
    source_lines = _lines(source.path)
    # session_meta of its own, then the source's lines 1..end-1 byte for byte, then settings.
    assert child_lines[1:end] == source_lines[1:end]
    assert json.loads(child_lines[0])["payload"]["id"] == result.child.thread_id
    assert json.loads(child_lines[end])["payload"]["type"] == "thread_settings_applied"
    assert len(child_lines) == end + 1
    # What the fork returned is what a reader of the child's file gets back.
    reread = read_rollout(result.child.path)
    assert list(result.child.lines) == reread
    assert [t.id for t in build_turns(result.child.items)] == ["t1"]
    assert result.turns is not None
    assert [t.id for t in result.turns] == ["t1"]
    assert [(t.id, t.status, t.items) for t in result.turns] == [
        (t.id, t.status, t.items) for t in build_turns([line.item for line in reread])
    ]


def test_a_copied_child_of_a_settled_prefix_equals_the_encoded_one_line_for_line(
    store: ThreadStore, tmp_path: Path
) -> None:
    """Verbatim or encoded, the child holds the same records (timestamps aside: a verbatim
    line keeps the moment it was first written)."""
    root = write_root(store, explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2"))
    fast = ForkService(store).fork(root, ForkOptions(boundary=ThroughTurn("t2")))
    slow_store = ThreadStore(store.home)
    slow_store.copied_span = lambda history, end: None  # type: ignore[method-assign]
    slow = ForkService(slow_store).fork(root, ForkOptions(boundary=ThroughTurn("t2")))

    def records(path: Path) -> list[tuple[int, str, object]]:
        # Past session_meta, up to the child's own settings line (it names the child).
        return [(ln.ordinal, ln.item.type, ln.item.payload) for ln in read_rollout(path)[1:-1]]

    assert records(fast.child.path) == records(slow.child.path)
    assert len(read_rollout(fast.child.path)) == len(read_rollout(slow.child.path))
    assert slow.turns is not None and fast.turns is not None


def test_a_replaced_source_file_is_encoded_not_copied(store: ThreadStore) -> None:
    """The span is read only from the very file (device, inode) the cached parse came from;
    a span kept with a parse is the bytes read from that parse's own file."""
    root = write_root(store, explicit_turn("t1", "u1", "a1"))
    history = store.load(root)
    data = history.path.read_bytes()

    def replace() -> None:
        replacement = history.path.with_suffix(".tmp")
        replacement.write_bytes(data)
        os.replace(replacement, history.path)  # same bytes, another inode

    replace()
    assert store.copied_span(history, history.next_ordinal) is None
    fresh = store.load(root)  # the replacement parsed: its span read from it, and kept
    kept = store.copied_span(fresh, fresh.next_ordinal)
    assert kept is not None and kept.data == data[fresh.lines[0].end_byte_offset :]
    replace()
    again = store.copied_span(fresh, fresh.next_ordinal)
    assert again is kept  # the kept bytes of the parse's own file, the new file not read


def test_a_changed_last_line_is_encoded_not_copied(store: ThreadStore) -> None:
    root = write_root(store, explicit_turn("t1", "u1", "a1"))
    history = store.load(root)
    end = history.next_ordinal
    with open(history.path, "r+b") as f:  # rewritten in place, same length
        raw = f.read()
        at = raw.rindex(b'"t1"')
        f.seek(at)
        f.write(b'"t9"')
    assert store.copied_span(history, end) is None


def test_an_unsettled_or_latest_boundary_encodes_its_items(store: ThreadStore) -> None:
    root = write_root(store, explicit_turn("t1", "u1", "a1") + [task_started("t2", 5)])
    service = ForkService(store)
    latest = service.fork(root, ForkOptions(boundary=Latest()))
    assert latest.turns is None
    # The open turn is closed in the child as interrupted, after the copied prefix.
    kinds = [ln.item.event_type for ln in latest.child.lines if ln.item.type == LineType.EVENT_MSG]
    assert "turn_aborted" in kinds
    referenced = service.fork(
        root, ForkOptions(boundary=ThroughTurn("t1"), persistence=ForkPersistence.REFERENCED)
    )
    assert referenced.turns is not None and [t.id for t in referenced.turns] == ["t1"]


def test_a_turn_closed_by_a_later_start_is_not_settled(store: ThreadStore) -> None:
    """A turn that never wrote its terminal event ends where the next one starts: the fork
    through it closes it as interrupted, as before (not a verbatim prefix)."""
    root = write_root(
        store, [task_started("t1", 1), user_msg("u1")] + explicit_turn("t2", "u2", "a2")
    )
    result = ForkService(store).fork(root, ForkOptions(boundary=ThroughTurn("t1")))
    assert result.turns is None
    last = result.child.lines[-2].item
    assert last.event_type == "turn_aborted" and last.payload.get("turn_id") == "t1"


def test_gc_paused_nests_across_threads_and_restores_the_collector() -> None:
    assert gc.isenabled()
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gc_paused():
            entered.set()
            release.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    entered.wait(10)
    with gc_paused(), gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other holder still holds it
    release.set()
    other.join(10)
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


class _Node:
    """A tracked, weakly referenceable container."""


def test_a_pause_that_leaves_a_large_parse_alive_freezes_it_a_small_one_does_not() -> None:
    """When the last holder leaves with more than `FREEZE_AFTER` new containers alive (a big
    history parse), they go to the collector's permanent generation instead of being walked
    by the next collection; a pause that built little leaves the collector's young generation
    as it was. Frozen objects are still freed by reference counting."""
    gc.collect()
    frozen_before = gc.get_freeze_count()
    try:
        with gc_paused():
            small = [{"n": i} for i in range(1000)]
        assert gc.get_freeze_count() == frozen_before
        with gc_paused():
            big = [_Node() for _ in range(FREEZE_AFTER + 1000)]
        assert gc.get_freeze_count() >= frozen_before + FREEZE_AFTER
        assert gc.get_count()[0] < 1000 and gc.isenabled()
        first = weakref.ref(big[0])
        del big
        assert first() is None  # frozen, still freed by reference counting
        assert len(small) == 1000
    finally:
        gc.unfreeze()


def test_a_settled_copied_fork_reads_none_of_the_prefix_items(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PreparedFork.model_context` (the prefix's items, a 60,000-item tuple for a 10,000-Turn
    prefix) is made only when asked: a settled Copied fork whose child copies the prefix's
    bytes, opened or not, asks 0 times; one that cannot copy them (the encoded fallback) and a
    Referenced fork mid-turn ask once each, and their children hold what they held before."""
    from tutti_agent.fork import PreparedFork

    asked = [0]
    made = PreparedFork.model_context

    def counted(self: PreparedFork) -> tuple[object, ...]:
        asked[0] += 1
        return made.fget(self)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(PreparedFork, "model_context", property(counted))
    root = write_root(store, explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2"))
    service = ForkService(store)
    for loaded in (True, False):
        got = service.fork(root, ForkOptions(boundary=ThroughTurn("t2"), keep_child_parse=loaded))
        assert got.turns is not None and [t.id for t in got.turns] == ["t1", "t2"]
    assert asked[0] == 0
    slow_store = ThreadStore(store.home)
    slow_store.copied_span = lambda history, end: None  # type: ignore[method-assign]
    slow = ForkService(slow_store).fork(root, ForkOptions(boundary=ThroughTurn("t2")))
    assert asked[0] == 1
    assert [t.id for t in build_turns([ln.item for ln in read_rollout(slow.child.path)])] == [
        "t1",
        "t2",
    ]
    open_root = write_root(store, explicit_turn("t1", "u1", "a1") + [task_started("t2")])
    mid = service.fork(
        open_root, ForkOptions(boundary=Latest(), persistence=ForkPersistence.REFERENCED)
    )
    assert asked[0] == 2
    assert mid.child is not None
    assert [t.status.value for t in build_turns(mid.child.items)] == ["completed", "interrupted"]
