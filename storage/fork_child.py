"""A fork's child from its frozen snapshot (laws 4, 5): deterministic child ids and the
reference-safe rewrite of cloned history, the pure build of the canonical child, and the memo
that carries the decoded snapshot and the child's rows from prepare to the commit.

Identities. Rule v1 (snapshots up to version 3): child ids are uuid5 over
"v1|operation|workspace|source|target|entity_kind|source_id". Rule v2 (snapshot version 4): an
entity's child id is the first 24 characters of uuid5 over "v2|operation|workspace|source|
target|entity_kind" followed by its ordinal as 12 hex digits — a Turn's sequence, a Message's
position, an Interaction's place in the boundary — with its first 8 characters scrambled by the
ordinal (`ordinal_id`: so two Turns of one child differ in the short id people see and type),
which SQLite derives itself while copying a cloned Message's row (`ordinal_id_sql`). Either
way a replayed commit yields the same ids; payload references are rewritten only through a
closed allowlist at the payload's own (host-owned) keys, and a host-owned key that looks like a
typed reference but is not on it fails closed; nested model/provider content is copied verbatim.

The build. The pure function that turns a frozen snapshot plus provider evidence into the
canonical child (law 4): its Session, cloned Turns / Messages / Interactions with fresh ids, and
its lineage; the same plan at commit and in every committed projection. For a version 4 or 5
snapshot the plan's Messages are a `HistoryCopy`: what the commit copies in SQLite, not rows.

The memo. What one `Store` remembers between a fork's prepare and its commit, keyed by the
frozen snapshot's hash: the snapshot document prepare froze (so the commit, having hashed the
stored bytes, skips a second decode of a multi-MB text) and the child's ids and remapped Message
rows (a pure function of those bytes, minted once for prepare's dry run and the commit). Owned
by the store instance that fills it, bounded, and released by the commit; a miss (another
store, a restart, an eviction) recomputes the same values.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar, cast

from domain.enums import ProviderStateBindingMode, TurnOutcome
from domain.errors import (
    ForkReferenceError,
    ForkReferenceReason,
    ForkSnapshotCorrupt,
)
from storage.models import (
    InteractionStatus,
    Lineage,
    SequenceProvenance,
    Session,
    SessionKind,
    TurnPhase,
)
from storage.sqlite import dumps

# -- Identities ------------------------------------------------------------------------------------

# Fixed forever: changing it would change every child id a replay computes (law 5).
IDENTITY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "agenthost:fork-identity")
IDENTITY_RULE_VERSION = "v1"


class EntityKind(StrEnum):
    TURN = "turn"
    MESSAGE = "message"
    INTERACTION = "interaction"


# The closed allowlist of typed payload references (docs/design/store.md, "Identity remap").
REFERENCE_KEYS: Mapping[str, EntityKind] = {
    "replyToMessageId": EntityKind.MESSAGE,
    "toolCallMessageId": EntityKind.MESSAGE,
    "parentMessageId": EntityKind.MESSAGE,
    "turnId": EntityKind.TURN,
    "interactionId": EntityKind.INTERACTION,
}

# Looks like a canonical typed reference: `messageId`, `fooMessageId`, `turnId`, `xTurnId`, ...
_TYPED_KEY = re.compile(r"^(?:[a-z][A-Za-z0-9]*)?(?:MessageId|TurnId|InteractionId|messageId)$")
# Provider and source lineage is deliberately left untouched (seed 000 §5).
_LINEAGE_PREFIXES = ("provider", "source")
REF_MARKER = "$ref"


def child_id(
    operation_id: str,
    workspace_id: str,
    source_session_id: str,
    target_session_id: str,
    kind: EntityKind,
    source_id: str,
) -> str:
    return ChildIdMinter(operation_id, workspace_id, source_session_id, target_session_id).mint(
        kind, source_id
    )


ORDINAL_RULE_VERSION = "v2"
_ORDINAL_MASK = (1 << 64) - 1


def ordinal_prefix(
    operation_id: str,
    workspace_id: str,
    source_session_id: str,
    target_session_id: str,
    kind: EntityKind,
) -> str:
    """Rule v2's per-operation, per-kind prefix: `xxxxxxxx-xxxx-5xxx-Vxxx-` of a uuid5 (version
    5 and the RFC 4122 variant already set), to which an ordinal's 12 hex digits are appended."""
    name = "|".join(
        (ORDINAL_RULE_VERSION, operation_id, workspace_id, source_session_id, target_session_id)
    )
    return _uuid5_head(hashlib.sha1(_NAMESPACE_BYTES + f"{name}|{kind.value}".encode()))


