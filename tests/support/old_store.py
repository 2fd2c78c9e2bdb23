"""A store file as an older build wrote it: the schema migrated only to a given version, with
rows inserted in that version's columns (what an upgrade then meets)."""

from __future__ import annotations

from pathlib import Path

from storage.schema import migrate, user_version
from storage.sqlite import open_connection


def v24_store(path: Path, ws: str, cwds: dict[str, str]) -> None:
    """A store at schema v24 holding one live root Session in `ws` per `cwds` entry (id → cwd
    as given), as the v24 build wrote them: no real cwd anywhere."""
    conn = open_connection(str(path))
    try:
        migrate(conn, target=24)
        assert user_version(conn) == 24
        conn.execute("INSERT INTO workspaces VALUES (?, 1)", (ws,))
        for sid, cwd in cwds.items():
            conn.execute(
                "INSERT INTO sessions (workspace_id, session_id, kind, provider, title, cwd,"
                " settings_json, runtime_context_json, created_at_ms, updated_at_ms)"
                " VALUES (?, ?, 'root', 'tutti-agent', ?, ?, '{}', '{}', 1, 1)",
                (ws, sid, sid, cwd),
            )
    finally:
        conn.close()
