"""Snapshot versions (issue 20 row 10): v3 freezes the document as MessagePack bytes with
Messages as compact arrays; the v2 (canonical JSON, Messages as arrays) and v1 (Messages as
objects) snapshots older builds stored still commit and project the same child.

A v3 snapshot's bytes unpack to exactly the document prepare froze and pack back to the same
bytes; a v2 one is canonical JSON (sorted keys, no whitespace) and is also what a document
MessagePack cannot hold (an integer beyond 64 bits) is frozen as; a v1 snapshot (as every build
before issue 20 wrote, e.g. the operations of `fixtures/store_v4.sqlite3.gz`) is read into the
same shape, so the child built from any of them is the same.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from store_builders import WS, new_session, settled_turn
from test_store_fork import evidence, request

from domain.errors import ForkSnapshotCorrupt
from storage.base import WRITER_CACHE_KIB
from storage.fork_boundary import MESSAGE_FIELDS
from storage.fork_child import build_child
from storage.fork_memo import ForkMemo
from storage.fork_snapshot import (
    JSON_VERSION,
    SNAPSHOT_VERSION,
    Frozen,
    encode_snapshot,
    load_snapshot,
    pack_snapshot,
    sha256_hex,
)
from storage.sqlite import dumps
from storage.store import Store

pytestmark = pytest.mark.timeout(60)


def _source(store: Store) -> tuple[str, str]:
    """Two Turns with a payload reference, a non-empty payload and a Session-level Message
    (no Turn) between them: the boundary must skip it and keep each Turn's own Messages."""
    sid = new_session(store)
    first = settled_turn(store, sid, text="one", extra=[("reasoning", "think", {"k": [1, "é"]})])
    store.history.append_message(WS, sid, None, kind="notice", text="session-level")
    user = first.messages[0].message_id
    second = settled_turn(
        store, sid, text="two", extra=[("tool_call", "call", {"replyToMessageId": user})]
    )
    return sid, second.turn_id


def _stored(store: Store, op_id: str) -> tuple[Frozen, str]:
    row = (
        store.db.connection()
        .execute(
            "SELECT s.snapshot_json, o.snapshot_hash FROM fork_operations o JOIN fork_snapshots s"
            " USING (op_seq) WHERE o.operation_id = ?",
            (op_id,),
        )
        .fetchone()
    )
    assert row is not None
    return row[0], str(row[1])


def _restore(store: Store, op_id: str, frozen: Frozen) -> str:
    """Store `frozen` as this operation's snapshot, as an older build would have: its hash on
    the operation row, its bytes in `fork_snapshots`. Returns the hash."""
    digest = sha256_hex(frozen)
    conn = store.db.connection()
    conn.execute(
        "UPDATE fork_operations SET snapshot_hash = ? WHERE operation_id = ?", (digest, op_id)
    )
    conn.execute(
        "UPDATE fork_snapshots SET snapshot_json = ? WHERE op_seq ="
        " (SELECT op_seq FROM fork_operations WHERE operation_id = ?)",
        (frozen, op_id),
    )
    return digest


def _forget(store: Store) -> None:
    """As after a restart: the store holds nothing prepare froze or a read projected."""
    store.db.fork_memo = ForkMemo()
    store.db.projections.clear()


def _as_v2(document: dict[str, Any]) -> str:
    """The document as a build before MessagePack froze it: canonical JSON text, version 2."""
    return encode_snapshot({**document, "version": JSON_VERSION})


def _as_v1(document: dict[str, Any]) -> dict[str, Any]:
    """The document as a build before issue 20 froze it: Messages as objects, version 1."""
    v1 = {k: v for k, v in document.items() if k != "message_fields"}
    v1["version"] = 1
    v1["turns"] = [
        {**t, "messages": [dict(zip(MESSAGE_FIELDS, m, strict=True)) for m in t["messages"]]}
        for t in document["turns"]
    ]
    return v1


def test_a_new_snapshot_is_v3_messagepack_with_message_arrays_and_round_trips_exactly(
    store: Store,
) -> None:
    sid, last = _source(store)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
    text, digest = _stored(store, op.operation_id)
    assert isinstance(text, bytes)  # a BLOB, not JSON text
    assert sha256_hex(text) == digest
    raw = msgpack.unpackb(text, raw=False)
    assert raw["version"] == SNAPSHOT_VERSION == 3
    assert raw["message_fields"] == list(MESSAGE_FIELDS)
    messages = [m for t in raw["turns"] for m in t["messages"]]
    assert all(isinstance(m, list) and len(m) == len(MESSAGE_FIELDS) for m in messages)
    source = [m for t in store.history.timeline(WS, sid, limit=10)[0] for m in t.messages]
    # Every Turn's Messages in order, the Session-level one left out.
    assert [m[0] for m in messages] == [m.message_id for m in source]
    assert "session-level" not in [m[2] for m in messages]
    assert [m[3] for m in messages] == [m.payload for m in source]
    # The loaded document packs to the same bytes (so it is the document prepare froze).
    loaded = load_snapshot(text, digest)
    assert loaded == raw
    assert pack_snapshot(loaded) == text


