"""The typed messages between the host and its driver workers, standard library only: the fork
request and answer (seed 000 §7, §7.1), fork.resolve's inspect / adopt / quarantine requests and
answers (issue 21 §1), and the turn events a driver streams (docs/design/internals.md "Turn
events").

Both ends use these types: the saga builds a `ForkRequest` and reads a `ForkResult`, the worker
hands the driver a `ForkRequest` and sends its `ForkResult`; fork.resolve sends a
`ResolveRequest` / `ResolveAdopt` and reads a `ResolveInspection` / `ForkResult` /
`ResolveQuarantined`, which the worker's resolution handlers take and give; a driver builds
its turn events as `TurnEvent`s, the worker sends them, and the Session actor reads them as such
(the host parses each once, at its end of the link). `to_wire`/`from_wire` convert
at the link (the msgpack maps of `transport/worker_link.py` are unchanged, key for key).
`drivers.base` re-exports the fork types under their old names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from domain.enums import DeliveryDisposition, ProviderStateBindingMode


class MalformedMessage(ValueError):
    """A worker message that does not have its type's shape; the receiver treats the answer as
    unverifiable (a fork answer → `unknown`) or drops the event."""


# -- fork ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForkSource:
    agent_session_id: str
    provider_session_id: str
    home: str
    cwd: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "providerSessionId": self.provider_session_id,
            "home": self.home,
            "cwd": self.cwd,
        }


@dataclass(frozen=True, slots=True)
class ForkTarget:
    agent_session_id: str
    home: str

    def to_wire(self) -> dict[str, Any]:
        return {"agentSessionId": self.agent_session_id, "home": self.home}


_FORK_REQUEST_KEYS = frozenset(
    {"source", "target", "providerTurnIds", "title", "driverKind", "driverVersion", "sourceTurnId"}
)


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """The provider-neutral input of a driver fork: the frozen ordered provider Turn prefix
    (`provider_turn_ids`, last = the boundary Turn) and the frozen driver identity.

    `extra` holds the optional keys a driver may need (`providerTurnBindings`, and fork.resolve's
    `operationId`, `excludeChildIds`, `childId`); it travels as top-level keys of the map."""

    METHOD: ClassVar[str] = "fork"

    source: ForkSource
    target: ForkTarget
    provider_turn_ids: tuple[str, ...]
    title: str
    driver_kind: str
    driver_version: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The source canonical Turn id of the boundary (seed 000 §7 provider-neutral input); the
    # drivers echo it in their binding receipt, so the evidence names the Turn it binds.
    source_turn_id: str = ""

    @property
    def provider_turn_bindings(self) -> tuple[str | None, ...]:
        """The frozen binding JSON of each Turn, lined up with `provider_turn_ids` (a
        provider_owned driver cuts at a known checkpoint with it); empty when not sent."""
        raw = self.extra.get("providerTurnBindings") or ()
        return tuple(None if b is None else str(b) for b in raw)

    @property
    def runtime_generation(self) -> str | None:
        """`runtimeGeneration`: the generation of the source runtime whose attested verdict
        let this fork leave the host (issue 20); the worker refuses it (`not_started`) when
        another runtime is live by now. None: no such check (fork.resolve, older hosts)."""
        value = self.extra.get("runtimeGeneration")
        return value if isinstance(value, str) and value else None

    def to_wire(self) -> dict[str, Any]:
        # The key order is the one the saga always sent (a msgpack map, byte for byte).
        out: dict[str, Any] = {
            "source": self.source.to_wire(),
            "target": self.target.to_wire(),
            "sourceTurnId": self.source_turn_id,
            "providerTurnIds": list(self.provider_turn_ids),
        }
        out.update({k: v for k, v in self.extra.items() if k not in _FORK_REQUEST_KEYS})
        out.update(
            {
                "title": self.title,
                "driverKind": self.driver_kind,
                "driverVersion": self.driver_version,
            }
        )
        return out

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ForkRequest:
        src = params.get("source") or {}
        tgt = params.get("target") or {}
        return cls(
            source=ForkSource(
                agent_session_id=str(src.get("agentSessionId", "")),
                provider_session_id=str(src.get("providerSessionId") or ""),
                home=str(src.get("home", "")),
                cwd=str(src.get("cwd", "")),
            ),
            target=ForkTarget(
                agent_session_id=str(tgt.get("agentSessionId", "")),
                home=str(tgt.get("home", "")),
            ),
            provider_turn_ids=tuple(str(t) for t in params.get("providerTurnIds") or ()),
            title=str(params.get("title") or ""),
            driver_kind=str(params.get("driverKind") or ""),
            driver_version=str(params.get("driverVersion") or ""),
            extra={k: v for k, v in params.items() if k not in _FORK_REQUEST_KEYS},
            source_turn_id=str(params.get("sourceTurnId") or ""),
        )


@dataclass(frozen=True, slots=True)
class ForkChild:
    provider_session_id: str
    forked_from_id: str
    provider_turn_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ForkBinding:
    mode: ProviderStateBindingMode
    receipt: Mapping[str, Any]
    # provider_owned: source provider Turn id → {rootProviderTurnId, bindingJson} of the child's.
    turn_bindings: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ForkResult:
    """A driver's answer: `accepted` only with `child` and `binding` (the hard gate of §7.1)."""

    disposition: DeliveryDisposition
    error: str | None = None
    child: ForkChild | None = None
    binding: ForkBinding | None = None

    def __post_init__(self) -> None:
        if self.disposition is DeliveryDisposition.ACCEPTED and (
            self.child is None or self.binding is None
        ):
            raise ValueError("an accepted fork needs a verified child and a binding")

    @classmethod
    def not_started(cls, error: str) -> ForkResult:
        return cls(DeliveryDisposition.NOT_STARTED, error)

    @classmethod
    def rejected(cls, error: str) -> ForkResult:
        return cls(DeliveryDisposition.REJECTED, error)

    @classmethod
    def unknown(cls, error: str, child: ForkChild | None = None) -> ForkResult:
        return cls(DeliveryDisposition.UNKNOWN, error, child)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"disposition": self.disposition.value}
        if self.error is not None:
            out["error"] = self.error
        if self.child is not None:
            out["child"] = {
                "providerSessionId": self.child.provider_session_id,
                "forkedFromId": self.child.forked_from_id,
                "providerTurnIds": list(self.child.provider_turn_ids),
            }
        if self.binding is not None:
            binding: dict[str, Any] = {
                "mode": self.binding.mode.value,
                "receipt": dict(self.binding.receipt),
            }
            if self.binding.turn_bindings is not None:
                binding["turnBindings"] = dict(self.binding.turn_bindings)
            out["binding"] = binding
        return out

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> ForkResult:
        """The host's reading of a worker's answer. Raises `MalformedMessage` for an answer
        that is not a `ForkResult` (an unknown disposition, `accepted` without a child or a
        binding, a binding mode that does not exist): the saga records such an answer
        `unknown`, never `failed` (the provider call may have happened)."""
        raw = str(result.get("disposition") or "")
        error_raw = result.get("error")
        error = None if error_raw is None else str(error_raw)
        try:
            disposition = DeliveryDisposition(raw)
        except ValueError:
            raise MalformedMessage(f"{raw or 'no disposition'}: {error or ''}") from None
        child_raw = result.get("child")
        child = None
        if isinstance(child_raw, Mapping):
            child = ForkChild(
                provider_session_id=str(child_raw.get("providerSessionId") or ""),
                forked_from_id=str(child_raw.get("forkedFromId") or ""),
                provider_turn_ids=tuple(str(t) for t in child_raw.get("providerTurnIds") or ()),
            )
        binding_raw = result.get("binding")
        binding = None
        if isinstance(binding_raw, Mapping):
            mode_raw = str(binding_raw.get("mode") or "")
            try:
                mode = ProviderStateBindingMode(mode_raw)
            except ValueError:
                raise MalformedMessage(f"unknown binding mode {mode_raw!r}") from None
            receipt = binding_raw.get("receipt")
            turn_bindings = binding_raw.get("turnBindings")
            binding = ForkBinding(
                mode=mode,
                receipt=dict(receipt) if isinstance(receipt, Mapping) else {},
                turn_bindings=dict(turn_bindings) if isinstance(turn_bindings, Mapping) else None,
            )
        if disposition is DeliveryDisposition.ACCEPTED:
            if child is None:
                raise MalformedMessage("no child provider session id")
            if binding is None:
                raise MalformedMessage("no binding receipt")
        return cls(disposition, error, child, binding)