_NAMESPACE_BYTES = IDENTITY_NAMESPACE.bytes


def _uuid5_head(digest: Any) -> str:
    """`str(uuid.uuid5(IDENTITY_NAMESPACE, name))[:24]` from the SHA-1 of the namespace's bytes
    and the name's UTF-8 (what `uuid.uuid5` hashes), without a `UUID` built: the first 10
    bytes with RFC 4122's version 5 and variant bits set, as `xxxxxxxx-xxxx-5xxx-Vxxx-`.
    Start-up recovery derives three prefixes per commit, 2,000 commits on the store of months."""
    head = bytearray(digest.digest()[:10])
    head[6] = (head[6] & 0x0F) | 0x50
    head[8] = (head[8] & 0x3F) | 0x80
    h = head.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-"


_LOW32 = (1 << 32) - 1
_SCRAMBLE = 0x5BD1E995
"""Odd, so `n * _SCRAMBLE mod 2**32` is a bijection; below 2**31, so SQLite's 64-bit product of
it and a 32-bit ordinal never overflows into a REAL."""


def ordinal_seed(prefix: str) -> int:
    """The prefix's first 8 hex digits as the integer its ids' first 8 are scrambled from."""
    return int(prefix[:8], 16)


def ordinal_id(prefix: str, ordinal: int) -> str:
    """Rule v2's child id: the prefix with its first 8 hex digits replaced by `(seed + (ordinal
    mod 2**32) * _SCRAMBLE) mod 2**32`, then the ordinal as SQLite's `printf('%012x', n)` prints
    it (a negative ordinal as its 64-bit two's complement, like SQLite), so the id Python
    computes for a Turn or a referenced Message is the very id the copy statement writes. The
    last 12 digits keep the ids unique; the first 8 make consecutive ordinals look apart, so
    a child's Turns have distinct short ids and unique prefixes."""
    return _ordinal_id(ordinal_seed(prefix), prefix[8:], ordinal)


def _ordinal_id(seed: int, rest: str, ordinal: int) -> str:
    # One `%` on a tuple, not an f-string's two format specs: the same text (both fields are
    # non-negative), ~0.68 → ~0.40 µs an id; a months cold fork derives 20,000 (its Turns' ids
    # at prepare, their final Messages' at the commit).
    return "%08x%s%012x" % (  # noqa: UP031
        (seed + ((ordinal & _LOW32) * _SCRAMBLE & _LOW32)) & _LOW32,
        rest,
        ordinal & _ORDINAL_MASK,
    )


def ordinal_ids(prefix: str) -> Callable[[int], str]:
    """`ordinal_id` of one prefix, the prefix split once: for a loop over many ordinals."""
    seed, rest = ordinal_seed(prefix), prefix[8:]
    return lambda ordinal: _ordinal_id(seed, rest, ordinal)


def ordinal_id_sql(seed_param: str, rest_param: str, ordinal_column: str) -> str:
    """The SQL expression of `ordinal_id`: `seed_param` bound to `ordinal_seed(prefix)`,
    `rest_param` to `prefix[8:]`."""
    head = (
        f"(({seed_param} + ((({ordinal_column}) & {_LOW32}) * {_SCRAMBLE} & {_LOW32})) & {_LOW32})"
    )
    return f"(printf('%08x', {head}) || {rest_param} || printf('%012x', {ordinal_column}))"


