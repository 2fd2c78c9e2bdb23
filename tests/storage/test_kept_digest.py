"""The boundary digest prepare keeps (schema v17, docs/design/store.md "The kept digest") on real
SQLite files: a second prepare of an unchanged boundary digests nothing; any change of the
Session's history — a store path or raw SQL behind the daemon's back, between two forks — deletes
the kept row in the writer's transaction, so the next prepare digests the rows as they are; a
prepare that rolls back keeps nothing; a linked source keeps nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request, run_to_commit

from domain.errors import ForkBoundaryError
from domain.fork_states import ForkStatus
from storage.fork_snapshot import decode_frozen
from storage.history_links import digest_pass, history_digest
from storage.models import ForkOperation
from storage.store import Store
from tests.support.invariants import kept_digest_problems

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def source(store: Store) -> tuple[str, list[str]]:
    sid = new_session(store, title="kept")
    turns = [
        settled_turn(
            store, sid, text=f"t{i}", provider_turn_id=f"p{i}", extra=[("reasoning", f"r{i}", {})]
        ).turn_id
        for i in (1, 2, 3)
    ]
    return sid, turns


@contextmanager
def _digests(store: Store) -> Iterator[list[int]]:
    """Counts the digest statements (`group_concat(`) the store's writer runs inside."""
    seen = [0]

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT and "group_concat(" in str(event["sql"]):
            seen[0] += 1

    conn = store.db._writer_connection()
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        yield seen
    finally:
        conn.trace_v2(0, None)


def _kept(store: Store, sid: str) -> list[tuple[int, int, str]]:
    """(through, count, digest) of every digest kept for Session `sid`."""
    return [
        (int(r[0]), int(r[1]), str(r[2]))
        for r in store.db.connection().execute(
            "SELECT d.through, d.count, d.digest FROM history_digests d JOIN session_keys k"
            " USING (session_key) WHERE k.workspace_id = ? AND k.session_id = ? ORDER BY through",
            (WS, sid),
        )
    ]


def _frozen_history(store: Store, op: ForkOperation) -> dict[str, Any]:
    raw = (
        store.db.connection()
        .execute(
            "SELECT s.snapshot_json FROM fork_operations o JOIN fork_snapshots s USING (op_seq)"
            " WHERE o.operation_id = ?",
            (op.operation_id,),
        )
        .fetchone()
    )
    history = decode_frozen(raw[0])["history"]
    assert isinstance(history, dict)
    return history


def _prepare(store: Store, sid: str, turn_id: str) -> tuple[ForkOperation, int]:
    """A new prepare through `turn_id` and the digest statements it ran."""
    with _digests(store) as seen:
        op, created = store.fork_prepare.prepare_fork(
            WS, request(sid, turn_id, target=str(uuid.uuid4()))
        )
    assert created
    return op, seen[0]


def _assert_kept_law(store: Store) -> None:
    assert kept_digest_problems(store.db.connection()) == []


def test_a_second_prepare_of_an_unchanged_boundary_digests_nothing(
    store: Store, source: tuple[str, list[str]]
) -> None:
    sid, turns = source
    first, digests = _prepare(store, sid, turns[2])
    assert digests == 1
    frozen = _frozen_history(store, first)
    assert _kept(store, sid) == [(3, frozen["count"], frozen["digest"])]
    run_to_commit(store, first)
    store.fork_transitions.acknowledge_fork(WS, first.operation_id)  # the barrier released
    second, digests = _prepare(store, sid, turns[2])
    assert digests == 0
    again = _frozen_history(store, second)
    conn = store.db.connection()
    assert (again["count"], again["digest"]) == history_digest(conn, WS, sid, 3)
    assert (again["count"], again["digest"], again["through_position"]) == (
        frozen["count"],
        frozen["digest"],
        frozen["through_position"],
    )
    committed = run_to_commit(store, second)
    assert committed.status is ForkStatus.COMMITTED
    assert [t.sequence for t in store.history.timeline(WS, second.target_session_id)[0]] == [
        1,
        2,
        3,
    ]
    _assert_kept_law(store)


