"""The fence witness's release by operation reads one row, not the whole table: recovery
releases thousands of fences in one set-based status change, each through the trigger. Since
schema v21 the trigger finds the row by its source's key (`session_keys`, then the fence's
primary key), so no index of `op_seq` is kept for it (a WAL frame fewer at each prepare and
each release)."""

from __future__ import annotations

from pathlib import Path

import apsw

from storage.schema import SCHEMA_VERSION, migrate

WS = "ws"
_RELEASE = (
    "DELETE FROM history_fences WHERE session_key = (SELECT session_key FROM session_keys"
    " WHERE workspace_id = ? AND session_id = ?) AND op_seq = ?"
)


def _plan(conn: apsw.Connection, sql: str, bindings: tuple[object, ...] = ()) -> str:
    return " | ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", bindings))


def test_the_release_trigger_deletes_an_operations_fence_by_its_sources_key(
    tmp_path: Path,
) -> None:
    conn = apsw.Connection(str(tmp_path / "store.sqlite3"))
    migrate(conn, SCHEMA_VERSION)
    (trigger,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'history_fences_released'"
    ).fetchone()
    assert " ".join(_RELEASE.split()).replace(
        "workspace_id = ? AND session_id = ?) AND op_seq = ?",
        "workspace_id = NEW.workspace_id AND session_id = NEW.source_session_id)"
        " AND op_seq = NEW.op_seq",
    ) in " ".join(str(trigger).split())
    assert (
        conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'history_fences_by_op'").fetchone()
        is None
    )
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.executemany(
        "INSERT INTO session_keys (workspace_id, session_id) VALUES (?, ?)",
        [(WS, f"s{k}") for k in range(1, 2001)],
    )
    conn.execute(
        "INSERT INTO history_fences (session_key, op_seq)"
        " SELECT session_key, session_key + 7 FROM session_keys"
    )
    conn.execute("ANALYZE")
    plan = _plan(conn, _RELEASE, (WS, "s2", 9))
    # One row through two keys: the Session's key, then the fence's rowid. No scan.
    assert "SCAN" not in plan, plan
    assert "SEARCH history_fences USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
    assert "USING COVERING INDEX sqlite_autoindex_session_keys_1" in plan, plan
    # Another operation's fence of the same source stays: op_seq is still compared.
    conn.execute(_RELEASE, (WS, "s2", 10))
    assert conn.execute("SELECT count(*) FROM history_fences").fetchone() == (2000,)
    conn.execute(_RELEASE, (WS, "s2", 9))
    assert conn.execute("SELECT count(*) FROM history_fences").fetchone() == (1999,)
    assert conn.execute("SELECT count(*) FROM history_fences WHERE session_key = 2").fetchone() == (
        0,
    )
    conn.close()