@dataclass(frozen=True, slots=True)
class OrdinalPrefixes:
    """Rule v2's three prefixes of one operation."""

    turn: str
    message: str
    interaction: str

    @classmethod
    def of(
        cls, operation_id: str, workspace_id: str, source_session_id: str, target_session_id: str
    ) -> OrdinalPrefixes:
        args = (operation_id, workspace_id, source_session_id, target_session_id)
        return cls(
            turn=ordinal_prefix(*args, EntityKind.TURN),
            message=ordinal_prefix(*args, EntityKind.MESSAGE),
            interaction=ordinal_prefix(*args, EntityKind.INTERACTION),
        )


# A version 4 or 5 boundary's Turn, in memory and in a version 5 snapshot: an array of these
# values, in this order (a version 4 snapshot stored each Turn as a map of them; `load_snapshot`
# reads it back into the array). `final_assistant_position` is None when the Turn's final
# Message is not in the boundary.
TURN_FIELDS = (
    "turn_id",
    "sequence",
    "sequence_provenance",
    "phase",
    "outcome",
    "root_provider_turn_id",
    "provider_turn_binding_json",
    "final_assistant_message_id",
    "error",
    "created_at_ms",
    "settled_at_ms",
    "interactions",
    "final_assistant_position",
)
(
    T_ID, T_SEQUENCE, T_PROVENANCE, T_PHASE, T_OUTCOME, T_ROOT_PROVIDER_TURN, T_BINDING,
    T_FINAL_ID, T_ERROR, T_CREATED, T_SETTLED, T_INTERACTIONS, T_FINAL_POSITION,
) = range(len(TURN_FIELDS))  # fmt: skip
TurnArray = Sequence[Any]
"""A boundary Turn as the `TURN_FIELDS` values."""


def turn_array(turn: Mapping[str, Any]) -> list[Any]:
    """A Turn map (a version 1–4 document's) as its `TURN_FIELDS` values (a missing one None)."""
    return [turn.get(field) for field in TURN_FIELDS]


def ordinal_identity(
    prefixes: OrdinalPrefixes,
    turns: Iterable[TurnArray],
    messages: Mapping[str, str],
) -> IdentityMap:
    """Rule v2's identity map of a boundary: each Turn by its sequence, each Interaction by its
    1-based place in the boundary's order (Turn by Turn, as frozen), and `messages` as given (the
    Messages a reference names: the rest are never mapped in Python)."""
    # Each prefix split once: a 10,000-Turn boundary maps 10,000 Turns per call.
    turn_seed, turn_rest = ordinal_seed(prefixes.turn), prefixes.turn[8:]
    interaction_seed = ordinal_seed(prefixes.interaction)
    interaction_rest = prefixes.interaction[8:]
    turn_map: dict[str, str] = {}
    interactions: dict[str, str] = {}
    for turn in turns:
        turn_map[turn[T_ID]] = _ordinal_id(turn_seed, turn_rest, int(turn[T_SEQUENCE]))
        for i in turn[T_INTERACTIONS]:
            n = len(interactions) + 1
            interactions[i["interaction_id"]] = _ordinal_id(interaction_seed, interaction_rest, n)
    return IdentityMap(turns=turn_map, messages=messages, interactions=interactions)


# A hex digit with its top two bits replaced by the RFC 4122 variant `10`.
_VARIANT_NIBBLE = {d: "89ab"[int(d, 16) & 0x3] for d in "0123456789abcdef"}


