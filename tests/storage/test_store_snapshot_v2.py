"""Snapshot v2 (issue 20 row 10): Messages frozen as compact arrays, and the v1 snapshots older
builds stored still commit and project the same child.

A v2 snapshot's bytes are the canonical JSON of the document prepare froze (sorted keys, no
whitespace) and parse back to exactly that document; a v1 snapshot (Messages as objects, as
every build before issue 20 wrote, e.g. the operations of `fixtures/store_v4.sqlite3.gz`) is
read into the same shape, so the child built from either is the same.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request

import storage.fork_child as fork_child
import storage.fork_rows as fork_rows
import storage.fork_snapshot as fork_snapshot
from storage import Store
from storage.base import WRITER_CACHE_KIB
from storage.errors import ForkSnapshotCorrupt
from storage.fork_boundary import MESSAGE_FIELDS
from storage.fork_child import build_child
from storage.fork_snapshot import (
    SNAPSHOT_VERSION,
    encode_snapshot,
    load_snapshot,
    sha256_hex,
)
from storage.sqlite import dumps

pytestmark = pytest.mark.timeout(60)


def _source(store: Store) -> tuple[str, str]:
    """Two Turns with a payload reference, a non-empty payload and a Session-level Message
    (no Turn) between them: the boundary must skip it and keep each Turn's own Messages."""
    sid = new_session(store)
    first = settled_turn(store, sid, text="one", extra=[("reasoning", "think", {"k": [1, "é"]})])
    store.append_message(WS, sid, None, kind="notice", text="session-level")
    user = first.messages[0].message_id
    second = settled_turn(
        store, sid, text="two", extra=[("tool_call", "call", {"replyToMessageId": user})]
    )
    return sid, second.turn_id


def _stored(store: Store, op_id: str) -> tuple[str, str]:
    row = (
        store._conn()
        .execute(
            "SELECT s.snapshot_json, o.snapshot_hash FROM fork_operations o JOIN fork_snapshots s"
            " USING (op_seq) WHERE o.operation_id = ?",
            (op_id,),
        )
        .fetchone()
    )
    assert row is not None
    return str(row[0]), str(row[1])


def _forget() -> None:
    """As after a restart: this process holds nothing prepare froze or a read projected."""
    fork_snapshot._FROZEN.clear()
    fork_child._HISTORY.clear()
    fork_rows.projection_cache.clear()


def _as_v1(document: dict[str, Any]) -> dict[str, Any]:
    """The document as a build before issue 20 froze it: Messages as objects, version 1."""
    v1 = {k: v for k, v in document.items() if k != "message_fields"}
    v1["version"] = 1
    v1["turns"] = [
        {**t, "messages": [dict(zip(MESSAGE_FIELDS, m, strict=True)) for m in t["messages"]]}
        for t in document["turns"]
    ]
    return v1


def test_a_new_snapshot_is_v2_with_message_arrays_and_round_trips_exactly(store: Store) -> None:
    sid, last = _source(store)
    op, _ = store.prepare_fork(WS, request(sid, last))
    text, digest = _stored(store, op.operation_id)
    assert sha256_hex(text) == digest
    raw = json.loads(text)
    assert raw["version"] == SNAPSHOT_VERSION == 2
    assert raw["message_fields"] == list(MESSAGE_FIELDS)
    messages = [m for t in raw["turns"] for m in t["messages"]]
    assert all(isinstance(m, list) and len(m) == len(MESSAGE_FIELDS) for m in messages)
    source = [m for t in store.timeline(WS, sid, limit=10)[0] for m in t.messages]
    # Every Turn's Messages in order, the Session-level one left out.
    assert [m[0] for m in messages] == [m.message_id for m in source]
    assert "session-level" not in [m[2] for m in messages]
    assert [m[3] for m in messages] == [m.payload for m in source]
    # Canonical: the bytes are exactly what `dumps` (sorted keys) writes for their parse, and
    # the loaded document re-encodes to the same bytes (so it is the document prepare froze).
    assert dumps(raw) == text
    loaded = load_snapshot(text, digest)
    assert loaded == raw
    assert encode_snapshot(loaded) == text


def test_a_v1_snapshot_stored_by_an_older_build_commits_the_same_child(store: Store) -> None:
    sid, last = _source(store)
    op, _ = store.prepare_fork(WS, request(sid, last))
    text, digest = _stored(store, op.operation_id)
    v2 = load_snapshot(text, digest)
    # What a build before issue 20 stored for this operation (same content, Messages as objects,
    # hashed as written): the row an operation prepared before an upgrade still holds.
    v1_text = dumps(_as_v1(v2))
    v1_hash = sha256_hex(v1_text)
    assert v1_text != text and '"message_id":' in v1_text
    conn = store._conn()
    conn.execute(
        "UPDATE fork_operations SET snapshot_hash = ? WHERE operation_id = ?",
        (v1_hash, op.operation_id),
    )
    conn.execute(
        "UPDATE fork_snapshots SET snapshot_json = ? WHERE op_seq ="
        " (SELECT op_seq FROM fork_operations WHERE operation_id = ?)",
        (v1_text, op.operation_id),
    )
    _forget()
    v1 = load_snapshot(v1_text, v1_hash)
    assert v1["version"] == 1 and v1["turns"] == v2["turns"]

    def plan(document: dict[str, Any]) -> Any:
        return build_child(
            document,
            child_provider_session_id="c",
            binding_mode="host_copy",
            turn_bindings=None,
            committed_at_ms=7,
        )

    assert plan(v1) == plan(v2)

    store.mark_fork_dispatching(WS, op.operation_id)
    store.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, changed = store.commit_fork(WS, op.operation_id)
    assert changed and committed.status.value == "committed"
    child = store.timeline(WS, committed.target_session_id, limit=10)[0]
    source = store.timeline(WS, sid, limit=10)[0]
    assert [[(m.kind, m.text) for m in t.messages] for t in child] == [
        [(m.kind, m.text) for m in t.messages] for t in source
    ]
    # The payload reference points at the child's own copy of the user Message.
    assert child[1].messages[1].payload == {"replyToMessageId": child[0].messages[0].message_id}
    assert child[0].messages[1].payload == {"k": [1, "é"]}
    # A reader in a fresh process projects the committed child from the v1 bytes alone.
    _forget()
    assert store.get_fork_operation(WS, op.operation_id) == committed


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ({"version": 3, "turns": []}, "unsupported snapshot version 3"),
        ({"version": 2, "turns": []}, "unsupported snapshot version 2"),  # no message_fields
        ({"version": 1, "turns": [{"messages": [{"message_id": "m"}]}]}, "malformed v1"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_a_snapshot_of_no_known_shape_fails_closed(document: Any, why: str) -> None:
    text = dumps(document)
    with pytest.raises(ForkSnapshotCorrupt, match=why):
        load_snapshot(text, sha256_hex(text))


def test_the_writer_connection_has_the_bigger_page_cache(store: Store) -> None:
    row = store._writer_connection().execute("PRAGMA cache_size").fetchone()
    assert row is not None and row[0] == -WRITER_CACHE_KIB
    # Readers keep SQLite's default: the bigger cache is for the one connection that writes.
    with store._read() as conn:
        row = conn.execute("PRAGMA cache_size").fetchone()
    assert row is not None and row[0] != -WRITER_CACHE_KIB
