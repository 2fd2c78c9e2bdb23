"""The pure function that turns a frozen snapshot plus provider evidence into the canonical
child (law 4): its Session, cloned Turns / Messages / Interactions with fresh ids, and its
lineage; the same plan at commit and in every committed projection. For a version 4 or 5 snapshot
the plan's Messages are a `HistoryCopy`: what the commit copies in SQLite, not rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from domain.enums import ProviderStateBindingMode, TurnOutcome
from domain.errors import (
    ForkReferenceError,
    ForkReferenceReason,
    ForkSnapshotCorrupt,
)
from storage.fork_identity import (
    EntityKind,
    IdentityMap,
    OrdinalPrefixes,
    build_identity_map,
    child_id,
    ordinal_id,
    ordinal_identity,
    ordinal_ids,
    remap_references,
)
from storage.fork_memo import ForkMemo
from storage.models import (
    InteractionStatus,
    Lineage,
    SequenceProvenance,
    Session,
    SessionKind,
    TurnPhase,
)
from storage.sqlite import dumps

# -- the child ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """Every row of the canonical child, computed purely from snapshot + evidence.

    `message_rows` carry every column but `created_at_ms`, which is `committed_at_ms` for all of
    them (the commit binds it once per statement, not once per row): so the rows are a pure
    function of the snapshot, built once per process at prepare and reused by the commit."""

    session: Session
    lineage: Lineage
    ids: IdentityMap
    turn_rows: list[tuple[Any, ...]]
    message_rows: Sequence[tuple[Any, ...]]
    interaction_rows: list[tuple[Any, ...]]
    committed_at_ms: int = 0
    copy: HistoryCopy | None = None


@dataclass(frozen=True, slots=True)
class HistoryCopy:
    """A version 4 or 5 child's Messages: copied by SQLite from the source's boundary at the commit
    (storage/fork_history.py), the rewritten payloads written over them."""

    source_session_id: str
    through: int
    count: int
    digest: str
    prefixes: OrdinalPrefixes
    rewritten: tuple[tuple[int, str], ...]
    through_position: int | None = None
    """The boundary's highest position as prepare found it (None in a snapshot frozen before
    it was recorded): the link's bound when the fence's witness proves the boundary unchanged."""


@dataclass(frozen=True, slots=True)
class ChildHistory:
    """What of the child is a pure function of the snapshot's bytes: its identity map and its
    Message rows (`MESSAGE_COLUMNS`), remapped and proven reference-safe."""

    ids: IdentityMap
    message_rows: tuple[tuple[Any, ...], ...]


# The columns of `ChildPlan.message_rows`, in order (`created_at_ms` is bound per statement).
MESSAGE_COLUMNS = (
    "workspace_id, session_id, message_id, turn_id, kind, text, payload_json, version, position"
)


def identity_map_for(snapshot: Mapping[str, Any], snapshot_hash: str | None = None) -> IdentityMap:
    """The snapshot's identity map (memoised with the frozen hash, see `child_history`)."""
    return child_history(snapshot, snapshot_hash).ids


def child_history(
    snapshot: Mapping[str, Any],
    snapshot_hash: str | None = None,
    *,
    last_use: bool = False,
    memo: ForkMemo | None = None,
) -> ChildHistory:
    """The child's ids and Message rows. With the frozen snapshot's hash they are memoised:
    both are a pure function of the snapshot's bytes, and prepare's dry run and the commit of
    the same operation would otherwise mint every child id and remap every Message twice (a
    1,000-Turn fork: ~11,000 ids, ~10,000 rows). The store's `memo` holds them; `last_use`
    (the commit) drops the entry."""
    if snapshot_hash is not None and memo is not None:
        cached = memo.histories.get(snapshot_hash, take=last_use)
        if cached is not None:
            return cast(ChildHistory, cached)
    history = snapshot.get("history")
    if history is not None:
        # Version 4 or 5: the Messages are copied in SQLite; only Turns and Interactions are mapped
        # here, and the Messages a reference names (frozen by prepare).
        ids = ordinal_identity(
            prefixes_of(snapshot), snapshot["turns"], dict(history["message_ids"])
        )
        built = ChildHistory(ids=ids, message_rows=())
    else:
        built = _minted_history(snapshot)
    if snapshot_hash is not None and memo is not None and not last_use:
        memo.histories.put(snapshot_hash, built, len(built.message_rows))
    return built