# Raw SQL behind the daemon's back on the boundary (the source's first Turn, `?2`) between two
# forks through it: each changes the digest, and each must delete the kept one.
_RAW_WRITES = {
    "text": "UPDATE messages SET text = 'drifted' WHERE session_id = ?1 AND turn_id = ?2"
    " AND kind = 'assistant'",
    "payload": "UPDATE messages SET payload_json = '{\"k\":1}' WHERE session_id = ?1"
    " AND turn_id = ?2 AND kind = 'reasoning'",
    "version": "UPDATE messages SET version = version + 1 WHERE session_id = ?1 AND turn_id = ?2"
    " AND kind = 'user'",
    "added": "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
    " payload_json, version, position, created_at_ms, session_key) SELECT workspace_id,"
    " session_id, 'raw-' || message_id, turn_id, kind, text, payload_json, version,"
    " (SELECT max(position) + 1 FROM messages WHERE session_id = ?1), created_at_ms, session_key"
    " FROM messages WHERE session_id = ?1 AND turn_id = ?2 AND kind = 'user'",
}


@pytest.mark.parametrize("write", sorted(_RAW_WRITES))
def test_a_raw_write_between_forks_is_digested_again(
    store: Store, source: tuple[str, list[str]], write: str
) -> None:
    """A fork through Turn 1 ends (failed: no child links the rows, so raw SQL may change
    them); a Message of the boundary is changed by raw SQL on another connection; the next
    prepare through the same Turn must freeze the rows as they are now — with the first
    prepare's digest trusted blindly it would freeze the old one, and its commit, the witness
    counting nothing after it, would link a boundary nobody digested."""
    sid, turns = source
    first, digests = _prepare(store, sid, turns[0])
    assert digests == 1
    before = _frozen_history(store, first)
    store.fork_transitions.mark_fork_failed(WS, first.operation_id, "gave up")
    assert [k[0] for k in _kept(store, sid)] == [1]
    raw = apsw.Connection(str(store.db.path))
    try:
        raw.execute(_RAW_WRITES[write], (sid, turns[0]))
    finally:
        raw.close()
    assert _kept(store, sid) == []  # the trigger deleted it in the raw writer's transaction
    second, digests = _prepare(store, sid, turns[0])
    assert digests == 1
    now = history_digest(store.db.connection(), WS, sid, 1)
    frozen = _frozen_history(store, second)
    assert (frozen["count"], frozen["digest"]) == now != (before["count"], before["digest"])
    assert run_to_commit(store, second).status is ForkStatus.COMMITTED
    _assert_kept_law(store)


