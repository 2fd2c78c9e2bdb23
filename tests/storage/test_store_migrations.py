"""Opening every older schema version upgrades it in place and keeps its data."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import shutil
from pathlib import Path

import apsw
import pytest
from store_builders import WS, settled_turn

from storage.models import ForkPrepareRequest
from storage.schema import MIGRATIONS, SCHEMA_VERSION, SchemaTooNew, migrate, user_version
from storage.sqlite import open_connection
from storage.store import Store

pytestmark = pytest.mark.timeout(30)

WS_V4 = "ws-v4"  # the fixture's workspace


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
    # From v7 on a Message also carries its Session's integer key.
    keyed = user_version(conn) >= 7
    conn.execute(
        "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
        " payload_json, version, position, created_at_ms"
        + (", session_key" if keyed else "")
        + ") VALUES (?, 'old', 'm1', 'turn-1', 'user', 'hello from v1', '{}', 1, 1, 1"
        + (", (SELECT session_key FROM session_keys WHERE session_id = 'old')" if keyed else "")
        + ")",
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
    assert user_version(store.db.connection()) == SCHEMA_VERSION
    assert store.db.connection().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert store.db.connection().execute("PRAGMA foreign_key_check").fetchall() == []
    if version >= 1:
        old = store.sessions.get_session(WS, "old")
        assert old.lineage is None and old.provider_session_id == "prov-old"
        assert store.turns.get_turn(WS, "old", "turn-1").messages[0].text == "hello from v1"
        # The upgraded history is usable by the newest features: it can be forked.
        op, created = store.fork_prepare.prepare_fork(
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
        sid = store.sessions.create_session(
            WS, session_id="fresh", provider="p", title="t", cwd="/", settings={}
        ).session_id
        store.sessions.update_runtime(WS, sid, provider_session_id="x")
        settled_turn(store, sid)
    store.close()


def test_reopening_a_current_store_is_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    store = Store.open(path)
    assert store.db.migrate() == SCHEMA_VERSION
    store.close()


def test_a_newer_schema_than_this_build_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    conn = open_connection(str(path))
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew):
        Store.open(path)


# -- v4 -> v5 on a file the v4 build wrote (tests/storage/fixtures/make_v4_store.py) ---------

FIXTURES = Path(__file__).parent / "fixtures"


def _v4_copy(tmp_path: Path) -> Path:
    path = tmp_path / "store.sqlite3"
    with gzip.open(FIXTURES / "store_v4.sqlite3.gz", "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def _plain(op: object) -> object:
    return json.loads(json.dumps(dataclasses.asdict(op), default=str))  # type: ignore[call-overload]


def test_a_real_v4_store_moves_its_snapshots_and_keeps_every_operation(tmp_path: Path) -> None:
    path = _v4_copy(tmp_path)
    raw = open_connection(str(path))
    assert user_version(raw) == 4
    before = {
        r[0]: (r[1], r[2])
        for r in raw.execute("SELECT op_seq, snapshot_json, snapshot_hash FROM fork_operations")
    }
    failed = "SELECT op_seq FROM fork_operations WHERE status = 'failed'"
    ended = {r[0] for r in raw.execute(failed)}
    raw.close()
    assert len(before) == 6
    expected = json.loads((FIXTURES / "store_v4.json").read_text())

    store = Store.open(path)
    conn = store.db.connection()
    assert user_version(conn) == SCHEMA_VERSION >= 5
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    columns = {r[1] for r in conn.execute("PRAGMA table_info(fork_operations)")}
    assert "snapshot_json" not in columns and "snapshot_hash" in columns
    # v9: every Turn has a workspace checkpoint column, empty on the Turns it found.
    assert "checkpoint_json" in {r[1] for r in conn.execute("PRAGMA table_info(turns)")}
    recorded = "SELECT COUNT(*) FROM turns WHERE checkpoint_json IS NOT NULL"
    assert conn.execute(recorded).fetchall() == [(0,)]
    moved = dict(conn.execute("SELECT op_seq, snapshot_json FROM fork_snapshots").fetchall())
    # The same bytes under the same op_seq: every frozen hash still verifies; the failed
    # operation's, which nothing reads again, dropped by v27.
    assert len(ended) == 1
    assert moved == {seq: text for seq, (text, _) in before.items() if seq not in ended}
    for text, digest in before.values():
        assert hashlib.sha256(text.encode()).hexdigest() == digest

    # fork.get answers every operation as the v4 build did (committed: from the snapshot);
    # an operation from before workspaces existed is a `shared` fork.
    shared = {"workspace_mode": "shared", "worktree": None, "worktree_state": None}
    for state, old in expected.items():
        got = _plain(store.fork_queries.get_fork_operation(WS_V4, old["operation_id"]))
        if old.get("committed_session") is not None:
            # v18: a Session's row version; the committed child as its commit inserts it, at 0.
            old = {**old, "committed_session": {**old["committed_session"], "version": 0}}
        assert got == {**old, **shared}, state

    # The saga goes on from each state on the migrated file.
    accepted = expected["provider_accepted"]["operation_id"]
    committed, changed = store.fork_commit.commit_fork(WS_V4, accepted)
    assert changed and committed.status.value == "committed"
    assert store.fork_queries.get_fork_operation(WS_V4, accepted) == committed
    child = store.sessions.get_session(WS_V4, committed.target_session_id)
    assert child.lineage is not None and child.lineage.operation_id == accepted
    assert len(store.history.timeline(WS_V4, child.session_id)[0]) == 3
    acked, _ = store.fork_transitions.acknowledge_fork(WS_V4, expected["committed"]["operation_id"])
    assert acked.client_observed_at_ms is not None
    assert (
        acked.committed_session
        == store.fork_queries.get_fork_operation(WS_V4, acked.operation_id).committed_session
    )
    dispatching = expected["dispatching"]["operation_id"]
    unknown, _ = store.fork_transitions.mark_fork_unknown(WS_V4, dispatching, "lost at restart")
    assert unknown.status.value == "unknown"
    # A new fork of a migrated source freezes its snapshot into the new table.
    src = expected["failed"]["source_session_id"]
    op, created = store.fork_prepare.prepare_fork(
        WS_V4,
        ForkPrepareRequest(
            source_session_id=src,
            request_id="after-migration",
            target_session_id="child-new",
            turn_id=expected["failed"]["source_turn_id"],
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
        ),
    )
    assert created
    # Six before (the failed one's dropped by v27) and this one.
    assert conn.execute("SELECT COUNT(*) FROM fork_snapshots").fetchone()[0] == 6
    store.close()


def test_recovery_on_a_migrated_v4_store_settles_and_commits(tmp_path: Path) -> None:
    from actors.recovery import recover_fork_operations

    path = _v4_copy(tmp_path)
    expected = json.loads((FIXTURES / "store_v4.json").read_text())
    store = Store.open(path)
    report = recover_fork_operations(store)
    assert (report.committed, report.errors) == (1, 0)
    status = {
        state: store.fork_queries.get_fork_operation(WS_V4, old["operation_id"]).status.value
        for state, old in expected.items()
    }
    assert status == {
        "acknowledged": "committed",
        "committed": "committed",
        "provider_accepted": "committed",
        "dispatching": "unknown",
        "prepared": "failed",
        "failed": "failed",
    }
    store.close()


# -- v6 -> v7: `messages` keyed by an integer per Session ------------------------------------


def test_v7_keys_every_message_by_its_sessions_integer_and_new_sessions_get_one(
    tmp_path: Path,
) -> None:
    path = _v4_copy(tmp_path)
    raw = open_connection(str(path))
    old_rows = sorted(
        raw.execute(
            "SELECT workspace_id, session_id, message_id, turn_id, kind, text, payload_json,"
            " version, position, created_at_ms FROM messages"
        ).fetchall()
    )
    sessions = raw.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    raw.close()
    assert old_rows and sessions > 1

    store = Store.open(path)
    conn = store.db.connection()
    new_rows = sorted(
        conn.execute(
            "SELECT workspace_id, session_id, message_id, turn_id, kind, text, payload_json,"
            " version, position, created_at_ms FROM messages"
        ).fetchall()
    )
    assert new_rows == old_rows  # every row as it was
    # One key per Session, and every Message carries its own Session's.
    assert conn.execute("SELECT COUNT(*) FROM session_keys").fetchone()[0] == sessions
    mismatched = conn.execute(
        "SELECT COUNT(*) FROM messages m LEFT JOIN session_keys k"
        " ON k.session_key = m.session_key AND k.workspace_id = m.workspace_id"
        " AND k.session_id = m.session_id WHERE k.session_key IS NULL"
    ).fetchone()[0]
    assert mismatched == 0
    # The keys lead with the integer: a Turn's Messages are read through `messages_by_turn`.
    plan = " ".join(
        str(r[3])
        for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT text FROM messages WHERE session_key = 1 AND turn_id = 't'"
            " ORDER BY position"
        )
    )
    assert "messages_by_turn" in plan, plan

    # A Session created after the upgrade gets the next key from the trigger, and its
    # Messages land under it.
    sid = store.sessions.create_session(
        WS_V4, session_id="after-v7", provider="p", title="t", cwd="/", settings={}
    ).session_id
    store.sessions.update_runtime(WS_V4, sid, provider_session_id="x")
    turn = settled_turn(store, sid, WS_V4, text="new")
    key = conn.execute(
        "SELECT session_key FROM session_keys WHERE workspace_id = ? AND session_id = ?",
        (WS_V4, sid),
    ).fetchone()[0]
    assert key == conn.execute("SELECT MAX(session_key) FROM session_keys").fetchone()[0]
    assert {
        r[0] for r in conn.execute("SELECT session_key FROM messages WHERE session_id = ?", (sid,))
    } == {key}
    assert [m.text for m in store.turns.get_turn(WS_V4, sid, turn.turn_id).messages] == [
        "new",
        "echo: new",
    ]
    store.close()