def remember_child_history(memo: ForkMemo, snapshot_hash: str, ids: IdentityMap) -> None:
    """Prepare's identity map of a version 4 snapshot (`fork_history.history_section`: what
    `child_history` of the frozen document computes), kept for its dry run and commit."""
    memo.histories.put(snapshot_hash, ChildHistory(ids=ids, message_rows=()), 0)


def _minted_history(snapshot: Mapping[str, Any]) -> ChildHistory:
    """A version 1–3 snapshot's child history: every id minted by rule v1, every Message row
    built in Python."""
    turns = snapshot["turns"]
    ids = build_identity_map(
        snapshot["operation_id"],
        snapshot["workspace_id"],
        snapshot["source"]["session_id"],
        snapshot["target"]["session_id"],
        (t["turn_id"] for t in turns),
        (m[0] for t in turns for m in t["messages"]),  # MESSAGE_FIELDS: message_id first
        (i["interaction_id"] for t in turns for i in t["interactions"]),
    )
    return ChildHistory(ids=ids, message_rows=_message_rows(snapshot, ids))


def prefixes_of(snapshot: Mapping[str, Any]) -> OrdinalPrefixes:
    """Rule v2's prefixes of the operation a version 4 or 5 snapshot belongs to."""
    return OrdinalPrefixes.of(
        snapshot["operation_id"],
        snapshot["workspace_id"],
        snapshot["source"]["session_id"],
        snapshot["target"]["session_id"],
    )


def _message_rows(snapshot: Mapping[str, Any], ids: IdentityMap) -> tuple[tuple[Any, ...], ...]:
    ws = snapshot["workspace_id"]
    sid = snapshot["target"]["session_id"]
    message_ids = ids.messages
    turn_ids = ids.turns
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    for turn in snapshot["turns"]:
        new_turn_id = turn_ids[turn["turn_id"]]
        # Snapshot v2 Messages (`MESSAGE_FIELDS`): message_id, kind, text, payload, version,
        # position; a v1 snapshot's objects were turned into these by `load_snapshot`.
        for message_id, kind, text, payload, version, position in turn["messages"]:
            append(
                (
                    ws,
                    sid,
                    message_ids[message_id],
                    new_turn_id,
                    kind,
                    text,
                    # The common empty payload holds no reference (no call, no f-string).
                    "{}"
                    if type(payload) is dict and not payload
                    else _remapped_json(payload, ids, where=f"message {message_id}"),
                    version,
                    position,
                )
            )
    return tuple(rows)