class ChildIdMinter:
    """`child_id` for one operation, fast: the SHA-1 state of the uuid5 name's fixed prefix is
    computed once and copied per entity (a 1,000-Turn fork mints ~11,000 ids). The result is
    byte-for-byte `uuid.uuid5(IDENTITY_NAMESPACE, name)`; tests/storage pins that."""

    __slots__ = ("_prefix",)

    def __init__(
        self, operation_id: str, workspace_id: str, source_session_id: str, target_session_id: str
    ) -> None:
        fields = (IDENTITY_RULE_VERSION, operation_id, workspace_id)
        head = "|".join((*fields, source_session_id, target_session_id, ""))
        # uuid5 is SHA-1 of namespace bytes + name, by definition (RFC 4122 §4.3).
        self._prefix = hashlib.sha1(IDENTITY_NAMESPACE.bytes + head.encode())

    def mint(self, kind: EntityKind, source_id: str) -> str:
        return self.mint_all(kind, (source_id,))[0]

    def mint_all(self, kind: EntityKind, source_ids: Iterable[str]) -> list[str]:
        """`mint` for many ids of one kind: one loop with its lookups hoisted (the enum's
        `.value` and the prefix bound once per kind, not once per entity)."""
        head = f"{kind.value}|"
        prefix = self._prefix
        variant = _VARIANT_NIBBLE
        out: list[str] = []
        append = out.append
        for source_id in source_ids:
            h = prefix.copy()
            h.update((head + source_id).encode())
            x = h.hexdigest()
            # The first 16 bytes, with the version nibble 5 and the RFC 4122 variant bits 10xx
            # set on the hex digits themselves (no bytes round trip).
            append(f"{x[:8]}-{x[8:12]}-5{x[13:16]}-{variant[x[16]]}{x[17:20]}-{x[20:32]}")
        return out


@dataclass(frozen=True, slots=True)
class IdentityMap:
    """source id → child id per entity kind; built once per commit, checked injective."""

    turns: Mapping[str, str]
    messages: Mapping[str, str]
    interactions: Mapping[str, str]

    def for_kind(self, kind: EntityKind) -> Mapping[str, str]:
        if kind is EntityKind.TURN:
            return self.turns
        if kind is EntityKind.MESSAGE:
            return self.messages
        return self.interactions


def build_identity_map(
    operation_id: str,
    workspace_id: str,
    source_session_id: str,
    target_session_id: str,
    turn_ids: Iterable[str],
    message_ids: Iterable[str],
    interaction_ids: Iterable[str],
) -> IdentityMap:
    """Map every source id; a duplicate source id or a colliding child id fails closed."""
    minter = ChildIdMinter(operation_id, workspace_id, source_session_id, target_session_id)
    seen_targets: set[str] = set()
    maps: list[dict[str, str]] = []
    for kind, ids in (
        (EntityKind.TURN, turn_ids),
        (EntityKind.MESSAGE, message_ids),
        (EntityKind.INTERACTION, interaction_ids),
    ):
        sources = list(ids)
        targets = minter.mint_all(kind, sources)
        mapping = dict(zip(sources, targets, strict=True))
        if len(mapping) != len(sources):
            seen: set[str] = set()
            for source_id in sources:
                if source_id in seen:
                    raise ForkReferenceError(
                        ForkReferenceReason.DUPLICATE_KEY, f"duplicate {kind} id {source_id!r}"
                    )
                seen.add(source_id)
        before = len(seen_targets)
        seen_targets.update(targets)
        if len(seen_targets) != before + len(targets):
            # Which one: only on the (practically impossible) failure path.
            check: set[str] = set()
            for target in (t for m in maps for t in m.values()):
                check.add(target)
            for target in targets:
                if target in check:
                    raise ForkReferenceError(
                        ForkReferenceReason.NON_INJECTIVE_MAPPING,
                        f"child id {target} would be produced twice",
                    )
                check.add(target)
        maps.append(mapping)
    return IdentityMap(turns=maps[0], messages=maps[1], interactions=maps[2])


def is_typed_reference_key(key: str) -> bool:
    return bool(_TYPED_KEY.match(key)) and not key.startswith(_LINEAGE_PREFIXES)


