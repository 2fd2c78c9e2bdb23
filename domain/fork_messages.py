"""The fork request and answer between the host and a driver worker (seed 000 §7, §7.1),
standard library only: the saga builds a `ForkRequest` and reads a `ForkResult`; the worker
hands the driver the `ForkRequest` and sends its `ForkResult`. `MalformedMessage` is what every
worker message's `from_wire` raises on a map without its type's shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from domain.enums import DeliveryDisposition, ProviderStateBindingMode


class MalformedMessage(ValueError):
    """A worker message that does not have its type's shape; the receiver treats the answer as
    unverifiable (a fork answer → `unknown`) or drops the event."""


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
    # The child's own working directory when it differs from the source's (a `worktree`
    # fork): a provider that files its transcript by directory files the child's there.
    cwd: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out = {"agentSessionId": self.agent_session_id, "home": self.home}
        if self.cwd:
            out["cwd"] = self.cwd
        return out


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
        let this fork leave the host; the worker refuses it (`not_started`) when
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
                cwd=str(tgt["cwd"]) if tgt.get("cwd") else None,
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
