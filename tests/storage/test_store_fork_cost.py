"""The big prepare + commit's work, counted (its time is `bench.scale --only-big-fork`'s
to measure).

Counts, never timings: how many times a snapshot is decoded, how many child ids are minted in
Python and Message payloads remapped, how many Messages Python looks at, how many SQL statements
prepare and commit run — none of them may grow with the history except the child's Turn rows
(one `executemany`); the Messages go in with one `INSERT … SELECT` whatever their number — and
how many WAL pages a status change writes (none of the frozen snapshot's).
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
import storage.fork_snapshot as fork_boundary
import storage.fork_snapshot as fork_snapshot
import storage.rows as rows
from storage import history_links
from storage.fork_child import ChildIdMinter, ForkMemo
from storage.store import Store

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

    real_scan = history_links.scan_history

    def scan(*args: Any, **kwargs: Any) -> Any:
        found = real_scan(*args, **kwargs)
        counts["messages read into python"] += len(found.payloads)
        return found

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT:
            sql = " ".join(str(event["sql"]).split()[:3])
            counts["statements"] += 1
            if sql.startswith("INSERT INTO messages"):
                counts["message inserts"] += 1
            if sql.startswith("INSERT INTO history_links"):
                counts["history links"] += 1
            if "group_concat(" in str(event["sql"]):
                counts["history digests"] += 1

    monkeypatch.setattr(fork_snapshot, "load_snapshot", load)
    monkeypatch.setattr(rows, "load_snapshot", load)  # a committed operation's projection
    monkeypatch.setattr(ChildIdMinter, "mint_all", mint_all)
    monkeypatch.setattr(fork_boundary, "scan_history", scan)
    # Prepare and commit run wholly inside a write: on the store's one writer connection
    # (the background checkpointer may use a pooled one meanwhile).
    conn = store.db._writer_connection()
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
        op, created = store.fork_prepare.prepare_fork(
            WS, request(sid, last, target=str(uuid.uuid4()))
        )
    assert created
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    if forget:  # as after a restart: this process no longer holds what prepare froze
        store.db.fork_memo = ForkMemo()
    with _counting(monkeypatch, store) as commit_counts:
        committed, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed
    return prepare_counts, commit_counts, committed


def test_prepare_and_commit_in_one_process_decode_no_snapshot_and_keep_messages_in_sqlite(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = 12
    prepare, commit, committed = _prepare_and_commit(store, monkeypatch, turns)
    # Prepare froze the document; commit hashes the stored bytes and uses it.
    assert commit["snapshot decodes"] == 0
    assert prepare["snapshot decodes"] == 0
    # Rule v2: no id is minted one by one (main minted 4 per Turn, twice); the Messages with an
    # empty payload are never read into Python.
    assert prepare["ids minted"] + commit["ids minted"] == 0
    assert prepare["messages read into python"] == 0
    # Prepare digests the boundary once; the commit reads the fence's witness (one row) instead.
    assert (prepare["history digests"], commit["history digests"]) == (1, 0)
    # The committed operation it returns is the projection a reader rebuilds from the snapshot.
    assert store.fork_queries.get_fork_operation(WS, committed.operation_id) == committed
    child = store.history.timeline(WS, committed.target_session_id, limit=turns)[0]
    assert [len(t.messages) for t in child] == [3] * turns


def test_a_commit_in_a_fresh_process_decodes_the_snapshot_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, commit, committed = _prepare_and_commit(store, monkeypatch, 5, forget=True)
    assert commit["snapshot decodes"] == 1
    assert commit["ids minted"] == 0
    assert store.fork_queries.get_fork_operation(WS, committed.operation_id) == committed


def test_prepare_and_commit_statements_do_not_grow_with_the_history(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_p, small_c, _ = _prepare_and_commit(store, monkeypatch, 2)
    big_p, big_c, _ = _prepare_and_commit(store, monkeypatch, 30)
    assert small_p["statements"] == big_p["statements"]
    # Commit: a fixed number of statements, one per cloned Turn row, and for all the Messages
    # one history link and no Message row (the child reads the source's rows).
    assert big_c["message inserts"] == small_c["message inserts"] == 0
    assert big_c["history links"] == small_c["history links"] == 1
    fixed = small_c["statements"] - 2  # turns: one per Turn
    assert big_c["statements"] - 30 == fixed
    assert fixed <= 18, small_c


def test_references_are_rewritten_once_at_prepare_and_the_ack_decodes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prepare rewrites each payload holding an allowlisted reference into the snapshot; the
    commit writes those over the copied rows without remapping again, and the ACK answers from
    the projection the commit built."""
    remaps: Counter[str] = Counter()
    real_remap = history_links.remap_references

    def remap(value: Any, ids: Any, *, where: str) -> Any:
        remaps[where.split()[0]] += 1
        return real_remap(value, ids, where=where)

    monkeypatch.setattr(history_links, "remap_references", remap)
    sid = new_session(store)
    last = ""
    turns = 6
    for i in range(turns):
        turn = settled_turn(store, sid, text=f"turn {i}")
        user = turn.messages[0].message_id
        last = (
            store.history.append_message(
                WS,
                sid,
                turn.turn_id,
                kind="reasoning",
                text="r",
                payload={"replyToMessageId": user},
            ).turn_id
            or ""
        )
    assert last
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last, target=str(uuid.uuid4())))
    assert remaps["message"] == turns
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    assert remaps["message"] == turns  # not one more
    child = store.history.timeline(WS, committed.target_session_id, limit=turns)[0]
    for turn in child:
        reply = turn.messages[-1]
        assert reply.payload == {"replyToMessageId": turn.messages[0].message_id}
    created = (
        store.db.connection()
        .execute(
            # The child's own rows and the rows it reads through its link (created at the link's
            # time).
            "SELECT created_at_ms FROM messages WHERE workspace_id = ? AND session_id = ?"
            " UNION SELECT linked_at_ms FROM history_links WHERE child_key = (SELECT session_key"
            " FROM session_keys WHERE workspace_id = ? AND session_id = ?)",
            (WS, committed.target_session_id, WS, committed.target_session_id),
        )
        .fetchall()
    )
    assert created == [(committed.completed_at_ms,)]  # every cloned Message: the commit's time
    with _counting(monkeypatch, store) as ack_counts:
        acked, changed = store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    assert changed and ack_counts["snapshot decodes"] == 0
    assert acked.committed_session == committed.committed_session
    assert acked.lineage == committed.lineage


