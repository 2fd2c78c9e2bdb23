"""fork.resolve's worker messages, standard library only: fork.resolve sends a
`ResolveRequest` (`fork.inspect`, `fork.quarantine`) or a `ResolveAdopt` (`fork.adopt`) and
reads a `ResolveInspection` / `ForkResult` / `ResolveQuarantined`, which the worker's resolution
handlers take and give."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from domain.fork_messages import ForkRequest, ForkSource, ForkTarget, MalformedMessage


@dataclass(frozen=True, slots=True)
class ResolveRequest:
    """The params of `fork.inspect` and `fork.quarantine`: which operation's
    provider children to look for (those whose lineage names the source and that no other
    operation claimed: `exclude_child_ids`), and what a verified child must show (the frozen
    provider Turn prefix, and for a provider_owned driver the frozen Turn bindings).

    `fork_request()` is the `ForkRequest` a driver re-verifies a child with, as its fork would.
    """

    INSPECT: ClassVar[str] = "fork.inspect"
    QUARANTINE: ClassVar[str] = "fork.quarantine"

    operation_id: str
    source: ForkSource
    target: ForkTarget
    provider_turn_ids: tuple[str, ...]
    exclude_child_ids: tuple[str, ...]
    title: str
    provider_turn_bindings: tuple[str | None, ...]
    driver_kind: str
    driver_version: str
    other_prefixes: tuple[tuple[str, ...], ...] = ()
    """The frozen provider Turn prefixes of the source's other operations that may own a child
    (not failed, not abandoned). A child showing one of them is that operation's, never this
    one's; a child that cannot be attributed by its Turns is this operation's evidence only
    when no other operation could own it (law 9)."""
    child_ids: tuple[str, ...] = ()
    """`fork.quarantine` only: the children the inspection attributed to this operation; no
    other file is moved."""

    def fork_request(self) -> ForkRequest:
        return ForkRequest.from_wire(self.to_wire())

    def to_wire(self) -> dict[str, Any]:
        # The key order fork.resolve always sent.
        return {
            "operationId": self.operation_id,
            "source": self.source.to_wire(),
            "target": self.target.to_wire(),
            "providerTurnIds": list(self.provider_turn_ids),
            "excludeChildIds": list(self.exclude_child_ids),
            "title": self.title,
            "providerTurnBindings": list(self.provider_turn_bindings),
            "driverKind": self.driver_kind,
            "driverVersion": self.driver_version,
            "otherPrefixes": [list(p) for p in self.other_prefixes],
            "childIds": list(self.child_ids),
        }

    def attributes(self, turns: tuple[str, ...] | None) -> bool:
        """Whether a provider child of the source whose Turns read as `turns` (None: could
        not be read) may be this operation's evidence: its Turns are this operation's frozen
        prefix; or they could not be read (then it is listed, undecided: an abandon refuses
        while another operation could own it, and it is never adoptable); or no other
        operation could own it."""
        if turns is None:
            return True
        if turns == self.provider_turn_ids:
            return True
        return not self.other_prefixes

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ResolveRequest:
        fork = ForkRequest.from_wire(params)
        return cls(
            operation_id=str(params.get("operationId") or ""),
            source=fork.source,
            target=fork.target,
            provider_turn_ids=fork.provider_turn_ids,
            exclude_child_ids=tuple(str(c) for c in params.get("excludeChildIds") or ()),
            title=fork.title,
            provider_turn_bindings=fork.provider_turn_bindings,
            driver_kind=fork.driver_kind,
            driver_version=fork.driver_version,
            other_prefixes=tuple(
                tuple(str(t) for t in p)
                for p in params.get("otherPrefixes") or ()
                if isinstance(p, (list, tuple))
            ),
            child_ids=tuple(str(c) for c in params.get("childIds") or ()),
        )


@dataclass(frozen=True, slots=True)
class ResolveAdopt:
    """The params of `fork.adopt`: the inspection's scope plus the one child to adopt. The
    answer is a `ForkResult` (`accepted` with the child and its binding, like a fork's)."""

    METHOD: ClassVar[str] = "fork.adopt"

    scope: ResolveRequest
    child_id: str

    def to_wire(self) -> dict[str, Any]:
        return {**self.scope.to_wire(), "childId": self.child_id}

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ResolveAdopt:
        return cls(ResolveRequest.from_wire(params), str(params.get("childId") or ""))


@dataclass(frozen=True, slots=True)
class ResolvedChild:
    """One provider child an operation may have left, as a driver found it.

    `read_error` is reported only by the drivers that read the child's Turns through a provider
    program (the app-servers: why it could not be read, else None); Claude reads its transcript
    and reports none (`reports_read_error` False: the key is absent from the map)."""

    provider_session_id: str
    forked_from_id: str
    provider_turn_ids: tuple[str, ...]
    turns_equal_prefix: bool
    reads_from_own_home: bool
    locations: tuple[str, ...]
    read_error: str | None = None
    reports_read_error: bool = False

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "providerSessionId": self.provider_session_id,
            "forkedFromId": self.forked_from_id,
            "providerTurnIds": list(self.provider_turn_ids),
        }
        if self.reports_read_error:
            out["readError"] = self.read_error
        out["turnsEqualPrefix"] = self.turns_equal_prefix
        out["readsFromOwnHome"] = self.reads_from_own_home
        out["locations"] = list(self.locations)
        return out

    @classmethod
    def from_wire(cls, child: Mapping[str, Any]) -> ResolvedChild:
        read_error = child.get("readError")
        return cls(
            provider_session_id=str(child.get("providerSessionId") or ""),
            forked_from_id=str(child.get("forkedFromId") or ""),
            provider_turn_ids=tuple(str(t) for t in child.get("providerTurnIds") or ()),
            # `is True`: the verdict trusts only an explicit yes.
            turns_equal_prefix=child.get("turnsEqualPrefix") is True,
            reads_from_own_home=child.get("readsFromOwnHome") is True,
            locations=tuple(str(n) for n in child.get("locations") or ()),
            read_error=None if read_error is None else str(read_error),
            reports_read_error="readError" in child,
        )


@dataclass(frozen=True, slots=True)
class ResolveInspection:
    """The answer of `fork.inspect`: the children found and the files already quarantined for
    this operation. The host adds its verdict (`adoptable` | `absent` | `ambiguous`)."""

    children: tuple[ResolvedChild, ...]
    quarantined: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "children": [c.to_wire() for c in self.children],
            "quarantined": list(self.quarantined),
        }

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> ResolveInspection:
        children = result.get("children") or ()
        if not all(isinstance(c, Mapping) for c in children):
            raise MalformedMessage("fork.inspect children must be maps")
        return cls(
            tuple(ResolvedChild.from_wire(c) for c in children),
            tuple(str(p) for p in result.get("quarantined") or ()),
        )


@dataclass(frozen=True, slots=True)
class ResolveQuarantined:
    """The answer of `fork.quarantine`: where each child file was moved (never deleted)."""

    moved: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"moved": list(self.moved)}

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> ResolveQuarantined:
        return cls(tuple(str(p) for p in result.get("moved") or ()))
