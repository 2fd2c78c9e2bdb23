"""A warm fork's store steps, counted: what prepare and the commit of a small fork of an
unchanged boundary ask of SQLite and of Python beyond the fork's own rows (their time is
`bench.fork_statements`' to measure). Counts, never timings.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn, writer_statements
from test_store_fork import request, run_to_commit

import storage.fork_child as fork_child
from storage.models import ForkOperation
from storage.store import Store

pytestmark = pytest.mark.timeout(60)


def _source(store: Store, turns: int = 3) -> tuple[str, str]:
    sid = new_session(store)
    last = ""
    for i in range(turns):
        last = settled_turn(store, sid, text=f"turn {i}", provider_turn_id=f"p{i}").turn_id
    return sid, last


def _fork(store: Store, sid: str, turn_id: str) -> ForkOperation:
    """Prepare a fork of `sid` through `turn_id`, warm-path style (a lazy prepare)."""
    op, created = store.fork_prepare.prepare_fork(
        WS, request(sid, turn_id, target=str(uuid.uuid4())), durable=False
    )
    assert created
    return op


def _done(store: Store, op: ForkOperation) -> None:
    """Commit and acknowledge `op`: its boundary's barrier is released for the next fork."""
    run_to_commit(store, op)
    store.fork_transitions.acknowledge_fork(WS, op.operation_id)


def test_a_warm_prepare_of_an_unchanged_boundary_compiles_no_select(store: Store) -> None:
    """SQLite compiles a statement once and runs it from the statement cache after, unless it
    judges its plan to depend on the values bound: the boundary's Turns with their final
    Messages, bound by the Session's ids or key, was compiled again at every prepare. A
    second fork of the same boundary compiles no SELECT (the authorizer is asked only while a
    statement compiles)."""
    sid, last = _source(store)
    conn = store.db._writer_connection()
    compiled: Counter[str] = Counter()
    phase = ["first"]

    def authorizer(action: int, *_: Any) -> int:
        if action == apsw.SQLITE_SELECT:
            compiled[phase[0]] += 1
        return apsw.SQLITE_OK

    conn.authorizer = authorizer  # expires every cached statement: all compile once below
    try:
        _done(store, _fork(store, sid, last))
        assert compiled["first"] > 0
        phase[0] = "second"
        op = _fork(store, sid, last)
    finally:
        conn.authorizer = None
    assert compiled["second"] == 0
    _done(store, op)


def test_prepare_answers_the_operation_it_wrote_without_reading_it_back(store: Store) -> None:
    """Prepare answers with the row it inserted, built from the values it wrote (no SELECT of
    the operation after its INSERT): equal, field for field, to a read of it."""
    sid, last = _source(store)
    with writer_statements(store) as seen:
        op = _fork(store, sid, last)
    insert = next(i for i, sql in enumerate(seen) if sql.startswith("INSERT INTO fork_operations"))
    assert not [
        sql
        for sql in seen[insert:]
        if sql.startswith("SELECT") and "FROM fork_operations WHERE" in sql
    ]
    read = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert op == read
    assert type(op.point_kind) is type(read.point_kind)
    assert type(op.binding_mode) is type(read.binding_mode)
    assert op.frozen_turns is not None and len(op.frozen_turns) == 3


def test_the_commit_derives_none_of_the_prefixes_prepare_derived(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule v2's three prefixes of an operation (a SHA-1 each) are derived once, by prepare,
    and kept with its child history: its commit in the same process derives none."""
    derived: Counter[str] = Counter()
    real = fork_child.ordinal_prefix

    def counted(*args: Any) -> str:
        derived["prefixes"] += 1
        return real(*args)

    monkeypatch.setattr(fork_child, "ordinal_prefix", counted)
    sid, last = _source(store)
    op = _fork(store, sid, last)
    assert derived["prefixes"] == 3
    committed = run_to_commit(store, op)
    assert derived["prefixes"] == 3
    assert committed.lineage is not None
    assert committed.lineage.target_turn_id == fork_child.ordinal_id(
        fork_child.OrdinalPrefixes.of(op.operation_id, WS, sid, op.target_session_id).turn, 3
    )
