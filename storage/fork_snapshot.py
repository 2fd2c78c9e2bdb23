"""The fork boundary checks, the immutable snapshot frozen at prepare, and the pure function
that turns a snapshot plus provider evidence into the canonical child (laws 4 and 5).

The snapshot is canonical JSON (sorted keys) hashed with SHA-256; commit and the committed
projection read only it (and the operation row), never the live source.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from domain.fork_states import ACTIVE_SQL
from storage.base import dumps
from storage.errors import (
    ForkBoundaryError,
    ForkBoundaryReason,
    ForkReferenceError,
    ForkReferenceReason,
    ForkSnapshotCorrupt,
)
from storage.fork_identity import (
    EntityKind,
    IdentityMap,
    build_identity_map,
    child_id,
    reject_duplicate_keys,
    remap_references,
)
from storage.models import (
    VERIFIABLE_PROVENANCE,
    InteractionStatus,
    Lineage,
    ProviderStateBindingMode,
    SequenceProvenance,
    Session,
    SessionKind,
    TurnOutcome,
    TurnPhase,
)

SNAPSHOT_VERSION = 1
# Message markers that the boundary must not contain (seed 000 §4, both fail closed today).
DESCENDANT_LANE_KIND = "descendant_lane"
DESCENDANT_LANE_KEY = "descendantLane"
ATTACHMENTS_KEY = "attachments"
SESSION_LOCAL_SCOPE = "session_local"
# A runtime-context resume cursor naming the source provider session must not cross the fork.
RESUME_CURSOR_KEY = "resumeCursor"


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_hash(source: str, target: str, point_kind: str, turn_id: str) -> str:
    """Law 6: the identity of a fork request (what `requestId` must keep meaning)."""
    return sha256_hex(
        dumps({"point_kind": point_kind, "source": source, "target": target, "turn_id": turn_id})
    )


# -- boundary checks ------------------------------------------------------------------------


def source_blockers(conn: apsw.Connection, ws: str, session: Session) -> list[ForkBoundaryReason]:
    """Quiescence of the source (seed 000 §4), in a fixed order; empty when forkable."""
    sid = session.session_id
    reasons: list[ForkBoundaryReason] = []
    if session.kind != SessionKind.ROOT:
        reasons.append(ForkBoundaryReason.SOURCE_NOT_ROOT)
    if not session.provider_session_id:
        reasons.append(ForkBoundaryReason.SOURCE_PROVIDER_SESSION_MISSING)
    # Most specific first: a pending Interaction or an unbound submit claim only exists while a
    # Turn is active, so checking the Turn first would hide those reasons.
    checks = (
        (
            ForkBoundaryReason.SOURCE_GOAL_CONTROL_ACTIVE,
            "SELECT 1 FROM goal_controls WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_RUNTIME_OPERATION_ACTIVE,
            "SELECT 1 FROM runtime_operations WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_INTERACTION_PENDING,
            "SELECT 1 FROM interactions WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'pending'",
        ),
        (
            ForkBoundaryReason.SOURCE_SUBMIT_CLAIM_ACTIVE,
            "SELECT 1 FROM submit_claims WHERE workspace_id = ? AND session_id = ?"
            " AND status = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_TURN_ACTIVE,
            "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ? AND phase = 'active'",
        ),
        (
            ForkBoundaryReason.SOURCE_FORK_ACTIVE,
            "SELECT 1 FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
            f" AND status IN {ACTIVE_SQL}",
        ),
    )
    for reason, sql in checks:
        if conn.execute(sql + " LIMIT 1", (ws, sid)).fetchone() is not None:
            reasons.append(reason)
    return reasons


@dataclass(frozen=True, slots=True)
class Boundary:
    """The source history through the selected Turn, as frozen into the snapshot."""

    turns: list[dict[str, Any]]
    provider_turn_ids: tuple[str, ...]
    selected: dict[str, Any]


def _parse_payload(text: str) -> Any:
    if text == "{}":  # most payloads: skip the parser (a 1,000-Turn boundary has ~10,000)
        return {}
    return json.loads(text, object_pairs_hook=reject_duplicate_keys)


def load_boundary(conn: apsw.Connection, ws: str, sid: str, turn_id: str) -> Boundary:
    """Read the through-Turn history (inclusive) and prove it forkable, else a boundary error."""
    selected = conn.execute(
        "SELECT sequence, phase FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND turn_id = ?",
        (ws, sid, turn_id),
    ).fetchone()
    if selected is None:
        raise ForkBoundaryError(ForkBoundaryReason.TURN_NOT_FOUND)
    if selected[1] != TurnPhase.SETTLED:
        raise ForkBoundaryError(ForkBoundaryReason.TURN_NOT_SETTLED)
    through = int(selected[0])
    turn_rows = conn.execute(
        "SELECT turn_id, sequence, sequence_provenance, phase, outcome, root_provider_turn_id,"
        " provider_turn_binding_json, final_assistant_message_id, error, created_at_ms,"
        " settled_at_ms FROM turns WHERE workspace_id = ? AND session_id = ? AND sequence <= ?"
        " ORDER BY sequence",
        (ws, sid, through),
    ).fetchall()
    turns: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for expected, r in enumerate(turn_rows, start=1):
        # Verifiable provenance: host-assigned and gap-free 1..n, so "through" means the same
        # prefix to the provider as to us.
        if r[2] not in VERIFIABLE_PROVENANCE or r[1] != expected:
            raise ForkBoundaryError(ForkBoundaryReason.TURN_SEQUENCE_UNVERIFIED)
        if not r[5]:
            raise ForkBoundaryError(ForkBoundaryReason.PROVIDER_TURN_MISSING)
        turn: dict[str, Any] = {
            "turn_id": r[0],
            "sequence": r[1],
            "sequence_provenance": r[2],
            "phase": r[3],
            "outcome": r[4],
            "root_provider_turn_id": r[5],
            "provider_turn_binding_json": r[6],
            "final_assistant_message_id": r[7],
            "error": r[8],
            "created_at_ms": r[9],
            "settled_at_ms": r[10],
            "messages": [],
            "interactions": [],
        }
        turns.append(turn)
        by_id[str(r[0])] = turn
    for r in conn.execute(
        "SELECT m.message_id, m.turn_id, m.kind, m.text, m.payload_json, m.version, m.position"
        " FROM messages m JOIN turns t ON t.workspace_id = m.workspace_id"
        " AND t.session_id = m.session_id AND t.turn_id = m.turn_id"
        " WHERE m.workspace_id = ? AND m.session_id = ? AND t.sequence <= ? ORDER BY m.position",
        (ws, sid, through),
    ):
        if r[2] == DESCENDANT_LANE_KIND:
            raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
        payload = _parse_payload(r[4])
        # Parsed JSON: an object is a plain dict (no ABC isinstance per Message), and the
        # common empty payload carries no marker.
        if type(payload) is dict and payload:
            if payload.get(DESCENDANT_LANE_KEY):
                raise ForkBoundaryError(ForkBoundaryReason.DESCENDANT_LANE_IN_BOUNDARY)
            if _has_session_local_attachment(payload):
                raise ForkBoundaryError(ForkBoundaryReason.SESSION_LOCAL_ATTACHMENT_IN_BOUNDARY)
        by_id[r[1]]["messages"].append(
            {
                "message_id": r[0],
                "kind": r[2],
                "text": r[3],
                "payload": payload,
                "version": r[5],
                "position": r[6],
            }
        )
    for r in conn.execute(
        "SELECT i.interaction_id, i.request_id, i.turn_id, i.kind, i.status, i.input_json,"
        " i.output_json FROM interactions i JOIN turns t ON t.workspace_id = i.workspace_id"
        " AND t.session_id = i.session_id AND t.turn_id = i.turn_id"
        " WHERE i.workspace_id = ? AND i.session_id = ? AND t.sequence <= ?"
        " ORDER BY t.sequence, i.created_at_ms, i.rowid",
        (ws, sid, through),
    ):
        by_id[r[2]]["interactions"].append(
            {
                "interaction_id": r[0],
                "request_id": r[1],
                "kind": r[3],
                "status": r[4],
                "input": _parse_payload(r[5]),
                "output": None if r[6] is None else _parse_payload(r[6]),
            }
        )
    return Boundary(
        turns=turns,
        provider_turn_ids=tuple(t["root_provider_turn_id"] for t in turns),
        selected=by_id[turn_id],
    )


def _has_session_local_attachment(payload: Any) -> bool:
    if not isinstance(payload, Mapping):
        return False
    attachments = payload.get(ATTACHMENTS_KEY)
    if not isinstance(attachments, list):
        return False
    return any(
        isinstance(a, Mapping) and a.get("scope") == SESSION_LOCAL_SCOPE for a in attachments
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


# -- the child ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """Every row of the canonical child, computed purely from snapshot + evidence."""

    session: Session
    lineage: Lineage
    ids: IdentityMap
    turn_rows: list[tuple[Any, ...]]
    message_rows: list[tuple[Any, ...]]
    interaction_rows: list[tuple[Any, ...]]


def identity_map_for(snapshot: Mapping[str, Any], snapshot_hash: str | None = None) -> IdentityMap:
    """The snapshot's identity map. With the frozen snapshot's hash it is memoised: the map is a
    pure function of the snapshot's bytes, and prepare's dry run and the commit of the same
    operation would otherwise mint every child id twice."""
    if snapshot_hash is not None:
        with _IDENTITY_CACHE_LOCK:
            cached = _IDENTITY_CACHE.get(snapshot_hash)
            if cached is not None:
                _IDENTITY_CACHE.move_to_end(snapshot_hash)
                return cached
    turns = snapshot["turns"]
    ids = build_identity_map(
        snapshot["operation_id"],
        snapshot["workspace_id"],
        snapshot["source"]["session_id"],
        snapshot["target"]["session_id"],
        (t["turn_id"] for t in turns),
        (m["message_id"] for t in turns for m in t["messages"]),
        (i["interaction_id"] for t in turns for i in t["interactions"]),
    )
    if snapshot_hash is not None:
        with _IDENTITY_CACHE_LOCK:
            _IDENTITY_CACHE[snapshot_hash] = ids
            while len(_IDENTITY_CACHE) > _IDENTITY_CACHE_SIZE:
                _IDENTITY_CACHE.popitem(last=False)
    return ids


_IDENTITY_CACHE_SIZE = 8  # operations between prepare and commit, per process
_IDENTITY_CACHE: OrderedDict[str, IdentityMap] = OrderedDict()
_IDENTITY_CACHE_LOCK = threading.Lock()


def build_child(
    snapshot: Mapping[str, Any],
    *,
    child_provider_session_id: str,
    binding_mode: str,
    turn_bindings: Mapping[str, Sequence[Any]] | None,
    committed_at_ms: int,
    snapshot_hash: str | None = None,
) -> ChildPlan:
    """The child of seed 000 §5: an independent root with remapped, normalised history.
    `snapshot_hash` (the frozen hash of `snapshot`) lets the identity map be reused."""
    ws = snapshot["workspace_id"]
    target = snapshot["target"]
    sid = target["session_id"]
    ids = identity_map_for(snapshot, snapshot_hash)
    bindings = dict(turn_bindings or {})
    unknown = set(bindings) - set(ids.turns)
    if unknown:
        raise ForkSnapshotCorrupt(f"turn bindings name turns outside the boundary: {unknown}")
    turn_rows: list[tuple[Any, ...]] = []
    message_rows: list[tuple[Any, ...]] = []
    interaction_rows: list[tuple[Any, ...]] = []
    # Enum values bound once: a 1,000-Turn child would read them ~15,000 times.
    fork_clone = SequenceProvenance.FORK_CLONE.value
    settled = TurnPhase.SETTLED.value
    interrupted = TurnOutcome.INTERRUPTED.value
    message_ids = ids.messages
    append_message = message_rows.append
    for turn in snapshot["turns"]:
        source_turn_id = turn["turn_id"]
        new_turn_id = ids.turns[source_turn_id]
        where = f"turn {source_turn_id}"
        if source_turn_id in bindings:
            root_id, binding_json = bindings[source_turn_id][0], bindings[source_turn_id][1]
        elif binding_mode == ProviderStateBindingMode.HOST_COPY:
            # host_copy providers keep their own Turn ids in the child (PROVIDERS.md).
            root_id, binding_json = (
                turn["root_provider_turn_id"],
                turn["provider_turn_binding_json"],
            )
        else:
            # provider_owned remaps identities; an unbound Turn is honestly not forkable.
            root_id, binding_json = None, None
        final_id = turn["final_assistant_message_id"]
        if final_id is not None:
            final_id = ids.messages.get(final_id)
            if final_id is None:
                raise ForkReferenceError(
                    ForkReferenceReason.DANGLING_REFERENCE,
                    f"{where}: final assistant message is outside the boundary",
                )
        active = turn["phase"] != settled
        turn_rows.append(
            (
                ws,
                sid,
                new_turn_id,
                turn["sequence"],
                fork_clone,
                settled,
                interrupted if active else turn["outcome"],
                root_id,
                binding_json,
                final_id,
                turn["error"],
                turn["created_at_ms"],
                committed_at_ms if active else turn["settled_at_ms"],
            )
        )
        for m in turn["messages"]:
            payload = m["payload"]
            append_message(
                (
                    ws,
                    sid,
                    message_ids[m["message_id"]],
                    new_turn_id,
                    m["kind"],
                    m["text"],
                    # The common empty payload holds no reference (no call, no f-string).
                    "{}"
                    if type(payload) is dict and not payload
                    else _remapped_json(payload, ids, where=f"message {m['message_id']}"),
                    m["version"],
                    m["position"],
                    committed_at_ms,
                )
            )
        for i in turn["interactions"]:
            where_i = f"interaction {i['interaction_id']}"
            status = i["status"]
            if status == InteractionStatus.PENDING:
                status = InteractionStatus.SUPERSEDED.value
            output = i["output"]
            interaction_rows.append(
                (
                    ws,
                    sid,
                    ids.interactions[i["interaction_id"]],
                    i["request_id"],
                    new_turn_id,
                    i["kind"],
                    status,
                    _remapped_json(i["input"], ids, where=where_i),
                    None if output is None else _remapped_json(output, ids, where=where_i),
                    committed_at_ms,
                    committed_at_ms if status != InteractionStatus.PENDING else None,
                )
            )
    session, lineage = _child_session(
        snapshot,
        child_provider_session_id,
        committed_at_ms,
        ids.turns[snapshot["point"]["turn_id"]],
    )
    return ChildPlan(
        session=session,
        lineage=lineage,
        ids=ids,
        turn_rows=turn_rows,
        message_rows=message_rows,
        interaction_rows=interaction_rows,
    )


def _remapped_json(value: Any, ids: IdentityMap, *, where: str) -> str:
    if isinstance(value, dict) and not value:  # the common empty payload holds no reference
        return "{}"
    return dumps(remap_references(value, ids, where=where))


def project_child(
    snapshot: Mapping[str, Any], *, child_provider_session_id: str, committed_at_ms: int
) -> tuple[Session, Lineage]:
    """The committed child's Session and lineage only (what an operation projects), without
    remapping the whole history: one deterministic id instead of one per entity."""
    point_turn = snapshot["point"]["turn_id"]
    target_turn_id = child_id(
        snapshot["operation_id"],
        snapshot["workspace_id"],
        snapshot["source"]["session_id"],
        snapshot["target"]["session_id"],
        EntityKind.TURN,
        point_turn,
    )
    return _child_session(snapshot, child_provider_session_id, committed_at_ms, target_turn_id)


def _child_session(
    snapshot: Mapping[str, Any],
    child_provider_session_id: str,
    committed_at_ms: int,
    target_turn_id: str,
) -> tuple[Session, Lineage]:
    ws = snapshot["workspace_id"]
    target = snapshot["target"]
    sid = target["session_id"]
    lineage = Lineage(
        source_session_id=snapshot["source"]["session_id"],
        source_turn_id=snapshot["point"]["turn_id"],
        target_session_id=sid,
        target_turn_id=target_turn_id,
        operation_id=snapshot["operation_id"],
        forked_at_ms=committed_at_ms,
    )
    session = Session(
        workspace_id=ws,
        session_id=sid,
        kind=SessionKind.ROOT.value,
        provider=target["provider"],
        provider_session_id=child_provider_session_id,
        title=target["title"],
        cwd=target["cwd"],
        settings=dict(target["settings"]),
        runtime_context=dict(target["runtime_context"]),
        model=target["model"],
        pinned=False,
        deleted=False,
        goal=None,
        active_turn_id=None,
        parent_session_id=None,
        parent_turn_id=None,
        created_at_ms=committed_at_ms,
        updated_at_ms=committed_at_ms,
        lineage=lineage,
        rail_placement=target["rail_placement"],
        visibility=target["visibility"],
    )
    return session, lineage
