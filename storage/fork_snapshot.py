"""The immutable snapshot frozen at prepare: canonical JSON (sorted keys) hashed with SHA-256
(law 5); commit and the committed projection read only it (and the operation row), never the
live source. The documents this process froze are kept by hash for its own commit."""

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
from storage.fork_boundary import RESUME_CURSOR_KEY, Boundary
from storage.models import (
    Session,
)
from storage.sqlite import dumps

SNAPSHOT_VERSION = 1


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
    text = dumps(document)
    digest = sha256_hex(text)
    _remember_frozen(digest, document, len(text))
    return document, text, digest


# The documents prepare froze, by hash, for the commit of the same operation in this process:
# the commit still reads and hashes the stored bytes (law 2), but a hash match means those bytes
# are exactly `dumps(document)`, whose parse equals `document` — so a 1,000-Turn commit skips a
# second decode of its multi-MB snapshot. Bounded by text size; a miss (another process, after a
# restart, evicted) decodes as before. Taken once: the commit is the only consumer, and no
# reader can mutate a document another reader holds.
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
    if document.get("version") != SNAPSHOT_VERSION:
        raise ForkSnapshotCorrupt(f"unsupported snapshot version {document.get('version')!r}")
    return dict(document)
