"""A start finds the Turns left active, and the deleted Sessions, through indexes of those rows
alone: what it reads grows with the orphans and the deleted, not with the whole store."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from store_builders import WS, new_session, settled_turn

from storage.schema import SCHEMA_VERSION, migrate, user_version
from storage.sqlite import open_connection
from storage.store import Store
from tests.support.store_reads import drop_history_link_schema

pytestmark = pytest.mark.timeout(30)

_ACTIVE_SQL = (
    "SELECT workspace_id, session_id, turn_id FROM turns INDEXED BY turns_active"
    " WHERE phase = 'active' ORDER BY workspace_id, session_id, sequence"
)


def test_all_active_turns_reads_only_the_active_ones_by_their_index(store: Store) -> None:
    quiet = new_session(store)
    for i in range(5):
        settled_turn(store, quiet, text=f"done {i}")
    busy = [new_session(store) for _ in range(2)]
    for sid in busy:
        settled_turn(store, sid)
    active = sorted(
        (WS, sid, store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "running")[0].turn_id)
        for sid in busy
    )

    assert sorted(store.turns.all_active_turns()) == active

    conn = store.db.connection()
    plan = " ".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + _ACTIVE_SQL))
    # A walk of the partial index (its rows are the active Turns), in its order: no sort.
    assert plan == "SCAN turns USING INDEX turns_active", plan
    # The index holds the active Turns and nothing else.
    indexed = conn.execute(
        "SELECT count(*) FROM turns INDEXED BY turns_active WHERE phase = 'active'"
    ).fetchall()
    assert indexed == [(len(active),)]

    for ws, sid, turn_id in active:
        store.turns.settle_turn(ws, sid, turn_id, outcome="interrupted", error="stopped")
    assert store.turns.all_active_turns() == []


def test_a_store_of_the_previous_version_gains_the_index_with_its_active_turns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    sid = new_session(store)
    settled_turn(store, sid)
    turn_id = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "running")[0].turn_id
    store.close()
    # Back to the version before the index, as a store made by the previous build is.
    conn = open_connection(str(path))
    conn.execute("DROP INDEX turns_active")
    conn.execute("DROP INDEX sessions_deleted")
    # v12 (the history link) and v13 (the fence's witness) came after the index: a v10 store
    # has none of them.
    drop_history_link_schema(conn)
    conn.execute("PRAGMA user_version = 10")
    assert migrate(conn) == 10
    assert user_version(conn) == SCHEMA_VERSION
    conn.close()

    reopened = Store.open(path)
    try:
        assert reopened.turns.all_active_turns() == [(WS, sid, turn_id)]
        assert reopened.sessions.deleted_sessions() == []
    finally:
        reopened.close()


def test_deleted_sessions_are_read_through_their_own_index(store: Store) -> None:
    kept = [new_session(store) for _ in range(3)]
    gone = sorted(new_session(store) for _ in range(2))
    for sid in gone:
        store.sessions.delete_session(WS, sid)

    assert sorted(store.sessions.deleted_sessions()) == [(WS, sid) for sid in gone]
    assert not set(kept) & {sid for _, sid in store.sessions.deleted_sessions()}
    conn = store.db.connection()
    plan = " ".join(
        str(r[3])
        for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT workspace_id, session_id FROM sessions"
            " INDEXED BY sessions_deleted WHERE deleted = 1"
        )
    )
    assert plan == "SCAN sessions USING COVERING INDEX sessions_deleted", plan