# -- fork.resolve ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolveRequest:
    """The params of `fork.inspect` and `fork.quarantine` (issue 21 §1): which operation's
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
        }

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


# -- turn events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnStarted:
    TYPE: ClassVar[str] = "turn.started"
    turn_id: str
    provider_turn_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id, "providerTurnId": self.provider_turn_id}


@dataclass(frozen=True, slots=True)
class TurnItem:
    """One Message of the Turn (`item: {kind, text, payload}`: assistant, reasoning,
    tool_call, tool_result, user, …); `item` is kept as sent."""

    TYPE: ClassVar[str] = "item"
    turn_id: str
    item: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.item.get("kind") or "assistant")

    @property
    def text(self) -> str | None:
        text = self.item.get("text")
        return None if text is None else str(text)

    @property
    def payload(self) -> dict[str, Any]:
        return dict(self.item.get("payload") or {})

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id, "item": dict(self.item)}


@dataclass(frozen=True, slots=True)
class InteractionRequested:
    TYPE: ClassVar[str] = "interaction.requested"
    turn_id: str
    request_id: str
    kind: str
    input: Mapping[str, Any]
    # Any further keys a driver sends (kept as sent).
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "requestId": self.request_id,
            "kind": self.kind,
            "input": dict(self.input),
            **self.extra,
        }


@dataclass(frozen=True, slots=True)
class TurnBindingMoved:
    """`turn.binding`: the Turn's provider checkpoint (binding JSON); may come after the Turn
    settled (Claude's trailing system message)."""

    TYPE: ClassVar[str] = "turn.binding"
    turn_id: str
    binding_json: str

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id, "bindingJson": self.binding_json}


