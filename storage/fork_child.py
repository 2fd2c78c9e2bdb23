"""The pure function that turns a frozen snapshot plus provider evidence into the canonical
child (law 4): its Session, cloned Turns / Messages / Interactions with fresh ids, and its
lineage; the same plan at commit and in every committed projection."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storage.errors import (
    ForkReferenceError,
    ForkReferenceReason,
    ForkSnapshotCorrupt,
)
from storage.fork_identity import (
    EntityKind,
    IdentityMap,
    build_identity_map,
    child_id,
    remap_references,
)
from storage.models import (
    InteractionStatus,
    Lineage,
    ProviderStateBindingMode,
    SequenceProvenance,
    Session,
    SessionKind,
    TurnOutcome,
    TurnPhase,
)
from storage.sqlite import dumps

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

