"""The fence witness's release by operation reads one row, not the whole table: recovery
releases thousands of fences in one set-based status change, each through the trigger."""

from __future__ import annotations

from pathlib import Path

import apsw

from storage.schema import SCHEMA_VERSION, migrate


def _plan(conn: apsw.Connection, sql: str) -> str:
    return " | ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))


def test_the_release_trigger_deletes_an_operations_fence_through_its_index(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "store.sqlite3"))
    migrate(conn, SCHEMA_VERSION)
    (trigger,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'history_fences_released'"
    ).fetchone()
    assert "DELETE FROM history_fences WHERE op_seq = NEW.op_seq" in trigger
    conn.executemany(
        "INSERT INTO history_fences (session_key, op_seq) VALUES (?, ?)",
        [(k, k + 7) for k in range(1, 2001)],
    )
    conn.execute("ANALYZE")
    plan = _plan(conn, "DELETE FROM history_fences WHERE op_seq = 9")
    assert "USING COVERING INDEX history_fences_by_op" in plan or (
        "USING INDEX history_fences_by_op" in plan
    ), plan
    conn.execute("DELETE FROM history_fences WHERE op_seq = 9")
    assert conn.execute("SELECT count(*) FROM history_fences").fetchone() == (1999,)
    assert conn.execute("SELECT count(*) FROM history_fences WHERE session_key = 2").fetchone() == (
        0,
    )
    conn.close()
