"""The big prepare + commit's work, counted (issue 20: 1,000-Turn prepare + commit ≤ 200 ms).

Counts, never timings: how many times a snapshot is decoded, how many child ids are minted,
and how many SQL statements prepare and commit run — none of them may grow with the history
except the child's bulk inserts (one `executemany` per table).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request

import storage.fork_child as fork_child
import storage.fork_snapshot as fork_snapshot
from storage import Store
from storage.fork_identity import ChildIdMinter

pytestmark = pytest.mark.timeout(60)


def _source(store: Store, turns: int) -> tuple[str, str]:
    sid = new_session(store)
    last = ""
    for i in range(turns):
        last = settled_turn(
            store, sid, text=f"turn {i}", extra=[("reasoning", f"thinking {i}", {})]
        ).turn_id
    return sid, last


@contextmanager
def _counting(monkeypatch: pytest.MonkeyPatch, store: Store) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    real_load = fork_snapshot.load_snapshot
    real_mint = ChildIdMinter.mint_all

    def load(text: str, expected_hash: str) -> dict[str, Any]:
        counts["snapshot decodes"] += 1
        return real_load(text, expected_hash)

    def mint_all(self: ChildIdMinter, kind: Any, ids: Any) -> list[str]:
        out = real_mint(self, kind, ids)
        counts["ids minted"] += len(out)
        return out

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT:
            sql = " ".join(str(event["sql"]).split()[:3])
            counts["statements"] += 1
            if sql.startswith("INSERT INTO messages"):
                counts["message inserts"] += 1

    monkeypatch.setattr(fork_snapshot, "load_snapshot", load)
    monkeypatch.setattr(ChildIdMinter, "mint_all", mint_all)
    # Prepare and commit run wholly inside a write: on the store's one writer connection
    # (the background checkpointer may use a pooled one meanwhile).
    conn = store._writer_connection()
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        yield counts
    finally:
        conn.trace_v2(0, None)


def _prepare_and_commit(
    store: Store, monkeypatch: pytest.MonkeyPatch, turns: int, *, forget: bool = False
) -> tuple[Counter[str], Counter[str], Any]:
    sid, last = _source(store, turns)
    with _counting(monkeypatch, store) as prepare_counts:
        op, created = store.prepare_fork(WS, request(sid, last, target=str(uuid.uuid4())))
    assert created
    store.mark_fork_dispatching(WS, op.operation_id)
    store.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    if forget:  # as after a restart: this process no longer holds what prepare froze
        fork_snapshot._FROZEN.clear()
        fork_child._IDENTITY_CACHE.clear()
    with _counting(monkeypatch, store) as commit_counts:
        committed, changed = store.commit_fork(WS, op.operation_id)
    assert changed
    return prepare_counts, commit_counts, committed


def test_prepare_and_commit_in_one_process_decode_no_snapshot_and_mint_each_id_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = 12
    prepare, commit, committed = _prepare_and_commit(store, monkeypatch, turns)
    entities = turns * 4  # a Turn, its user, reasoning and assistant Messages
    # Prepare froze the document; commit hashes the stored bytes and uses it (main decoded it
    # twice: once to build the child, once more to project the committed operation).
    assert commit["snapshot decodes"] == 0
    assert prepare["snapshot decodes"] == 0
    assert prepare["ids minted"] + commit["ids minted"] == entities
    # The committed operation it returns is the projection a reader rebuilds from the snapshot.
    assert store.get_fork_operation(WS, committed.operation_id) == committed


def test_a_commit_in_a_fresh_process_decodes_the_snapshot_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, commit, committed = _prepare_and_commit(store, monkeypatch, 5, forget=True)
    assert commit["snapshot decodes"] == 1
    assert commit["ids minted"] == 5 * 4
    assert store.get_fork_operation(WS, committed.operation_id) == committed


def test_prepare_and_commit_statements_do_not_grow_with_the_history(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_p, small_c, _ = _prepare_and_commit(store, monkeypatch, 2)
    big_p, big_c, _ = _prepare_and_commit(store, monkeypatch, 30)
    assert small_p["statements"] == big_p["statements"]
    # Commit: a fixed number of statements plus one bulk insert per cloned Message row.
    assert big_c["message inserts"] == 30 * 3 and small_c["message inserts"] == 2 * 3
    fixed = small_c["statements"] - small_c["message inserts"] - 2  # turns: one per Turn
    assert big_c["statements"] - big_c["message inserts"] - 30 == fixed
    assert fixed <= 16, small_c