def remap_references(value: Any, ids: IdentityMap, *, where: str) -> Any:
    """Return a host-owned payload map with its allowlisted references rewritten; fail closed
    on anything unsafe.

    Only the payload's own (top-level) keys are host-owned: that is where the allowlist's
    references live. Every value below them — a model's tool call `input`/`arguments`, a raw
    provider `item`, a question list — is model or provider content and is copied as it is,
    never searched and never rewritten (seed 000 §5): a tool call whose arguments happen to hold
    `{"turnId": ...}` must reach the child exactly as the model emitted it. Strings are never
    searched either (plain text, markdown and tool output stay byte-identical).
    """
    if not isinstance(value, Mapping):
        return value
    if REF_MARKER in value:
        raise ForkReferenceError(
            ForkReferenceReason.UNKNOWN_TYPED_REFERENCE, f"{where}: '$ref' is not allowlisted"
        )
    out: dict[str, Any] = {}
    for key, item in value.items():
        kind = REFERENCE_KEYS.get(key)
        if kind is not None:
            out[key] = _remap_one(key, item, ids.for_kind(kind), where=where)
        elif is_typed_reference_key(key):
            raise ForkReferenceError(
                ForkReferenceReason.UNKNOWN_TYPED_REFERENCE,
                f"{where}: typed reference {key!r} is not on the allowlist",
            )
        else:
            out[key] = item  # model/provider content: verbatim
    return out


