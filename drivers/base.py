"""The provider-driver port (`ProviderDriver`) and the typed values of a driver fork: request,
delivery disposition, child evidence and binding receipt (seed 000 §7, §7.1).

The worker main dispatches every worker method to a `ProviderDriver`; each driver module exposes
`create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ProviderDriver`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from drivers.failpoints import Failpoints

Emit = Callable[[str, dict[str, Any]], None]
"""`emit(agent_session_id, event)`: stream one turn event (internals.md "Turn events") to the host.
Thread-safe; drivers call it from whatever thread observes the provider."""


class DeliveryDisposition(StrEnum):
    """What the host may conclude about a provider fork (seed 000 §7.1)."""

    NOT_STARTED = "not_started"
    """Failed before the provider call was sent: certainly no provider child. Host → failed."""
    REJECTED = "rejected"
    """The provider answered with an explicit JSON-RPC/SDK error. Host → failed."""
    UNKNOWN = "unknown"
    """Sent, then timeout/disconnect/unverifiable answer/binder failure. Host → unknown, never
    redispatched."""
    ACCEPTED = "accepted"
    """A verified child exists and its provider state is bound. Host → provider_accepted."""


class ProviderStateBindingMode(StrEnum):
    HOST_COPY = "host_copy"
    """The binder copies the child's provider state into the child's own home."""
    PROVIDER_OWNED = "provider_owned"
    """The provider keeps the child's state where the child's session will read it."""


class TurnOutcome(StrEnum):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ForkSource:
    agent_session_id: str
    provider_session_id: str
    home: str
    cwd: str


@dataclass(frozen=True, slots=True)
class ForkTarget:
    agent_session_id: str
    home: str


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """The provider-neutral input of a driver fork: the frozen ordered provider Turn prefix
    (`provider_turn_ids`, last = the boundary Turn) and the frozen driver identity."""

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

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> ForkRequest:
        src = params.get("source") or {}
        tgt = params.get("target") or {}
        known = {
            "source",
            "target",
            "providerTurnIds",
            "title",
            "driverKind",
            "driverVersion",
            "sourceTurnId",
        }
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
            extra={k: v for k, v in params.items() if k not in known},
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


class ProviderDriver(Protocol):
    """One provider kind inside its worker process. Params and results are the worker-method
    maps of internals.md; raise `storage.errors.HostError` subclasses for typed failures.

    Every method may be called concurrently from the worker's thread pool (turns on different
    sessions stream at once); a driver serializes per session itself.
    """

    def attest(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`runtime.attest {home, cwd, env?}` → `{driverKind, driverVersion, userAgent,
        bindingMode, binderAvailable}`."""
        ...

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.start` (start or resume) → `{providerSessionId, runtimeContext}`."""
        ...

    def stop_session(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def start_turn(self, params: Mapping[str, Any], emit: Emit) -> dict[str, Any]:
        """`turn.start {agentSessionId, turnId, text}` → `{providerTurnId}`; events follow
        through `emit` until `turn.completed`."""
        ...

    def interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def respond_interaction(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def fork(self, request: ForkRequest) -> ForkResult:
        """Never raises for a provider outcome: every failure is a disposition."""
        ...

    def close(self) -> None: ...


DriverFactory = Callable[[Mapping[str, Any], Failpoints], ProviderDriver]
