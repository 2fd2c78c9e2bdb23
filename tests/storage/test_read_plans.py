"""The reads of the store of months keep their index plans with and without planner statistics.

The session list's first page, a Session read and the newest timeline page of a long Session:
every statement they run is planned by SQLite on a store of that shape (one long Session, many
short ones, interrupted fork operations settled as a restart settles them; bench.months' own
generator at a small size), before and after `ANALYZE` and `PRAGMA optimize`, and each must look
its rows up by the index it was written for, with no scan of a table and no sort of the list's
page. And what every start asks of the failed operations (the trees left to remove) is found
through the index of the operations that have a tree, not by reading every failed operation.
Pinned by the plans, never by timings."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from bench.harness import WS
from bench.months import (
    PAGE,
    RUNTIME_CONTEXT,
    SESSION,
    Size,
    _id,
    bulk_rows,
    interrupt_operations,
)
from storage.base import ReadView
from storage.store import Store
from tests.support.sql_trace import traced_selects

pytestmark = pytest.mark.timeout(120)

BIG_TURNS = 300
SIZE = Size.of(0.002).with_counts(sessions=400, turns=1_500, big_turns=BIG_TURNS, operations=40)
BIG = _id(SESSION, 0)


def _months_store(path: Path) -> None:
    """bench.months' store at a small size: the schema and the long Session through the store,
    the other Sessions, every Turn and Message by the generator's plain SQL, the interrupted
    operations through the store, then settled as a restart settles them (the prepared ones
    failed, the dispatching ones unknown)."""
    store = Store.open(path)
    try:
        store.sessions.create_session(
            WS,
            session_id=BIG,
            provider="tutti-agent",
            title="the long one",
            cwd="/w",
            settings={},
            provider_session_id="thread-0",
            runtime_context=RUNTIME_CONTEXT,
        )
    finally:
        store.close()
    last_turns = bulk_rows(path, SIZE, "/w", [f"pturn-big-{i}" for i in range(BIG_TURNS)])
    interrupt_operations(path, SIZE, "/w", last_turns)
    with Store.open(path) as store:
        failed, unknown = store.fork_recovery.settle_leftover_fork_statuses(
            prepared_error="restart", dispatching_error="restart"
        )
    assert (failed, unknown) == (16, 16)


@pytest.fixture(scope="module")
def months_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("months") / "store.sqlite3"
    _months_store(path)
    return path


@pytest.fixture
def months_path(months_store: Path, tmp_path: Path) -> Path:
    """A copy of the module's store for one test (a test may add statistics or rows)."""
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(months_store, path)
    return path


def _statements(path: Path) -> Iterator[tuple[str, str, tuple[Any, ...]]]:
    """(read, SQL, bindings) of every SELECT the three reads run, as the store runs them."""
    with traced_selects() as seen:
        store, view = Store(path), ReadView(str(path))
        try:
            reads = {
                "list": lambda: store.sessions.list_sessions(WS, limit=PAGE, max_bytes=1 << 20),
                "get": lambda: view.get_session(WS, BIG),
                "timeline": lambda: store.history.timeline_page(
                    WS, BIG, after_sequence=BIG_TURNS - PAGE, limit=PAGE
                ),
            }
            for name, read in reads.items():
                seen.clear()
                got = read()
                assert got, name
                yield from ((name, sql, bindings) for sql, bindings in list(seen))
        finally:
            view.close()
            store.close()


def _plan(conn: apsw.Connection, sql: str, bindings: tuple[Any, ...]) -> list[str]:
    return [str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings)]


EXPECTED = {
    # The page in (created, id) order straight off the index: no sort of the Sessions.
    "FROM sessions s WHERE s.workspace_id = ? AND s.deleted = 0": (
        "SEARCH s USING INDEX sessions_by_created (workspace_id=? AND deleted=?)"
    ),
    "FROM sessions s WHERE s.workspace_id = ? AND s.session_id = ?": (
        "SEARCH s USING INDEX sqlite_autoindex_sessions_1 (workspace_id=? AND session_id=?)"
    ),
    "FROM turns WHERE workspace_id = ? AND session_id = ? AND sequence > ?": (
        "SEARCH turns USING INDEX sqlite_autoindex_turns_2"
        " (workspace_id=? AND session_id=? AND sequence>?)"
    ),
    "FROM messages WHERE session_key = ": (
        "SEARCH messages USING INDEX messages_by_turn (session_key=? AND turn_id=?)"
    ),
}


def _check(conn: apsw.Connection, path: Path) -> set[str]:
    """Every statement's plan: no table scanned, the expected index first; returns the reads
    whose statements matched an expectation."""
    matched: set[str] = set()
    for name, sql, bindings in _statements(path):
        plan = _plan(conn, sql, bindings)
        # Every row the statement reads is looked up through a key: no step scans.
        assert not any(step.startswith("SCAN ") for step in plan), (name, sql, plan)
        flat = " ".join(sql.split())
        for marker, first in EXPECTED.items():
            if marker in flat:
                assert plan[0] == first, (name, sql, plan)
                matched.add(marker)
        if "ORDER BY s.created_at_ms" in flat:
            # A sort may serve a correlated subquery (at most one active Turn), never the page.
            subqueries = [i for i, step in enumerate(plan) if "SUBQUERY" in step]
            outer = plan[: subqueries[0]] if subqueries else plan
            assert not any("TEMP B-TREE" in step for step in outer), (name, plan)
    return matched