def test_status_changes_write_none_of_the_frozen_snapshot(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot is written once, at prepare (schema v5: a table of its own). On the
    operation row every UPDATE rewrote it: ~2.5 MB of WAL per transition at 1,000 Turns."""
    store.db.checkpoint_pages = 1 << 30  # no checkpoint: the WAL's frame count only grows
    frames: list[int] = []
    monkeypatch.setattr(store.db, "_wal_grew", lambda _c, _d, pages: frames.append(pages) or 0)
    sid = new_session(store)
    last = ""
    for i in range(40):
        last = settled_turn(store, sid, text=f"turn {i}: " + "x" * 4000).turn_id
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last, target=str(uuid.uuid4())))
    # A version 3 snapshot held every Message's text: at least this many 4 KiB pages (version 4
    # holds none, and no status change may write what it does hold either).
    texts = (
        store.db.connection()
        .execute("SELECT SUM(length(text)) FROM messages WHERE session_id = ?", (sid,))
        .fetchone()[0]
    )
    snapshot_pages = texts // 4096
    assert snapshot_pages >= 39

    def frames_of(step: Any) -> int:
        before = frames[-1]
        step()
        return frames[-1] - before

    written = {
        "dispatching": frames_of(
            lambda: store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
        ),
        "provider_accepted": frames_of(
            lambda: store.fork_transitions.mark_fork_provider_accepted(
                WS, op.operation_id, evidence(op)
            )
        ),
    }
    store.fork_commit.commit_fork(WS, op.operation_id)
    written["ack"] = frames_of(lambda: store.fork_transitions.acknowledge_fork(WS, op.operation_id))
    assert all(n < 10 for n in written.values()), (written, snapshot_pages)


def test_a_polled_operation_parses_its_provider_turn_ids_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `fork.get` of an active fork read its row three times (read view, host, Session
    actor), and each read parsed both provider Turn id lists (~400 KB of JSON each at 10,000
    Turns). The store's cache keeps a list parsed with the text it came from; a row whose text
    changed is parsed again."""
    monkeypatch.setattr(rows, "LIST_CACHE_MIN_CHARS", 0)  # this history's lists are short
    parses: Counter[str] = Counter()
    real_loads = rows.json_column

    def loads(text: Any) -> Any:
        parses["lists" if isinstance(text, str) and text.startswith("[") else "other"] += 1
        return real_loads(text)

    monkeypatch.setattr(rows, "json_column", loads)
    sid, last = _source(store, 4)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last, target=str(uuid.uuid4())))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    first = store.fork_queries.get_fork_operation(WS, op.operation_id)
    before = parses["lists"]
    for _ in range(5):
        again = store.fork_queries.get_fork_operation(WS, op.operation_id)
        assert again == first
        assert again.source_provider_turn_ids is first.source_provider_turn_ids
        assert again.target_provider_turn_ids is first.target_provider_turn_ids
    assert parses["lists"] == before
    store.db.connection().execute(
        "UPDATE fork_operations SET source_provider_turn_ids = '[\"changed\"]'"
        " WHERE operation_id = ?",
        (op.operation_id,),
    )
    changed = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert changed.source_provider_turn_ids == ("changed",)


