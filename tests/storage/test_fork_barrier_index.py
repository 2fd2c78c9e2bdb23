"""The boundary barrier's lookup (`barrier_holder`, every prepare) reads the barrier rows
only, through the partial index whose WHERE is the barrier rule's SQL: not every operation
the source ever had, and no sort (the first holder by `op_seq` is picked from the few rows)."""

from __future__ import annotations

from pathlib import Path

import apsw

from domain.fork_states import BARRIER_RULE_SQL, BARRIER_SQL
from storage.fork_prepare import BARRIER_HOLDERS_SQL, barrier_holder
from storage.rows import BARRIER_OPS_SQL
from tests.storage.store_builders import bare_operation, operations_only

WS, SRC = "ws", "src"


def _plan(conn: apsw.Connection, sql: str, params: tuple[str, ...]) -> str:
    return " | ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_the_index_is_the_barrier_rule() -> None:
    """Its WHERE is the barrier's SQL text, as the query repeats it (else no planner uses it):
    the rule itself at v20, its flag since v22 (the flag the rule, tests/storage/
    test_fork_barrier_flag.py)."""
    from storage.schema import _V20_OBJECTS, _V22_INDEX

    assert BARRIER_OPS_SQL == BARRIER_SQL == "barrier = 1"
    assert f"WHERE {BARRIER_RULE_SQL};" in _V20_OBJECTS  # made again with comparisons at v20
    assert f"WHERE {BARRIER_SQL};" in _V22_INDEX


def test_the_barrier_lookup_reads_the_held_rows_only(tmp_path: Path) -> None:
    conn = operations_only(tmp_path / "store.sqlite3")
    for n in range(500):  # a source forked and ACKed 500 times: none holds the barrier
        _op(conn, n, "committed", observed=1)
    _op(conn, 500, "failed")
    conn.execute("ANALYZE")
    plan = _plan(conn, BARRIER_HOLDERS_SQL, (WS, SRC, "turn-1"))
    assert "fork_operations_barrier_held" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
    assert barrier_holder(conn, WS, SRC, "turn-1") is None
    _op(conn, 501, "unknown")
    _op(conn, 502, "committed")  # not ACKed: holds it too, but the older one answers
    held = barrier_holder(conn, WS, SRC, "turn-1")
    assert held is not None and held[1] == "op-501"
    conn.execute(
        "UPDATE fork_operations SET status = 'failed', barrier = 0, stage = 0"
        " WHERE operation_id = 'op-501'"
    )
    held = barrier_holder(conn, WS, SRC, "turn-1")
    assert held is not None and held[1] == "op-502"
    conn.execute(
        "UPDATE fork_operations SET client_observed_at_ms = 1, barrier = 0"
        " WHERE operation_id = 'op-502'"
    )
    assert barrier_holder(conn, WS, SRC, "turn-1") is None
    assert barrier_holder(conn, WS, SRC, "turn-2") is None
    conn.close()


def test_the_old_barrier_index_is_gone(tmp_path: Path) -> None:
    conn = operations_only(tmp_path / "store.sqlite3")
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "fork_operations_barrier_held" in names
    assert "fork_operations_barrier" not in names
    conn.close()


def _op(conn: apsw.Connection, n: int, status: str, observed: int | None = None) -> None:
    bare_operation(conn, n, status, observed, ws=WS, source=SRC, turn_id="turn-1")
