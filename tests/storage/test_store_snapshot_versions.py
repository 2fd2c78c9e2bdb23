"""Snapshot versions: v5 freezes the document as MessagePack bytes with the Turns (each an array
of its `TURN_FIELDS` values) and Interactions but no Message (the boundary's Messages are
counted, digested and read by the child through a link in SQLite: storage/history_links.py); the
v4 (the same with each Turn a map), v3 (MessagePack, Messages as compact arrays), v2 (canonical
JSON, Messages as arrays) and v1 (Messages as objects) snapshots older builds stored still commit
and project the same child.

A v5 snapshot's bytes unpack to the document prepare froze (its Turns read back into maps) and
pack back to the same bytes; a v5 document MessagePack cannot hold (an integer beyond 64 bits in
an Interaction) is frozen as JSON text, still version 5; a v2 one is canonical JSON (sorted keys,
no whitespace); a v1 snapshot (as the oldest builds wrote, e.g. the operations of
`fixtures/store_v4.sqlite3.gz`) is read into the same shape, so the child built from any of v1–v4
is the same.
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
from storage.fork_child import ForkMemo, build_child
from storage.fork_snapshot import (
    JSON_VERSION,
    MAP_TURNS_VERSION,
    MESSAGE_FIELDS,
    MESSAGES_VERSION,
    SNAPSHOT_VERSION,
    TURN_FIELDS,
    Frozen,
    encode_snapshot,
    load_boundary,
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
    """The document as the oldest builds froze it: Messages as objects, version 1."""
    v1 = {k: v for k, v in document.items() if k != "message_fields"}
    v1["version"] = 1
    v1["turns"] = [
        {**t, "messages": [dict(zip(MESSAGE_FIELDS, m, strict=True)) for m in t["messages"]]}
        for t in document["turns"]
    ]
    return v1


def _as_v4(document: dict[str, Any]) -> dict[str, Any]:
    """The document as a build before version 5 froze it: each Turn a map, no `turn_fields`."""
    v4 = {k: v for k, v in document.items() if k != "turn_fields"}
    v4["version"] = MAP_TURNS_VERSION
    v4["turns"] = [dict(zip(TURN_FIELDS, t, strict=True)) for t in document["turns"]]
    return v4


def _as_v3(store: Store, sid: str, document: dict[str, Any]) -> dict[str, Any]:
    """The same operation's document as a build before version 4 froze it: every Message of
    the boundary in its Turn (read from the unchanged source), no `history`, version 3."""
    with store.db.read() as conn:
        boundary = load_boundary(conn, WS, sid, document["point"]["turn_id"])
    v3 = {k: v for k, v in document.items() if k not in ("history", "turn_fields")}
    v3["version"] = MESSAGES_VERSION
    v3["turns"] = boundary.turns
    return v3


def test_a_new_snapshot_is_v5_messagepack_with_array_turns_and_round_trips_exactly(
    store: Store,
) -> None:
    sid, last = _source(store)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
    text, digest = _stored(store, op.operation_id)
    assert isinstance(text, bytes)  # a BLOB, not JSON text
    assert sha256_hex(text) == digest
    raw = msgpack.unpackb(text, raw=False)
    assert raw["version"] == SNAPSHOT_VERSION == 5
    assert raw["message_fields"] == list(MESSAGE_FIELDS)
    assert raw["turn_fields"] == list(TURN_FIELDS)
    # Each Turn an array of its values, no Message among them, no key stored per Turn.
    assert [len(t) for t in raw["turns"]] == [len(TURN_FIELDS)] * 2
    first, second = (dict(zip(TURN_FIELDS, t, strict=True)) for t in raw["turns"])
    assert (first["sequence"], second["sequence"]) == (1, 2)
    # The final assistant Message of each Turn frozen by its position in the boundary.
    finals = [t.final_assistant_message_id for t in store.history.timeline(WS, sid, limit=10)[0]]
    positions = {
        m.message_id: m.position
        for t in store.history.timeline(WS, sid, limit=10)[0]
        for m in t.messages
    }
    assert [first["final_assistant_position"], second["final_assistant_position"]] == [
        positions[f] for f in finals
    ]
    source = [m for t in store.history.timeline(WS, sid, limit=10)[0] for m in t.messages]
    history = raw["history"]
    # Every Turn's Message counted, the Session-level one left out; the one payload holding an
    # allowlisted reference frozen rewritten (to rule v2's id of the user Message, position 0).
    assert history["count"] == len(source)
    assert history["through"] == 2
    user = source[0]
    assert list(history["message_ids"]) == [user.message_id]
    child_user = history["message_ids"][user.message_id]
    assert child_user.endswith(f"-{user.position:012x}")
    tool = next(m for m in source if m.kind == "tool_call")
    assert history["rewritten"] == [[tool.position, dumps({"replyToMessageId": child_user})]]
    # The loaded document (its Turns the `TURN_FIELDS` arrays, as prepare built them) packs to the
    # same bytes (so it is the document prepare froze).
    loaded = load_snapshot(text, digest)
    assert {k: v for k, v in loaded.items() if k != "turns"} == {
        k: v for k, v in raw.items() if k != "turns"
    }
    assert loaded["turns"] == raw["turns"]
    assert pack_snapshot(loaded) == text
    # Version 5's Turns are the smaller: the same document with each Turn a map is longer.
    assert len(msgpack.packb(_as_v4(loaded), use_bin_type=True)) > len(text)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_snapshot_stored_by_an_older_build_commits_the_same_child(
    store: Store, version: int
) -> None:
    sid, last = _source(store)
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, last))
    text, digest = _stored(store, op.operation_id)
    current = load_snapshot(text, digest)
    v3 = _as_v3(store, sid, current)
    # What an older build stored for this operation (the same content, hashed as written): the
    # row an operation prepared before an upgrade still holds. v1: Messages as objects; v4: the
    # Messages in SQLite, each Turn a map.
    old: Frozen
    if version == 4:
        v4 = _as_v4(current)
        old = msgpack.packb(v4, use_bin_type=True)
        assert pack_snapshot(v4) == old  # only version 5 stores its Turns as arrays
        old_hash = _restore(store, op.operation_id, old)
        _forget(store)
        loaded = load_snapshot(old, old_hash)
        assert isinstance(msgpack.unpackb(old)["turns"][0], dict)
        # Read back into the arrays every version 4 and 5 Turn is held as in memory.
        assert {k: v for k, v in loaded.items() if k != "turns"} == {
            k: v for k, v in v4.items() if k != "turns"
        }
        assert loaded["turns"] == current["turns"]
        v3 = current  # the child below is the one the version 5 document builds
    elif version == 3:
        old = pack_snapshot(v3)
    else:
        old = dumps(_as_v1(v3)) if version == 1 else _as_v2(v3)
        assert isinstance(old, str) and ('"message_id":' in old) == (version == 1)
    if version != 4:
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


def test_a_message_payload_messagepack_cannot_hold_stays_in_sqlite_and_commits(
    store: Store,
) -> None:
    sid = new_session(store)
    huge = 2**70  # JSON holds it; MessagePack's integers end at 64 bits
    turn = settled_turn(store, sid, text="one", extra=[("tool_call", "call", {"n": huge})])
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn.turn_id))
    text, _ = _stored(store, op.operation_id)
    assert isinstance(text, bytes)  # the Message is not in the snapshot: nothing to fall back for
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    child = store.history.timeline(WS, committed.target_session_id, limit=10)[0]
    assert child[0].messages[1].payload == {"n": huge}


def test_an_interaction_messagepack_cannot_hold_is_frozen_as_v4_json_and_commits(
    store: Store,
) -> None:
    sid = new_session(store)
    huge = 2**70
    turn, _ = store.turns.claim_submit(WS, sid, "r-1", "one")
    store.turns.bind_provider_turn(WS, sid, turn.turn_id, "pt-1", None)
    store.history.open_interaction(
        WS, sid, turn.turn_id, request_id="q-1", kind="approval", input={"n": huge}
    )
    store.history.resolve_interaction(WS, sid, turn.turn_id, "q-1", {"ok": True})
    reply = store.history.append_message(WS, sid, turn.turn_id, kind="assistant", text="done")
    store.turns.settle_turn(
        WS, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
    )
    op, _ = store.fork_prepare.prepare_fork(WS, request(sid, turn.turn_id))
    text, digest = _stored(store, op.operation_id)
    assert isinstance(text, str) and json.loads(text)["version"] == SNAPSHOT_VERSION
    assert sha256_hex(text) == digest
    _forget(store)  # the commit decodes the stored text, as after a restart
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(WS, op.operation_id, evidence(op))
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    row = (
        store.db.connection()
        .execute(
            "SELECT input_json FROM interactions WHERE workspace_id = ? AND session_id = ?",
            (WS, committed.target_session_id),
        )
        .fetchone()
    )
    assert row is not None and json.loads(row[0]) == {"n": huge}
    child = store.history.timeline(WS, committed.target_session_id, limit=10)[0]
    assert [m.text for m in child[0].messages] == ["one", "done"]


def _json(document: Any) -> Frozen:
    return dumps(document)


def _packed(document: Any) -> Frozen:
    return msgpack.packb(document, use_bin_type=True)


def _v5(**changes: Any) -> dict[str, Any]:
    """A version 5 document well formed but for `changes`."""
    history = {"through": 1, "count": 0, "digest": "", "rewritten": [], "message_ids": {}}
    document = {
        "version": 5,
        "message_fields": list(MESSAGE_FIELDS),
        "turn_fields": list(TURN_FIELDS),
        "turns": [],
        "history": history,
    }
    return {**document, **changes}


@pytest.mark.parametrize(
    ("encode", "document", "why"),
    [
        (_json, {"version": 3, "turns": []}, "unsupported snapshot version 3"),  # v3 is packed
        (_json, {"version": 2, "turns": []}, "unsupported snapshot version 2"),  # no fields
        (_json, {"version": 1, "turns": [{"messages": [{"message_id": "m"}]}]}, "malformed v1"),
        (_json, [1, 2], "not a map"),
        (_packed, {"version": 2, "message_fields": list(MESSAGE_FIELDS)}, "version 2"),
        (_packed, {"version": 1, "turns": []}, "unsupported snapshot version 1"),
        (_packed, {"version": 6, "message_fields": list(MESSAGE_FIELDS)}, "version 6"),
        (_packed, {"version": 4, "message_fields": list(MESSAGE_FIELDS)}, "no well-formed"),
        (_packed, {"version": 5, "message_fields": list(MESSAGE_FIELDS)}, "no well-formed"),
        (_packed, _v5(turn_fields=list(TURN_FIELDS[:-1])), "does not name its Turn fields"),
        (_packed, _v5(turns=[["t", 1]]), "malformed version 5 Turns"),
        (_packed, _v5(turns=[{"turn_id": "t"}]), "malformed version 5 Turns"),
        (_json, _v5(turns=[list(range(len(TURN_FIELDS) + 1))]), "malformed version 5 Turns"),
        (_json, {"version": 4, "history": {"count": 1}}, "no well-formed"),
        (_packed, {**_v5(turns=[["t", 1]]), "version": 4}, "malformed version 4 Turns"),
        (_packed, {**_v5(turns={"t": 1}), "version": 4}, "malformed version 4 Turns"),
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
