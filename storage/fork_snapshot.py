"""The immutable snapshot frozen at prepare, hashed with SHA-256 over its stored bytes (law 5);
commit and the committed projection read only it (and the operation row) — and, for a version
4 or 5 snapshot, the source's boundary Messages, once the commit has re-proved them against the
count and digest the snapshot froze (storage/history_links.py). The documents this process froze are
kept by hash for its own commit.

Version 5 (what prepare freezes) is MessagePack bytes (a BLOB) whose Turns carry no Messages: a
`history` map holds their count, digest, the payloads holding a reference (rewritten) and the
child ids of the Messages a reference names; each Turn is stored as an array of its values in
`TURN_FIELDS` order (named once, in `turn_fields`), and read back into the map version 4 stored
(its keys were ~60 % of a Turn's bytes). In memory every version's Turns are maps. Version 4 was
the same document with each Turn stored as that map; version 3 the same bytes with every Message
of the boundary a compact array in its Turn (`MESSAGE_FIELDS` order); version 2 canonical JSON
text (sorted keys, no whitespace) of that shape, version 1 the same with Messages as objects. All
are still read: an operation prepared by an older build may be committed or projected by this
one. A document MessagePack cannot hold (an integer beyond 64 bits, which JSON allows) is frozen
as JSON text instead — version 2 for a version 3 document, versions 4 and 5 keep their number;
the stored value's type says which encoding it is."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from operator import itemgetter
from typing import Any

import apsw
import msgpack

from domain.errors import (
    ForkSnapshotCorrupt,
)
from storage.fork_boundary import MESSAGE_FIELDS, RESUME_CURSOR_KEY, TURN_FIELDS, Boundary
from storage.fork_child import ForkMemo
from storage.models import (
    Session,
)
from storage.sqlite import dumps

SNAPSHOT_VERSION = 5
# Version 4: the same document with each Turn stored as a map (what builds before version 5 froze).
MAP_TURNS_VERSION = 4
# The versions whose Messages stay in SQLite (a `history` map says what the commit needs).
HISTORY_VERSIONS = (MAP_TURNS_VERSION, SNAPSHOT_VERSION)
# Version 3: the same MessagePack document with every Message of the boundary in its Turn.
MESSAGES_VERSION = 3
# The version of the JSON text form: what builds before MessagePack froze, and what this one
# freezes for a document MessagePack cannot hold.
JSON_VERSION = 2
# The versions `load_snapshot` reads: 1 (Messages as objects), 2 (canonical JSON) and 3
# (MessagePack, Messages inside) are still found in stores written by older builds; their
# operations may still be committed or read.
READABLE_VERSIONS = (1, 2, 3, 4, 5)

# What a version 4 or 5 document's `history` holds (storage/history_links.py `history_section`).
HISTORY_KEYS = frozenset({"through", "count", "digest", "rewritten", "message_ids"})

Frozen = str | bytes
"""A stored snapshot: version 3 MessagePack bytes, or version 1 / 2 JSON text."""

# `dumps`'s canonical form (sorted keys, no whitespace, UTF-8 kept) without the per-container
# cycle check: a snapshot is built from fresh containers and parsed JSON, never cyclic, and the
# check costs an id-keyed dict insert and delete per object and array (~20,000 at 10,000
# Messages). Same output as `dumps` for every acyclic value.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def encode_snapshot(document: Mapping[str, Any]) -> str:
    """The canonical JSON text of a snapshot document (version 1 and 2; hashed as UTF-8)."""
    return _ENCODER.encode(document)


def pack_snapshot(document: Mapping[str, Any]) -> bytes:
    """The MessagePack bytes of a snapshot document (the bytes that are hashed): version 5's
    Turns as arrays (`stored_form`). Maps keep the document's own order, which prepare builds
    the same way every time; nothing re-encodes a document to compare it, the stored bytes are
    what the hash covers."""
    packed: bytes = msgpack.packb(stored_form(document), use_bin_type=True)
    return packed


_TURN_VALUES = itemgetter(*TURN_FIELDS)


def stored_form(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """What is encoded for `document`: a version 5 document with each Turn as the tuple of its
    `TURN_FIELDS` values (a tuple encodes as an array); any other document as it is."""
    if document.get("version") != SNAPSHOT_VERSION:
        return document
    turns = document["turns"]
    try:
        compact = [_TURN_VALUES(t) for t in turns]
    except KeyError:  # a Turn built elsewhere without a final position: None, as prepare's
        compact = [tuple(t.get(f) for f in TURN_FIELDS) for t in turns]
    return {**document, "turns": compact}


def _expand_turns(document: dict[str, Any]) -> dict[str, Any]:
    """A decoded version 5 document with its Turns as maps again (the in-memory shape of every
    version); a Turn that is not an array of `turn_fields`' length fails closed."""
    if document.get("turn_fields") != list(TURN_FIELDS):
        raise ForkSnapshotCorrupt("version 5 fork snapshot does not name its Turn fields")
    try:
        turns = [dict(zip(TURN_FIELDS, t, strict=True)) for t in document["turns"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ForkSnapshotCorrupt(f"malformed version 5 Turns: {exc!r}") from exc
    return {**document, "turns": turns}


def sha256_hex(frozen: Frozen) -> str:
    data = frozen.encode("utf-8") if isinstance(frozen, str) else frozen
    return hashlib.sha256(data).hexdigest()


def request_hash(
    source: str, target: str, point_kind: str, turn_id: str, workspace: str = "shared"
) -> str:
    """Law 6: the identity of a fork request (what `requestId` must keep meaning). The
    workspace mode is part of it; `shared` (the default) hashes as before it existed, so
    stored operations keep their identity."""
    identity = {"point_kind": point_kind, "source": source, "target": target, "turn_id": turn_id}
    if workspace != "shared":
        identity["workspace"] = workspace
    return sha256_hex(dumps(identity))


# -- freezing ---------------------------------------------------------------------------------


def child_runtime_context(
    runtime_context: Mapping[str, Any], source_provider_session_id: str
) -> dict[str, Any]:
    """Drop a resume cursor that points back into the source provider session (seed 000 §5)."""
    context = dict(runtime_context)
    cursor = context.get(RESUME_CURSOR_KEY)
    if cursor == source_provider_session_id or (
        isinstance(cursor, Mapping) and cursor.get("resume") == source_provider_session_id
    ):
        del context[RESUME_CURSOR_KEY]
    return context


def freeze_snapshot(
    *,
    operation_id: str,
    workspace_id: str,
    source: Session,
    target_session_id: str,
    target_title: str,
    point_kind: str,
    boundary: Boundary,
    runtime_identity: Mapping[str, Any],
    memo: ForkMemo | None = None,
    history: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], Frozen, str]:
    """Build the snapshot document; returns (document, its stored form, SHA-256 hex).
    With `history` (storage/history_links.py `history_section`) it is a version 5 document whose
    Turns carry no Messages; without, version 3 with every Message in its Turn."""
    assert source.provider_session_id is not None
    settings = runtime_identity.get("settings", source.settings)
    context = runtime_identity.get("runtime_context", source.runtime_context)
    document: dict[str, Any] = {
        "version": MESSAGES_VERSION if history is None else SNAPSHOT_VERSION,
        "message_fields": list(MESSAGE_FIELDS),
        "operation_id": operation_id,
        "workspace_id": workspace_id,
        "point": {"kind": point_kind, "turn_id": boundary.selected["turn_id"]},
        "source": {
            "session_id": source.session_id,
            "provider": source.provider,
            "provider_session_id": source.provider_session_id,
            "title": source.title,
        },
        "target": {
            "session_id": target_session_id,
            "title": target_title,
            "provider": source.provider,
            "model": source.model,
            "cwd": str(runtime_identity.get("cwd", source.cwd)),
            "settings": dict(settings),
            "runtime_context": child_runtime_context(context, source.provider_session_id),
            "rail_placement": source.rail_placement,
            "visibility": source.visibility,
        },
        "provider_turn_ids": list(boundary.provider_turn_ids),
        "turns": boundary.turns,
    }
    if history is not None:
        document["turn_fields"] = list(TURN_FIELDS)
        document["history"] = dict(history)
    frozen: Frozen
    try:
        frozen = pack_snapshot(document)
    except (OverflowError, TypeError, ValueError):
        # E.g. a payload's integer beyond 64 bits: JSON holds it, MessagePack cannot. A version
        # 5 document keeps its version (its shape says how to commit it); the text type says JSON.
        if history is None:
            document["version"] = JSON_VERSION
        frozen = encode_snapshot(stored_form(document))
    digest = sha256_hex(frozen)
    if memo is not None:
        memo.remember_frozen(digest, document, len(frozen))
    return document, frozen, digest


def take_frozen_snapshot(
    text: Frozen, expected_hash: str, memo: ForkMemo | None = None
) -> dict[str, Any]:
    """`load_snapshot` for a commit: the stored bytes are hashed and must match; their parse is
    the document prepare froze when the store's `memo` still holds it (a hash match means the
    bytes are exactly its encoding, whose decode equals it), else decoded."""
    if sha256_hex(text) != expected_hash:
        raise ForkSnapshotCorrupt("fork snapshot does not match its hash")
    held = None if memo is None else memo.take_frozen(expected_hash)
    if held is None:
        return load_snapshot(text, expected_hash)
    return dict(held)


# The stored value as its bytes and its type: a text value whose bytes are not UTF-8 (a damaged
# store) is then a corrupt snapshot, not a decode error inside SQLite's driver.
_FROZEN_SELECT = (
    "SELECT CAST(snapshot_json AS BLOB), typeof(snapshot_json) FROM fork_snapshots WHERE op_seq = ?"
)


def read_frozen(conn: apsw.Connection, op_seq: int) -> Frozen:
    """The stored snapshot of operation `op_seq`, as `load_snapshot` takes it."""
    row = conn.execute(_FROZEN_SELECT, (op_seq,)).fetchone()
    if row is None:
        raise ForkSnapshotCorrupt("fork snapshot row is missing")
    data, kind = row
    if kind == "blob":
        return bytes(data)
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ForkSnapshotCorrupt(f"fork snapshot text is not UTF-8: {exc}") from exc


def decode_frozen(frozen: Frozen) -> Any:
    """The stored value decoded by its type (bytes: MessagePack, text: JSON), unchecked: what
    `load_snapshot` verifies and reads (tools that inspect a store use it as it is)."""
    return msgpack.unpackb(frozen, raw=False) if isinstance(frozen, bytes) else json.loads(frozen)


def load_snapshot(text: Frozen, expected_hash: str) -> dict[str, Any]:
    """Parse a stored snapshot, refusing one whose bytes no longer match the frozen hash."""
    if sha256_hex(text) != expected_hash:
        raise ForkSnapshotCorrupt("fork snapshot does not match its hash")
    packed = isinstance(text, bytes)
    try:
        document = decode_frozen(text)
    except ValueError as exc:  # msgpack's and json's decode errors are ValueErrors
        raise ForkSnapshotCorrupt(f"fork snapshot does not decode: {exc}") from exc
    if not isinstance(document, dict):
        raise ForkSnapshotCorrupt("fork snapshot is not a map")
    version = document.get("version")
    if version in HISTORY_VERSIONS:
        history = document.get("history")
        if not isinstance(history, dict) or not history.keys() >= HISTORY_KEYS:
            raise ForkSnapshotCorrupt(f"version {version} fork snapshot has no well-formed history")
    if version == 1 and not packed:
        return _upgrade_v1(document)
    expected = (MESSAGES_VERSION if packed else JSON_VERSION, *HISTORY_VERSIONS)
    if version not in expected or document.get("message_fields") != list(MESSAGE_FIELDS):
        raise ForkSnapshotCorrupt(f"unsupported snapshot version {version!r}")
    if version == SNAPSHOT_VERSION:
        return _expand_turns(document)
    return document


def _upgrade_v1(document: dict[str, Any]) -> dict[str, Any]:
    """A v1 document (Messages as objects, stored by an older build) in the v2 shape
    the child is built from. Only the in-memory form changes: the stored bytes and their hash
    stay as frozen, and the child built from either shape is the same."""
    try:
        turns = [
            {
                **turn,
                "messages": [[m[f] for f in MESSAGE_FIELDS] for m in turn["messages"]],
            }
            for turn in document["turns"]
        ]
    except (KeyError, TypeError) as exc:
        raise ForkSnapshotCorrupt(f"malformed v1 snapshot: {exc!r}") from exc
    # `version` stays 1: the document says what was stored; only its Messages changed shape.
    return {**document, "message_fields": list(MESSAGE_FIELDS), "turns": turns}
