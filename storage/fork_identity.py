"""Deterministic child identities and the reference-safe rewrite of cloned history (law 5).

Rule v1 (snapshots up to version 3): child ids are uuid5 over
"v1|operation|workspace|source|target|entity_kind|source_id". Rule v2 (snapshot version 4): an
entity's child id is the first 24 characters of uuid5 over "v2|operation|workspace|source|
target|entity_kind" followed by its ordinal as 12 hex digits — a Turn's sequence, a Message's
position, an Interaction's place in the boundary — with its first 8 characters scrambled by the
ordinal (`ordinal_id`: so two Turns of one child differ in the short id people see and type),
which SQLite derives itself while copying a cloned Message's row (`ordinal_id_sql`). Either
way a replayed commit yields the same ids; payload references are rewritten only through a
closed allowlist at the payload's own (host-owned) keys, and a host-owned key that looks like a
typed reference but is not on it fails closed; nested model/provider content is copied verbatim.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from domain.errors import ForkReferenceError, ForkReferenceReason

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
    return str(uuid.uuid5(IDENTITY_NAMESPACE, f"{name}|{kind.value}"))[:24]


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
    head = (seed + ((ordinal & _LOW32) * _SCRAMBLE & _LOW32)) & _LOW32
    return f"{head:08x}{rest}{ordinal & _ORDINAL_MASK:012x}"


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


def ordinal_identity(
    prefixes: OrdinalPrefixes,
    turns: Iterable[Mapping[str, Any]],
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
        turn_map[turn["turn_id"]] = _ordinal_id(turn_seed, turn_rest, int(turn["sequence"]))
        for i in turn["interactions"]:
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
