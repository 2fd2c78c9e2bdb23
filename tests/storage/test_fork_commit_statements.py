"""The commit's statements: a target that already exists is refused by the child's own INSERT
(the `sessions` primary key), in the commit's transaction, not by a read of `sessions` first —
one statement fewer in every commit, the same refusal (`test_store_fork.py::
test_the_commit_refuses_a_target_not_reserved_by_it_or_already_there`). Counts, never timings."""

from __future__ import annotations

import uuid
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request

from domain.errors import ForkSnapshotCorrupt
from domain.fork_states import ForkStatus
from storage.store import Store

pytestmark = pytest.mark.timeout(30)


def _accepted(store: Store) -> Any:
    sid = new_session(store, title="src")
    last = ""
    for i in range(3):
        last = settled_turn(store, sid, text=f"t{i}", provider_turn_id=f"p{i}").turn_id
    op, _ = store.fork_prepare.prepare_fork(
        WS, request(sid, last, target=str(uuid.uuid4())), dispatching=True
    )
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    return op


def _commit_statements(store: Store, op_id: str) -> list[str]:
    texts: list[str] = []

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT:
            texts.append(" ".join(str(event["sql"]).split()))

    conn = store.db._writer_connection()
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        store.fork_commit.commit_fork(WS, op_id)
    finally:
        conn.trace_v2(0, None)
    return texts


def test_the_commit_reads_no_session_row_before_its_child_insert(store: Store) -> None:
    _commit_statements(store, _accepted(store).operation_id)  # warm: the statement cache
    texts = _commit_statements(store, _accepted(store).operation_id)
    assert not any(t.startswith("SELECT 1 FROM sessions") for t in texts), texts
    assert any(t.startswith("INSERT INTO sessions") for t in texts), texts


def test_a_target_that_exists_is_refused_by_the_child_insert_and_nothing_is_written(
    store: Store,
) -> None:
    op = _accepted(store)
    conn = store.db.connection()
    conn.execute(
        "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
        " title, cwd, settings_json, runtime_context_json, model, pinned, deleted,"
        " created_at_ms, updated_at_ms) SELECT workspace_id, ?1, kind, provider, NULL, 'squat',"
        " cwd, settings_json, runtime_context_json, model, pinned, deleted, created_at_ms,"
        " updated_at_ms FROM sessions WHERE session_id = ?2",
        (op.target_session_id, op.source_session_id),
    )
    with pytest.raises(ForkSnapshotCorrupt, match="already exists"):
        store.fork_commit.commit_fork(WS, op.operation_id)
    after = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert after.status is ForkStatus.PROVIDER_ACCEPTED
    (title,) = conn.execute(
        "SELECT title FROM sessions WHERE session_id = ?", (op.target_session_id,)
    ).fetchone()
    assert title == "squat"  # the squatter's row, untouched
    (turns,) = conn.execute(
        "SELECT COUNT(*) FROM turns WHERE session_id = ?", (op.target_session_id,)
    ).fetchone()
    (lineage,) = conn.execute(
        "SELECT COUNT(*) FROM fork_lineage WHERE target_session_id = ?", (op.target_session_id,)
    ).fetchone()
    assert (turns, lineage) == (0, 0)