def _remap_one(key: str, value: Any, mapping: Mapping[str, str], *, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ForkReferenceError(
            ForkReferenceReason.MALFORMED_REFERENCE, f"{where}: {key} must be a string id"
        )
    target = mapping.get(value)
    if target is None:
        raise ForkReferenceError(
            ForkReferenceReason.DANGLING_REFERENCE,
            f"{where}: {key}={value!r} does not resolve inside the fork boundary",
        )
    return target


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads(object_pairs_hook=...)`: a JSON object with a repeated key fails closed."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ForkReferenceError(
                ForkReferenceReason.DUPLICATE_KEY, f"duplicate JSON key {key!r} in payload"
            )
        out[key] = value
    return out


# -- The memo --------------------------------------------------------------------------------------

V = TypeVar("V")

FROZEN_BUDGET_CHARS = 8_000_000
"""Encoded snapshot bytes held in all; a bigger single snapshot is not held."""
HISTORY_SIZE = 8
"""Operations between prepare and commit whose child histories are held."""
HISTORY_BUDGET_ROWS = 60_000
"""Message rows held in all (~20 MB at most)."""


class _Bounded(Generic[V]):
    """An LRU of `key → (value, weight)` bounded by entries and total weight (the newest entry
    is always kept)."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._max_entries = max_entries
        self._max_weight = max_weight

    def put(self, key: str, value: V, weight: int) -> None:
        with self._lock:
            self._items[key] = (value, weight)
            self._items.move_to_end(key)
            total = sum(w for _, w in self._items.values())
            while len(self._items) > 1 and (
                len(self._items) > self._max_entries or total > self._max_weight
            ):
                _, (_, dropped) = self._items.popitem(last=False)
                total -= dropped

    def get(self, key: str, *, take: bool = False) -> V | None:
        with self._lock:
            held = self._items.pop(key, None) if take else self._items.get(key)
            if held is None:
                return None
            if not take:
                self._items.move_to_end(key)
            return held[0]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class ForkMemo:
    """The two memos of one store: frozen snapshot documents and child histories."""

    def __init__(self) -> None:
        self.frozen: _Bounded[dict[str, Any]] = _Bounded(1_000_000, FROZEN_BUDGET_CHARS)
        self.histories: _Bounded[Any] = _Bounded(HISTORY_SIZE, HISTORY_BUDGET_ROWS)

    def remember_frozen(self, digest: str, document: dict[str, Any], size: int) -> None:
        if size <= FROZEN_BUDGET_CHARS:
            self.frozen.put(digest, document, size)

    def take_frozen(self, digest: str) -> dict[str, Any] | None:
        """Taken once: the commit is the only consumer, and no reader can mutate a document
        another reader holds."""
        return self.frozen.get(digest, take=True)


# -- The build -------------------------------------------------------------------------------------


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
    (storage/history_links.py), the rewritten payloads written over them."""

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
    prefixes: OrdinalPrefixes | None = None
    """Rule v2's prefixes of a version 4 or 5 child (None for older versions): derived once,
    at prepare, for the commit's final Messages and its history link too."""


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
    (the commit) drops the entry. A version 4 or 5 history carries rule v2's prefixes it was
    mapped with (`build_child` uses them: derived once per child, at prepare in one process)."""
    if snapshot_hash is not None and memo is not None:
        cached = memo.histories.get(snapshot_hash, take=last_use)
        if cached is not None:
            return cast(ChildHistory, cached)
    history = snapshot.get("history")
    if history is not None:
        # Version 4 or 5: the Messages are copied in SQLite; only Turns and Interactions are mapped
        # here, and the Messages a reference names (frozen by prepare).
        prefixes = prefixes_of(snapshot)
        ids = ordinal_identity(prefixes, snapshot["turns"], dict(history["message_ids"]))
        built = ChildHistory(ids=ids, message_rows=(), prefixes=prefixes)
    else:
        built = _minted_history(snapshot)
    if snapshot_hash is not None and memo is not None and not last_use:
        memo.histories.put(snapshot_hash, built, len(built.message_rows))
    return built


def remember_child_history(
    memo: ForkMemo, snapshot_hash: str, ids: IdentityMap, prefixes: OrdinalPrefixes
) -> None:
    """Prepare's identity map of a version 4 snapshot (`fork_history.history_section`: what
    `child_history` of the frozen document computes) and the prefixes it was made with (what
    `prefixes_of` derives from the same document), kept for its dry run and commit."""
    memo.histories.put(snapshot_hash, ChildHistory(ids=ids, message_rows=(), prefixes=prefixes), 0)


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
    history = snapshot.get("history")
    child = child_history(snapshot, snapshot_hash, last_use=last_use, memo=memo)
    # Version 4 or 5: rule v2's prefixes, derived once (at prepare, when the memo held its
    # history) for the ids, the final Messages and the history link.
    prefixes = None if history is None else child.prefixes or prefixes_of(snapshot)
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
    # Version 4 or 5: each final Message's child id from its frozen position (prefix split once).
    final_message_id = None if prefixes is None else ordinal_ids(prefixes.message)
    # Versions 4 and 5 hold their Turns as `TURN_FIELDS` arrays; an older map is read as one.
    turns = snapshot["turns"] if history is not None else map(turn_array, snapshot["turns"])
    for turn in turns:
        source_turn_id = turn[T_ID]
        new_turn_id = ids.turns[source_turn_id]
        if source_turn_id in bindings:
            root_id, binding_json = bindings[source_turn_id][0], bindings[source_turn_id][1]
        elif host_copy:
            # host_copy providers keep their own Turn ids in the child (PROVIDERS.md).
            root_id, binding_json = turn[T_ROOT_PROVIDER_TURN], turn[T_BINDING]
        else:
            # provider_owned remaps identities; an unbound Turn is honestly not forkable.
            root_id, binding_json = None, None
        final_id = turn[T_FINAL_ID]
        if final_id is not None and final_message_id is not None:
            # Version 4 or 5: prepare froze the position of a final Message inside the boundary.
            position = turn[T_FINAL_POSITION]
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
        active = turn[T_PHASE] != settled
        turn_rows.append(
            (
                ws,
                sid,
                new_turn_id,
                turn[T_SEQUENCE],
                fork_clone,
                settled,
                interrupted if active else turn[T_OUTCOME],
                root_id,
                binding_json,
                final_id,
                turn[T_ERROR],
                turn[T_CREATED],
                committed_at_ms if active else turn[T_SETTLED],
                # A Turn of the boundary with no provider turn id is one its provider never got
                # (`host_only`: load_boundary refuses any other): host-only in the child too.
                1 if turn[T_ROOT_PROVIDER_TURN] is None else 0,
            )
        )
        for i in turn[T_INTERACTIONS]:
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
        if turn[T_FINAL_ID] is not None and turn[T_FINAL_POSITION] is None:
            raise ForkReferenceError(
                ForkReferenceReason.DANGLING_REFERENCE,
                f"turn {turn[T_ID]}: final assistant message is outside the boundary",
            )
        for i in turn[T_INTERACTIONS]:
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
