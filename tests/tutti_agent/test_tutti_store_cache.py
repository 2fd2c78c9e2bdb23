"""ThreadStore's path and parse caches: a warm app-server does not rescan the
home or re-parse an unchanged rollout on every request, and never serves stale lines."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import tutti_agent.store as store_module
from tests.tutti_agent.items import explicit_turn, user_msg
from tests.tutti_agent.storeutil import append, count_parses, write_root
from tutti_agent.errors import NoRolloutFound
from tutti_agent.fork import ForkOptions, ForkService, ThroughTurn
from tutti_agent.rollout import find_rollout_path
from tutti_agent.store import ThreadStore
from tutti_agent.wire import head_to_wire, thread_to_wire

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "tutti-home")


def _count_scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    scans: list[str] = []
    real: Callable[[Path, str], Path | None] = find_rollout_path

    def counting(home: Path, thread_id: str) -> Path | None:
        scans.append(thread_id)
        return real(home, thread_id)

    monkeypatch.setattr(store_module, "find_rollout_path", counting)
    return scans


def test_repeated_forks_parse_the_unchanged_source_once_and_never_rescan(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2"))
    parsed = count_parses(monkeypatch)
    scans = _count_scans(monkeypatch)
    service = ForkService(store)
    children = [service.fork(source, ForkOptions(boundary=ThroughTurn("t2"))).child for _ in "abc"]
    source_path = store.path_of(source)
    # One parse of the source for three forks; each child's history is built from the lines
    # the fork wrote (checked as a load checks them), never read back.
    assert parsed == [source_path]
    assert all(store.load(c.thread_id) == c for c in children)
    assert parsed == [source_path]  # the written lines are each child's cached parse
    assert scans == []  # the source's path was remembered, each child's path was created


def test_a_child_forked_unopened_is_not_kept_parsed_and_reads_the_same_from_disk(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`keep_child_parse=False` (`loaded: false`): the child's lines are neither built nor kept
    as its parse (a later load reads the file, once), its path is; the fork's head of it is
    what a head read of the file finds, and projects as the whole child does; the source's
    reduction is reduced once for forks and reads alike."""
    source = write_root(store, explicit_turn("t1", "u1", "a1") + explicit_turn("t2", "u2", "a2"))
    service = ForkService(store)
    lean = ForkOptions(boundary=ThroughTurn("t2"), keep_child_parse=False, turn_items=False)
    first = service.fork(source, lean)
    assert first.child is None and first.head is not None
    parsed = count_parses(monkeypatch)
    scans = _count_scans(monkeypatch)
    child = store.load(first.head.thread_id)
    assert parsed == [first.head.path] and scans == []
    assert store.head(child.thread_id) == first.head
    whole = thread_to_wire(child, status="notLoaded", include_turns=True, with_items=False)
    assert head_to_wire(first.head, status="notLoaded", turns=first.turns, with_items=False) == (
        whole
    )
    assert first.turns is not None and [t.id for t in first.turns] == ["t1", "t2"]
    assert all(t.items == () for t in first.turns)
    reduced = store.turns(store.load(source), with_items=False)
    assert service.fork(source, lean).turns == reduced  # the kept reduction, not a new one
    assert store.turns(store.load(source), with_items=False) is reduced


def test_an_append_is_seen_by_the_next_load(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    before = store.load(source)
    append(store, source, [user_msg("more")])
    after = store.load(source)
    assert after.next_ordinal == before.next_ordinal + 1
    assert after.lines[-1].item.payload["content"][0]["text"] == "more"


def test_an_external_rewrite_of_the_same_size_is_seen(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    store.load(source)
    path = store.path_of(source)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"u1"', b'"U1"'))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))  # a later write, same size
    texts = [
        line.item.payload["content"][0]["text"]
        for line in store.load(source).lines
        if line.item.payload.get("role") == "user"
    ]
    assert texts == ["U1"]


def test_a_removed_or_moved_rollout_is_looked_up_again(store: ThreadStore) -> None:
    source = write_root(store, explicit_turn("t1", "u1", "a1"))
    path = store.path_of(source)
    store.load(source)
    # Into an older build's dated layout (never a real day): the reader still finds it there.
    moved = path.parent / "2020" / "01" / "00" / path.name
    moved.parent.mkdir(parents=True)
    path.rename(moved)
    assert store.load(source).path == moved
    moved.unlink()
    with pytest.raises(NoRolloutFound):
        store.load(source)