@dataclass(frozen=True, slots=True)
class TurnCompleted:
    TYPE: ClassVar[str] = "turn.completed"
    turn_id: str
    provider_turn_id: str
    outcome: str  # domain.enums.TurnOutcome's values
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "providerTurnId": self.provider_turn_id,
            "outcome": self.outcome,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class MessageDelta:
    """A piece of a reply as it streams: published, never stored."""

    TYPE: ClassVar[str] = "message.delta"
    turn_id: str
    item_id: str
    kind: str
    delta: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "itemId": self.item_id,
            "kind": self.kind,
            "delta": self.delta,
        }


@dataclass(frozen=True, slots=True)
class TurnActivity:
    """The host's own note that a reply is streaming (the Turn is not hung)."""

    TYPE: ClassVar[str] = "turn.activity"
    turn_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id}


TurnEvent = (
    TurnStarted
    | TurnItem
    | InteractionRequested
    | TurnBindingMoved
    | TurnCompleted
    | MessageDelta
    | TurnActivity
)
"""Every event a driver streams for a Turn (plus the host's `turn.activity`)."""


def turn_event_from_wire(event: Mapping[str, Any]) -> TurnEvent:
    """The typed event of a wire map; `MalformedMessage` for an unknown `type`."""
    kind = event.get("type")
    turn_id = str(event.get("turnId") or "")
    if kind == TurnStarted.TYPE:
        return TurnStarted(turn_id, str(event.get("providerTurnId") or ""))
    if kind == TurnItem.TYPE:
        item = event.get("item")
        return TurnItem(turn_id, dict(item) if isinstance(item, Mapping) else {})
    if kind == InteractionRequested.TYPE:
        known = {"type", "turnId", "requestId", "kind", "input"}
        raw_input = event.get("input")
        return InteractionRequested(
            turn_id,
            str(event.get("requestId")),
            str(event.get("kind") or "question"),
            dict(raw_input) if isinstance(raw_input, Mapping) else {},
            {k: v for k, v in event.items() if k not in known},
        )
    if kind == TurnBindingMoved.TYPE:
        return TurnBindingMoved(turn_id, str(event.get("bindingJson") or ""))
    if kind == TurnCompleted.TYPE:
        error = event.get("error")
        return TurnCompleted(
            turn_id,
            str(event.get("providerTurnId") or ""),
            str(event.get("outcome") or "completed"),
            None if error is None else str(error),
        )
    if kind == MessageDelta.TYPE:
        return MessageDelta(
            turn_id,
            str(event.get("itemId") or ""),
            str(event.get("kind") or ""),
            str(event.get("delta") or ""),
        )
    if kind == TurnActivity.TYPE:
        return TurnActivity(turn_id)
    raise MalformedMessage(f"unknown turn event type {kind!r}")