def test_a_commit_whose_witness_counted_a_change_re_proves_the_digest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change of the source's history behind the fence (here a later Turn's Message, outside
    the boundary) is counted by the witness; the commit then recomputes prepare's digest — one
    digest — and, the boundary being what prepare froze, commits."""
    sid, _ = _source(store, 3)
    first = store.history.timeline(WS, sid, limit=3)[0][0].turn_id
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, first, target=str(uuid.uuid4())))
    store.db.connection().execute(
        "UPDATE messages SET text = 'later' WHERE session_id = ? AND turn_id != ?", (sid, first)
    )
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    with _counting(monkeypatch, store) as commit:
        _, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed and commit["history digests"] == 1


def test_prepare_maps_the_boundary_once_and_the_commit_builds_the_child_with_that_map(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prepare's history section maps the boundary's Turns and Interactions (rule v2) and keeps
    the map for its dry run and the commit: one map per fork, and it is the one the frozen
    document gives (what a fresh process's commit computes)."""
    calls: Counter[str] = Counter()
    real = history_links.ordinal_identity

    def mapped(*args: Any) -> Any:
        calls["maps"] += 1
        return real(*args)

    monkeypatch.setattr(history_links, "ordinal_identity", mapped)
    monkeypatch.setattr(fork_child, "ordinal_identity", mapped)
    sid, last = _source(store, 4)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last, target=str(uuid.uuid4())))
    assert calls["maps"] == 1
    raw = (
        store.db.connection()
        .execute(
            "SELECT s.snapshot_json FROM fork_operations o JOIN fork_snapshots s USING (op_seq)"
            " WHERE o.operation_id = ?",
            (op.operation_id,),
        )
        .fetchone()[0]
    )
    document = fork_snapshot.load_snapshot(raw, op.snapshot_hash)
    kept = store.db.fork_memo.histories.get(op.snapshot_hash)
    assert kept is not None
    assert kept == fork_child.child_history(document)  # no memo: mapped from the document
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    store.fork_commit.commit_fork(WS, op.operation_id)
    assert calls["maps"] == 2  # the check above, not the commit


def test_a_fork_s_operation_columns_decode_without_the_standard_library(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork operation's JSON columns (the provider Turn id lists, the binding receipt, the
    Turn bindings, the worktree) are decoded by `rows.json_column` (orjson where it agrees),
    never by `json.loads` — the row is read back ~4 times a warm fork (the prepare's, the
    accept's and the commit's reads, the ACK's), each parsing up to six columns by the standard
    library before this cut; the test fails with the `loads` they used. The values are those
    the standard library reads."""
    import json

    import storage.sqlite as sqlite

    sid, last = _source(store, 3)
    calls: list[str] = []
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and not args:  # the snapshot's own strict decodes pass a hook
            calls.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    monkeypatch.setattr(sqlite.json, "loads", counting)
    op, created = store.fork_prepare.prepare_fork(WS, request(sid, last, target=str(uuid.uuid4())))
    assert created
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    accepted = store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    acked = store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    read = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert calls == []
    row = (
        store.db.connection()
        .execute(
            "SELECT source_provider_turn_ids, target_provider_turn_ids, binding_receipt"
            " FROM fork_operations WHERE operation_id = ?",
            (op.operation_id,),
        )
        .fetchone()
    )
    assert read.source_provider_turn_ids == tuple(real(row[0]))
    assert read.target_provider_turn_ids == tuple(real(row[1]))
    assert read.binding_receipt == real(row[2])
    assert accepted is not None and committed.status.value == "committed"
    assert acked is not None
