"""A fork's durable steps read their operation's
row once each. `provider_accepted` answers with the row it read plus what it wrote, and the
ACK with its one read projected plus the time it set — each exactly what a fresh read
returns. Counts of SQL statements on the writer connection, never timings."""

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

from storage.store import Store

pytestmark = pytest.mark.timeout(30)

BY_ID = "FROM fork_operations WHERE workspace_id = ? AND operation_id = ?"


@contextmanager
def _row_reads(store: Store) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT:
            sql = " ".join(str(event["sql"]).split())
            if sql.startswith("SELECT") and BY_ID in sql:
                counts["operation row reads"] += 1

    # Every transition is a write: on the store's one writer connection.
    conn = store.db._writer_connection()
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        yield counts
    finally:
        conn.trace_v2(0, None)


def test_each_step_of_a_fork_reads_its_operation_row_once(store: Store) -> None:
    sid = new_session(store)
    turns = [
        settled_turn(store, sid, text=f"t{i}", provider_turn_id=f"p{i}").turn_id for i in (1, 2)
    ]
    op, created = store.fork_prepare.prepare_fork(
        WS, request(sid, turns[-1], target=str(uuid.uuid4()))
    )
    assert created
    with _row_reads(store) as reads:
        op, _ = store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    assert reads["operation row reads"] == 1
    with _row_reads(store) as reads:
        accepted, changed = store.fork_transitions.mark_fork_provider_accepted(
            WS, op.operation_id, evidence(op)
        )
    assert changed and reads["operation row reads"] == 1  # was 2: the row re-read
    assert accepted == store.fork_queries.get_fork_operation(WS, op.operation_id)
    with _row_reads(store) as reads:
        committed, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed and reads["operation row reads"] == 1
    with _row_reads(store) as reads:
        acked, changed = store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    assert changed and reads["operation row reads"] == 1  # was 2
    read = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert acked == read and acked.client_observed_at_ms is not None
    assert acked.committed_session == read.committed_session
    # A repeated ACK is answered with the row as it is, unchanged.
    with _row_reads(store) as reads:
        again, changed = store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    assert not changed and again == read and reads["operation row reads"] == 1


def test_a_repeated_provider_accepted_answers_the_stored_row(store: Store) -> None:
    """The replay branch still reads what is stored (the evidence it was given may differ)."""
    sid = new_session(store)
    turn = settled_turn(store, sid, text="t", provider_turn_id="p").turn_id
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn))
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    first, changed = store.fork_transitions.mark_fork_provider_accepted(
        WS, op.operation_id, evidence(op)
    )
    assert changed
    again, changed = store.fork_transitions.mark_fork_provider_accepted(
        WS, op.operation_id, evidence(op)
    )
    assert not changed and again == first == store.fork_queries.get_fork_operation(
        WS, op.operation_id
    )