def test_a_trusted_stale_digest_is_what_the_checker_reports(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """The checker's law sees what the triggers exist to prevent: the trigger dropped, a raw
    change leaves the kept row standing, and it no longer is the rows' digest."""
    sid, turns = source
    first, _ = _prepare(store, sid, turns[0])
    store.fork_transitions.mark_fork_failed(WS, first.operation_id, "gave up")
    conn = store.db.connection()
    conn.execute("DROP TRIGGER messages_digest_update")
    conn.execute(_RAW_WRITES["text"], (sid, turns[0]))
    assert [k[0] for k in _kept(store, sid)] == [1]
    problems = kept_digest_problems(conn)
    assert len(problems) == 1 and "another digest" in problems[0], problems


# Every other kind of change of the Session's history: each deletes every digest it keeps.
_CHANGES = {
    "a new Turn": lambda store, sid, turns, raw: settled_turn(store, sid, text="later"),
    "a streamed update": lambda store, sid, turns, raw: store.history.append_message(
        WS, sid, turns[2], kind="assistant", text="again", message_id=_message_of(store, sid, 3)
    ),
    "a Turn renumbered": lambda store, sid, turns, raw: raw.execute(
        "UPDATE turns SET sequence = 99 WHERE session_id = ? AND turn_id = ?", (sid, turns[2])
    ),
    "a Turn removed": lambda store, sid, turns, raw: raw.execute(
        "PRAGMA foreign_keys=OFF; DELETE FROM turns WHERE session_id = ? AND turn_id = ?",
        (sid, turns[2]),
    ),
    "a Message removed": lambda store, sid, turns, raw: raw.execute(
        "DELETE FROM messages WHERE session_id = ? AND turn_id = ? AND kind = 'user'",
        (sid, turns[2]),
    ),
    "the Session's key renumbered": lambda store, sid, turns, raw: raw.execute(
        "PRAGMA foreign_keys=OFF; UPDATE session_keys SET session_key = session_key + 1000"
        " WHERE session_id = ?",
        (sid,),
    ),
}


def _message_of(store: Store, sid: str, sequence: int) -> str:
    turns, _ = store.history.timeline(WS, sid)
    return next(t for t in turns if t.sequence == sequence).messages[-1].message_id


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_every_change_of_the_history_deletes_what_is_kept(
    store: Store, source: tuple[str, list[str]], change: str
) -> None:
    sid, turns = source
    for turn in (turns[0], turns[2]):
        op, _ = _prepare(store, sid, turn)
        store.fork_transitions.mark_fork_failed(WS, op.operation_id, "gave up")
    other = new_session(store, title="other")
    settled_turn(store, other, text="o")
    op, _ = _prepare(store, other, _last_turn(store, other))
    store.fork_transitions.mark_fork_failed(WS, op.operation_id, "gave up")
    assert [k[0] for k in _kept(store, sid)] == [1, 3]
    kept_other = _kept(store, other)
    raw = apsw.Connection(str(store.db.path))
    try:
        _CHANGES[change](store, sid, turns, raw)
    finally:
        raw.close()
    rows = (
        store.db.connection()
        .execute(
            "SELECT count(*) FROM history_digests d WHERE d.session_key NOT IN"
            " (SELECT session_key FROM session_keys WHERE session_id = ?)",
            (other,),
        )
        .fetchone()
    )
    assert rows[0] == 0  # both of the Session's rows went, whatever key it has now
    assert _kept(store, other) == kept_other  # another Session's stays


def _last_turn(store: Store, sid: str) -> str:
    turns, _ = store.history.timeline(WS, sid)
    return turns[-1].turn_id


def test_a_prepare_that_rolls_back_keeps_nothing(
    store: Store, source: tuple[str, list[str]]
) -> None:
    """The boundary is digested, then the source's running Turn refuses the fork: the savepoint
    rolls back, the digest with it."""
    sid, turns = source
    store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "running")
    with pytest.raises(ForkBoundaryError):
        store.fork_prepare.prepare_fork(WS, request(sid, turns[1]))
    assert _kept(store, sid) == []


def test_a_linked_source_keeps_no_digest(store: Store, source: tuple[str, list[str]]) -> None:
    """A fork child reads its source's rows through its link: a fork of it digests them every
    time (its own rows' triggers do not see its source's)."""
    sid, turns = source
    op, _ = _prepare(store, sid, turns[2])
    child = run_to_commit(store, op).target_session_id
    store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    last = _last_turn(store, child)
    for _ in range(2):
        grandchild, digests = _prepare(store, child, last)
        assert digests == 0  # the linked digest is computed in Python, not by the statement
        assert _kept(store, child) == []
        store.fork_transitions.mark_fork_failed(WS, grandchild.operation_id, "gave up")
    _assert_kept_law(store)


def test_the_kept_row_is_the_pass_it_saves(store: Store, source: tuple[str, list[str]]) -> None:
    """A kept row holds what `digest_pass` gives: count, digest, highest position, the positions
    of the Messages prepare looks at (a non-empty payload here)."""
    sid, turns = source
    store.history.append_message(WS, sid, turns[2], kind="tool", text="x", payload={"a": 1})
    op, _ = _prepare(store, sid, _last_turn(store, sid))
    row = (
        store.db.connection()
        .execute("SELECT count, digest, top, special FROM history_digests")
        .fetchone()
    )
    count, digest, top, special = digest_pass(store.db.connection(), WS, sid, 3)
    assert (row[0], row[1], row[2], row[3]) == (count, digest, top, ",".join(map(str, special)))
    assert special  # the tool Message's payload
    assert evidence(op).binding_mode == op.binding_mode
