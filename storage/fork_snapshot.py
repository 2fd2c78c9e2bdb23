"""The immutable snapshot frozen at prepare: canonical JSON (sorted keys) hashed with SHA-256
(law 5); commit and the committed projection read only it (and the operation row), never the
live source. The documents this process froze are kept by hash for its own commit.

Version 2 (issue 20) writes each Message as a compact array in `MESSAGE_FIELDS` order instead
of an object: a 1,000-Turn / 10,000-Message snapshot is ~23 % smaller, and neither prepare nor
the decode sorts and writes (or reads) ten thousand objects' keys. Version 1 snapshots stored by
older builds still load: `load_snapshot` verifies their bytes' hash as stored, then turns their
Message objects into the same arrays, so everything past it reads one shape."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from storage.errors import (
    ForkSnapshotCorrupt,
)
from storage.fork_boundary import MESSAGE_FIELDS, RESUME_CURSOR_KEY, Boundary
from storage.models import (
    Session,
)
from storage.sqlite import dumps

SNAPSHOT_VERSION = 2
# The versions `load_snapshot` reads: 1 (Messages as objects) is what builds before issue 20
# froze; an operation prepared by one may still be committed or read by this build.
READABLE_VERSIONS = (1, 2)

# `dumps`'s canonical form (sorted keys, no whitespace, UTF-8 kept) without the per-container
# cycle check: a snapshot is built from fresh containers and parsed JSON, never cyclic, and the
# check costs an id-keyed dict insert and delete per object and array (~20,000 at 10,000
# Messages). Same output as `dumps` for every acyclic value.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def encode_snapshot(document: Mapping[str, Any]) -> str:
    """The canonical JSON text of a snapshot document (the bytes that are hashed)."""
    return _ENCODER.encode(document)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_hash(source: str, target: str, point_kind: str, turn_id: str) -> str:
    """Law 6: the identity of a fork request (what `requestId` must keep meaning)."""
    return sha256_hex(
        dumps({"point_kind": point_kind, "source": source, "target": target, "turn_id": turn_id})
    )


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
) -> tuple[dict[str, Any], str, str]:
    """Build the snapshot document; returns (document, canonical JSON, SHA-256 hex)."""
    assert source.provider_session_id is not None
    settings = runtime_identity.get("settings", source.settings)
    context = runtime_identity.get("runtime_context", source.runtime_context)
    document = {
        "version": SNAPSHOT_VERSION,
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
    text = encode_snapshot(document)
    digest = sha256_hex(text)
    _remember_frozen(digest, document, len(text))
    return document, text, digest


# The documents prepare froze, by hash, for the commit of the same operation in this process:
# the commit still reads and hashes the stored bytes (law 2), but a hash match means those bytes
# are exactly `encode_snapshot(document)`, whose parse equals `document` — so a 1,000-Turn
# commit skips a second decode of its multi-MB snapshot. Bounded by text size; a miss (another
# process, after a restart, evicted) decodes as before. Taken once: the commit is the only
# consumer, and no reader can mutate a document another reader holds.
_FROZEN_BUDGET_CHARS = 8_000_000
_FROZEN: OrderedDict[str, tuple[dict[str, Any], int]] = OrderedDict()
_FROZEN_LOCK = threading.Lock()


def _remember_frozen(digest: str, document: dict[str, Any], size: int) -> None:
    if size > _FROZEN_BUDGET_CHARS:
        return
    with _FROZEN_LOCK:
        _FROZEN[digest] = (document, size)
        total = sum(n for _, n in _FROZEN.values())
        while total > _FROZEN_BUDGET_CHARS:
            _, (_, n) = _FROZEN.popitem(last=False)
            total -= n


def take_frozen_snapshot(text: str, expected_hash: str) -> dict[str, Any]:
    """`load_snapshot` for a commit: the stored bytes are hashed and must match; their parse is
    the document prepare froze when this process still holds it, else decoded."""
    if sha256_hex(text) != expected_hash:
        raise ForkSnapshotCorrupt("fork snapshot does not match its hash")
    with _FROZEN_LOCK:
        held = _FROZEN.pop(expected_hash, None)
    if held is None:
        return load_snapshot(text, expected_hash)
    return dict(held[0])


def load_snapshot(text: str, expected_hash: str) -> dict[str, Any]:
    """Parse a stored snapshot, refusing one whose bytes no longer match the frozen hash."""
    if sha256_hex(text) != expected_hash:
        raise ForkSnapshotCorrupt("fork snapshot does not match its hash")
    document = json.loads(text)
    if not isinstance(document, dict):
        raise ForkSnapshotCorrupt("fork snapshot is not a JSON object")
    version = document.get("version")
    if version == 1:
        return _upgrade_v1(document)
    if version != SNAPSHOT_VERSION or document.get("message_fields") != list(MESSAGE_FIELDS):
        raise ForkSnapshotCorrupt(f"unsupported snapshot version {version!r}")
    return document


def _upgrade_v1(document: dict[str, Any]) -> dict[str, Any]:
    """A v1 document (Messages as objects, stored by a build before issue 20) in the v2 shape
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