def test_the_three_reads_keep_their_plans_without_and_with_statistics(months_path: Path) -> None:
    conn = apsw.Connection(str(months_path))
    try:
        assert not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'"
        ).fetchall(), "a freshly generated store has no statistics"
        assert _check(conn, months_path) == set(EXPECTED)
        # What a long-lived store may gain: statistics, whole or sampled.
        conn.execute("PRAGMA analysis_limit = 400")
        conn.execute("ANALYZE")
        stats = dict(
            conn.execute("SELECT idx, stat FROM sqlite_stat1 WHERE tbl = 'turns'").fetchall()
        )
        assert "turns_active" in stats and "sqlite_autoindex_turns_2" in stats, stats
        assert _check(conn, months_path) == set(EXPECTED)
        conn.execute("PRAGMA analysis_limit = 0")
        conn.execute("ANALYZE")
        conn.execute("PRAGMA optimize")
        assert _check(conn, months_path) == set(EXPECTED)
    finally:
        conn.close()


def _trees_to_remove(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """What a start's `remove_failed_trees` asks first: the failed operations whose tree is not
    known removed (workspace, operation), and the plan of the statement the store ran."""
    with traced_selects() as seen, Store(path) as store:
        found = store.fork_workspace.fork_worktrees_to_remove(limit=500)
        ((sql, bindings),) = [s for s in seen if "workspace_state IN" in s[0]]
        conn = apsw.Connection(str(path))
        try:
            plan = _plan(conn, sql, bindings)
        finally:
            conn.close()
    return [(t.workspace_id, t.operation_id) for t in found], plan


def test_a_start_finds_the_failed_forks_trees_by_their_index(months_path: Path) -> None:
    conn = apsw.Connection(str(months_path))
    try:
        failed = conn.execute(
            "SELECT operation_id FROM fork_operations WHERE status = 'failed' ORDER BY op_seq"
        ).fetchall()
        assert len(failed) == 16
        # Three failed forks left a tree (planned or made, out of op_seq order) and one had it
        # removed already; every other failed operation never had one.
        states = ("made", "removed", "planned", "made")
        for (op_id,), state in zip(failed[9:13], states, strict=True):
            conn.execute(
                "UPDATE fork_operations SET workspace_mode = 'worktree', workspace_state = ?,"
                " workspace_json = '{}' WHERE operation_id = ?",
                (state, op_id),
            )
    finally:
        conn.close()
    want = [
        (WS, str(op_id)) for (op_id,), keep in zip(failed[9:13], (1, 0, 1, 1), strict=True) if keep
    ]
    for statistics in (False, True):
        if statistics:
            conn = apsw.Connection(str(months_path))
            conn.execute("ANALYZE")
            conn.execute("PRAGMA optimize")
            conn.close()
        found, plan = _trees_to_remove(months_path)
        assert found == want, (statistics, found)
        assert plan[0].startswith(
            "SEARCH fork_operations USING INDEX fork_operations_worktrees (status=? AND"
        ), (statistics, plan)


def test_the_start_sweeps_owner_lookup_reads_its_candidates_keys_only(months_path: Path) -> None:
    """`runtime_owners_among` (the start-up sweep's question about the folders it found): each
    candidate is looked up by a key, in `sessions` and in the fork targets' reservations; no
    Session and no fork operation is scanned, and its answer is the owners: a Session, an
    `unknown` fork's target (no Session yet), not a failed fork's target nor a stranger."""
    conn = apsw.Connection(str(months_path))
    try:
        targets = dict(
            conn.execute("SELECT status, target_session_id FROM fork_operations").fetchall()
        )
        candidates = [BIG, targets["unknown"], targets["failed"], "not-a-session"]
        seen: list[tuple[str, tuple[Any, ...]]] = []

        def hook(c: apsw.Connection) -> None:
            def trace(_cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
                seen.append((sql, tuple(bindings or ())))
                return True

            c.exec_trace = trace

        apsw.connection_hooks.append(hook)  # every statement (this one begins WITH)
        try:
            with Store(months_path) as store:
                owners = store.sessions.runtime_owners_among(candidates)
        finally:
            apsw.connection_hooks.remove(hook)
        ((sql, bindings),) = [s for s in seen if "json_each" in s[0]]
        assert sorted(owners) == sorted([(WS, BIG), (WS, targets["unknown"])])
        plan = _plan(conn, sql, bindings)
        scanned = {step.split()[1] for step in plan if step.startswith("SCAN ")}
        # The workspaces (a handful) and the candidates themselves only.
        assert scanned <= {"w", "k", "json_each", "candidate"}, plan
    finally:
        conn.close()
