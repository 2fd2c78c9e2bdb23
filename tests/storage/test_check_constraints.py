"""Schema v14: the CHECKs of `turns.outcome` and `interactions.status` are comparisons, not
`IN` lists of three constants, so a Turn's or an Interaction's write builds no ephemeral index
of the list; they accept and refuse exactly what v13's did (a NULL outcome included)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from storage.schema import (
    INTERACTION_STATUS_CHECK,
    SCHEMA_VERSION,
    TURN_OUTCOME_CHECK,
    migrate,
)
from storage.sqlite import open_connection

pytestmark = pytest.mark.timeout(30)

WS = "ws"

_INSERT_TURN = (
    "INSERT INTO turns (workspace_id, session_id, turn_id, sequence, sequence_provenance, phase,"
    " outcome, created_at_ms) VALUES (?, 's', ?, ?, 'host', 'settled', ?, 1)"
)
_INSERT_INTERACTION = (
    "INSERT INTO interactions (workspace_id, session_id, interaction_id, request_id, turn_id,"
    " kind, status, input_json, created_at_ms) VALUES (?, 's', ?, ?, 't1', 'approval', ?, '{}', 1)"
)


def _store_at(path: Path, version: int) -> apsw.Connection:
    conn = open_connection(str(path))
    migrate(conn, target=version)
    conn.execute("INSERT INTO workspaces VALUES (?, 1)", (WS,))
    conn.execute(
        "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
        " title, cwd, settings_json, runtime_context_json, created_at_ms, updated_at_ms)"
        " VALUES (?, 's', 'root', 'tutti-agent', 'p', 'S', '/', '{}', '{}', 1, 1)",
        (WS,),
    )
    return conn


def _opcodes(conn: apsw.Connection, sql: str, params: tuple[object, ...]) -> list[str]:
    return [str(r[1]) for r in conn.execute("EXPLAIN " + sql, params)]


def _table_sql(conn: apsw.Connection, table: str) -> str:
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION])
def test_a_turn_and_an_interaction_accept_and_refuse_the_same_values(
    tmp_path: Path, version: int
) -> None:
    conn = _store_at(tmp_path / "store.sqlite3", version)
    for n, outcome in enumerate(("completed", "interrupted", "failed", None), start=1):
        conn.execute(_INSERT_TURN, (WS, f"t{n}", n, outcome))
    for bad in ("done", "", "Completed"):
        with pytest.raises(apsw.ConstraintError, match="CHECK"):
            conn.execute(_INSERT_TURN, (WS, f"bad-{bad}", 99, bad))
        with pytest.raises(apsw.ConstraintError, match="CHECK"):
            conn.execute("UPDATE turns SET outcome = ? WHERE turn_id = 't1'", (bad,))
    for n, status in enumerate(("pending", "resolved", "superseded"), start=1):
        conn.execute(_INSERT_INTERACTION, (WS, f"i{n}", f"r{n}", status))
    for bad in ("open", "", None):
        with pytest.raises(apsw.ConstraintError):
            conn.execute(_INSERT_INTERACTION, (WS, "i-bad", "r-bad", bad))
    assert conn.execute("SELECT count(*) FROM turns").fetchone() == (4,)
    assert conn.execute("SELECT count(*) FROM interactions").fetchone() == (3,)


def test_v14_writes_a_turn_and_an_interaction_without_an_ephemeral_index(tmp_path: Path) -> None:
    before = _store_at(tmp_path / "v13.sqlite3", 13)
    after = _store_at(tmp_path / "v14.sqlite3", 14)
    turn = (WS, "t1", 1, "completed")
    interaction = (WS, "i1", "r1", "pending")
    settle = "UPDATE turns SET outcome = ? WHERE workspace_id = ? AND turn_id = ?"
    # v13: each statement built an index of the CHECK's three constants to test one value.
    assert "OpenEphemeral" in _opcodes(before, _INSERT_TURN, turn)
    assert "OpenEphemeral" in _opcodes(before, settle, ("failed", WS, "t1"))
    assert "OpenEphemeral" in _opcodes(before, _INSERT_INTERACTION, interaction)
    assert "OpenEphemeral" not in _opcodes(after, _INSERT_TURN, turn)
    assert "OpenEphemeral" not in _opcodes(after, settle, ("failed", WS, "t1"))
    assert "OpenEphemeral" not in _opcodes(after, _INSERT_INTERACTION, interaction)
    # The edit replaced the constraint's text, nothing else of either table.
    for table, (old, new) in (
        ("turns", TURN_OUTCOME_CHECK),
        ("interactions", INTERACTION_STATUS_CHECK),
    ):
        old_sql, new_sql = _table_sql(before, table), _table_sql(after, table)
        assert old in old_sql and new in new_sql and old not in new_sql
        assert new_sql == old_sql.replace(old, new)
    assert after.execute("PRAGMA integrity_check").fetchone() == ("ok",)