def build_child(
    snapshot: Mapping[str, Any],
    *,
    child_provider_session_id: str,
    binding_mode: str,
    turn_bindings: Mapping[str, Sequence[Any]] | None,
    committed_at_ms: int,
    snapshot_hash: str | None = None,
    last_use: bool = False,
    memo: ForkMemo | None = None,
) -> ChildPlan:
    """The child of seed 000 §5: an independent root with remapped, normalised history.
    `snapshot_hash` (the frozen hash of `snapshot`) lets the ids and Message rows prepare's
    dry run built be reused; `last_use` (the commit) releases them."""
    ws = snapshot["workspace_id"]
    target = snapshot["target"]
    sid = target["session_id"]
    child = child_history(snapshot, snapshot_hash, last_use=last_use, memo=memo)
    ids = child.ids
    bindings = dict(turn_bindings or {})
    unknown = set(bindings) - set(ids.turns)
    if unknown:
        raise ForkSnapshotCorrupt(f"turn bindings name turns outside the boundary: {unknown}")
    turn_rows: list[tuple[Any, ...]] = []
    interaction_rows: list[tuple[Any, ...]] = []
    # Enum values bound once: a 1,000-Turn child would read them thousands of times.
    fork_clone = SequenceProvenance.FORK_CLONE.value
    settled = TurnPhase.SETTLED.value
    interrupted = TurnOutcome.INTERRUPTED.value
    host_copy = binding_mode == ProviderStateBindingMode.HOST_COPY
    message_ids = ids.messages
    history = snapshot.get("history")
    prefixes = None if history is None else prefixes_of(snapshot)
    # Version 4 or 5: each final Message's child id from its frozen position (prefix split once).
    final_message_id = None if prefixes is None else ordinal_ids(prefixes.message)
    for turn in snapshot["turns"]:
        source_turn_id = turn["turn_id"]
        new_turn_id = ids.turns[source_turn_id]
        if source_turn_id in bindings:
            root_id, binding_json = bindings[source_turn_id][0], bindings[source_turn_id][1]
        elif host_copy:
            # host_copy providers keep their own Turn ids in the child (PROVIDERS.md).
            root_id, binding_json = (
                turn["root_provider_turn_id"],
                turn["provider_turn_binding_json"],
            )
        else:
            # provider_owned remaps identities; an unbound Turn is honestly not forkable.
            root_id, binding_json = None, None
        final_id = turn["final_assistant_message_id"]
        if final_id is not None and final_message_id is not None:
            # Version 4 or 5: prepare froze the position of a final Message inside the boundary.
            position = turn.get("final_assistant_position")
            final_id = None if position is None else final_message_id(int(position))
            if final_id is None:
                raise ForkReferenceError(
                    ForkReferenceReason.DANGLING_REFERENCE,
                    f"turn {source_turn_id}: final assistant message is outside the boundary",
                )
        elif final_id is not None:
            final_id = message_ids.get(final_id)
            if final_id is None:
                raise ForkReferenceError(
                    ForkReferenceReason.DANGLING_REFERENCE,
                    f"turn {source_turn_id}: final assistant message is outside the boundary",
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
    copy = None
    if history is not None and prefixes is not None:
        copy = HistoryCopy(
            source_session_id=snapshot["source"]["session_id"],
            through=int(history["through"]),
            count=int(history["count"]),
            digest=str(history["digest"]),
            prefixes=prefixes,
            rewritten=tuple((int(p), str(text)) for p, text in history["rewritten"]),
            through_position=_optional_int(history.get("through_position")),
        )
    return ChildPlan(
        session=session,
        lineage=lineage,
        ids=ids,
        turn_rows=turn_rows,
        message_rows=child.message_rows,
        interaction_rows=interaction_rows,
        committed_at_ms=committed_at_ms,
        copy=copy,
    )


def prove_child(
    snapshot: Mapping[str, Any],
    *,
    binding_mode: str,
    committed_at_ms: int,
    snapshot_hash: str | None = None,
    memo: ForkMemo | None = None,
) -> None:
    """Prepare's dry run: raise what `build_child` of this snapshot would raise at the commit
    (fail closed before dispatch), without building its rows. A version 4 or 5 snapshot's
    refusals are per Turn and per Interaction — a final assistant Message outside the boundary,
    a reference of an Interaction that does not map — and are checked here the way
    `build_child` checks them, with the same identity map; the 1,000 Turn rows a big fork's
    commit writes are not built twice. Older versions run `build_child` itself."""
    history = snapshot.get("history")
    if history is None:
        build_child(
            snapshot,
            child_provider_session_id="prepare-dry-run",
            binding_mode=binding_mode,
            turn_bindings=None,
            committed_at_ms=committed_at_ms,
            snapshot_hash=snapshot_hash,
            memo=memo,
        )
        return
    ids = child_history(snapshot, snapshot_hash, memo=memo).ids
    for turn in snapshot["turns"]:
        if (
            turn["final_assistant_message_id"] is not None
            and turn.get("final_assistant_position") is None
        ):
            raise ForkReferenceError(
                ForkReferenceReason.DANGLING_REFERENCE,
                f"turn {turn['turn_id']}: final assistant message is outside the boundary",
            )
        for i in turn["interactions"]:
            where_i = f"interaction {i['interaction_id']}"
            _remapped_json(i["input"], ids, where=where_i)
            if i["output"] is not None:
                _remapped_json(i["output"], ids, where=where_i)
    _child_session(
        snapshot, "prepare-dry-run", committed_at_ms, ids.turns[snapshot["point"]["turn_id"]]
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


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
    history = snapshot.get("history")
    if history is not None:  # version 4 or 5: rule v2, the boundary Turn's sequence
        target = ordinal_id(prefixes_of(snapshot).turn, int(history["through"]))
        return _child_session(snapshot, child_provider_session_id, committed_at_ms, target)
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
