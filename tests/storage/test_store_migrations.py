"""Opening every older schema version upgrades it in place and keeps its data."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from store_builders import WS, settled_turn

from storage import Store
from storage.schema import MIGRATIONS, SCHEMA_VERSION, SchemaTooNew, migrate, user_version
from storage.sqlite import open_connection

pytestmark = pytest.mark.timeout(30)


def _at_version(path: Path, version: int) -> apsw.Connection:
    conn = open_connection(str(path))
    migrate(conn, target=version)
    assert user_version(conn) == version
    return conn


def _seed_v1(conn: apsw.Connection) -> None:
    conn.execute("INSERT INTO workspaces VALUES (?, 1)", (WS,))
    conn.execute(
        "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
        " title, cwd, settings_json, runtime_context_json, created_at_ms, updated_at_ms)"
        " VALUES (?, 'old', 'root', 'tutti-agent', 'prov-old', 'Old', '/', '{}', '{}', 1, 1)",
        (WS,),
    )
    conn.execute(
        "INSERT INTO turns (workspace_id, session_id, turn_id, sequence, sequence_provenance,"
        " phase, outcome, root_provider_turn_id, created_at_ms, settled_at_ms)"
        " VALUES (?, 'old', 'turn-1', 1, 'host', 'settled', 'completed', 'p1', 1, 2)",
        (WS,),
    )
    conn.execute(
        "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
        " payload_json, version, position, created_at_ms)"
        " VALUES (?, 'old', 'm1', 'turn-1', 'user', 'hello from v1', '{}', 1, 1, 1)",
        (WS,),
    )


def test_schema_versions_are_contiguous_and_v1_v2_exist() -> None:
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 2


@pytest.mark.parametrize("version", range(SCHEMA_VERSION))
def test_store_opens_every_older_schema_version(tmp_path: Path, version: int) -> None:
    path = tmp_path / "store.sqlite3"
    conn = _at_version(path, version)
    if version >= 1:
        _seed_v1(conn)
    conn.close()
    store = Store.open(path)
    assert user_version(store._conn()) == SCHEMA_VERSION
    assert store._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert store._conn().execute("PRAGMA foreign_key_check").fetchall() == []
    if version >= 1:
        old = store.get_session(WS, "old")
        assert old.lineage is None and old.provider_session_id == "prov-old"
        assert store.get_turn(WS, "old", "turn-1").messages[0].text == "hello from v1"
        # The upgraded history is usable by the newest features: it can be forked.
        from storage import ForkPrepareRequest

        op, created = store.prepare_fork(
            WS,
            ForkPrepareRequest(
                source_session_id="old",
                request_id="r",
                target_session_id="new",
                turn_id="turn-1",
                driver_kind="tutti-agent",
                driver_version="0.0.10",
                binding_mode="host_copy",
            ),
        )
        assert created and op.source_provider_turn_ids == ("p1",)
    else:
        sid = store.create_session(
            WS, session_id="fresh", provider="p", title="t", cwd="/", settings={}
        ).session_id
        store.update_runtime(WS, sid, provider_session_id="x")
        settled_turn(store, sid)
    store.close()


def test_reopening_a_current_store_is_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    store = Store.open(path)
    assert store._migrate() == SCHEMA_VERSION
    store.close()


def test_a_newer_schema_than_this_build_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    conn = open_connection(str(path))
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew):
        Store.open(path)