@pytest.mark.parametrize("version", [1, 2])
def test_a_snapshot_stored_by_an_older_build_commits_the_same_child(
    store: Store, version: int
) -> None:
    sid, last = _source(store)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
    text, digest = _stored(store, op.operation_id)
    v3 = load_snapshot(text, digest)
    # What an older build stored for this operation (the same content, hashed as written): the
    # row an operation prepared before an upgrade still holds. v1: Messages as objects.
    old = dumps(_as_v1(v3)) if version == 1 else _as_v2(v3)
    assert isinstance(old, str) and ('"message_id":' in old) == (version == 1)
    old_hash = _restore(store, op.operation_id, old)
    _forget(store)
    loaded = load_snapshot(old, old_hash)
    assert loaded["version"] == version and loaded["turns"] == v3["turns"]

    def plan(document: dict[str, Any]) -> Any:
        return build_child(
            document,
            child_provider_session_id="c",
            binding_mode="host_copy",
            turn_bindings=None,
            committed_at_ms=7,
        )

    assert plan(loaded) == plan(v3)

    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed and committed.status.value == "committed"
    child = store.history.timeline(WS, committed.target_session_id, limit=10)[0]
    source = store.history.timeline(WS, sid, limit=10)[0]
    assert [[(m.kind, m.text) for m in t.messages] for t in child] == [
        [(m.kind, m.text) for m in t.messages] for t in source
    ]
    # The payload reference points at the child's own copy of the user Message.
    assert child[1].messages[1].payload == {"replyToMessageId": child[0].messages[0].message_id}
    assert child[0].messages[1].payload == {"k": [1, "é"]}
    # A reader in a fresh process projects the committed child from the old bytes alone.
    _forget(store)
    assert store.fork_queries.get_fork_operation(WS, op.operation_id) == committed


def test_a_payload_messagepack_cannot_hold_is_frozen_as_v2_json_and_commits(store: Store) -> None:
    sid = new_session(store)
    huge = 2**70  # JSON holds it; MessagePack's integers end at 64 bits
    turn = settled_turn(store, sid, text="one", extra=[("tool_call", "call", {"n": huge})])
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn.turn_id))
    text, digest = _stored(store, op.operation_id)
    assert isinstance(text, str) and json.loads(text)["version"] == JSON_VERSION
    assert sha256_hex(text) == digest
    _forget(store)  # the commit decodes the stored text, as after a restart
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    child = store.history.timeline(WS, committed.target_session_id, limit=10)[0]
    assert child[0].messages[1].payload == {"n": huge}


def _json(document: Any) -> Frozen:
    return dumps(document)


def _packed(document: Any) -> Frozen:
    return msgpack.packb(document, use_bin_type=True)


@pytest.mark.parametrize(
    ("encode", "document", "why"),
    [
        (_json, {"version": 3, "turns": []}, "unsupported snapshot version 3"),  # v3 is packed
        (_json, {"version": 2, "turns": []}, "unsupported snapshot version 2"),  # no fields
        (_json, {"version": 1, "turns": [{"messages": [{"message_id": "m"}]}]}, "malformed v1"),
        (_json, [1, 2], "not a map"),
        (_packed, {"version": 2, "message_fields": list(MESSAGE_FIELDS)}, "version 2"),
        (_packed, {"version": 1, "turns": []}, "unsupported snapshot version 1"),
        (_packed, {"version": 4, "message_fields": list(MESSAGE_FIELDS)}, "version 4"),
        (_packed, [1, 2], "not a map"),
    ],
)
def test_a_snapshot_of_no_known_shape_fails_closed(encode: Any, document: Any, why: str) -> None:
    frozen = encode(document)
    with pytest.raises(ForkSnapshotCorrupt, match=why):
        load_snapshot(frozen, sha256_hex(frozen))


def test_bytes_that_do_not_decode_fail_closed() -> None:
    for frozen in (b"\xc1", _packed({"version": 3}) + b"\x00", "{not json"):
        with pytest.raises(ForkSnapshotCorrupt, match="does not decode"):
            load_snapshot(frozen, sha256_hex(frozen))
    with pytest.raises(ForkSnapshotCorrupt, match="does not match its hash"):
        load_snapshot(b"\x80", sha256_hex(b"\x81"))


def test_the_writer_connection_has_the_bigger_page_cache(store: Store) -> None:
    row = store.db._writer_connection().execute("PRAGMA cache_size").fetchone()
    assert row is not None and row[0] == -WRITER_CACHE_KIB
    # Readers keep SQLite's default: the bigger cache is for the one connection that writes.
    with store.db.read() as conn:
        row = conn.execute("PRAGMA cache_size").fetchone()
    assert row is not None and row[0] != -WRITER_CACHE_KIB
