"""The narrow ports through which the actors reach the outside: driver workers, the provider
catalog (version gates, binding modes), failpoints and the host's runtime slots.

The composition root (`agenthost/`) adapts the real supervisor and catalog to these
Protocols; the actors never import zmq or a driver module (ARCHITECTURE.md layering).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from domain.worker_messages import (
    Attestation,
    ForkRequest,
    ForkResult,
    HistoryRequest,
    InteractionRespond,
    ResolveAdopt,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
    RuntimeAttest,
    SessionHistory,
    SessionStart,
    SessionStarted,
    SessionStop,
    TurnAccepted,
    TurnInterrupt,
    TurnStart,
)


class BindingState(StrEnum):
    """`providerForkBindingState` of a Turn (PROTOCOL.md)."""

    BOUND = "bound"
    RECOVERY_REQUIRED = "recovery_required"
    UNAVAILABLE = "unavailable"


class NotDelivered(Exception):
    """The request never left the host (worker down before send): nothing happened."""


class DeliveryUnknown(Exception):
    """The request was sent but no answer came (worker died, timeout): it may have happened."""


class WorkerFailed(Exception):
    """The worker answered with an error map."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        super().__init__(str(error.get("message", error)))
        self.error = dict(error)


class WorkerPort(Protocol):
    """Requests to the provider worker processes, one typed method per worker call (the
    request types name their worker method and carry its params; the answers are read back
    typed). Futures fail with the exceptions above; a malformed answer fails its future with
    `domain.worker_messages.MalformedMessage`."""

    def attest(
        self, provider: str, request: RuntimeAttest, timeout: float
    ) -> Future[Attestation]: ...

    def start_session(
        self, provider: str, request: SessionStart, timeout: float
    ) -> Future[SessionStarted]: ...

    def stop_session(self, provider: str, request: SessionStop, timeout: float) -> Future[None]: ...

    def history(
        self, provider: str, request: HistoryRequest, timeout: float
    ) -> Future[SessionHistory]: ...

    def start_turn(
        self, provider: str, request: TurnStart, timeout: float
    ) -> Future[TurnAccepted]: ...

    def interrupt_turn(
        self, provider: str, request: TurnInterrupt, timeout: float
    ) -> Future[None]: ...

    def respond_interaction(
        self, provider: str, request: InteractionRespond, timeout: float
    ) -> Future[None]: ...

    def fork(self, provider: str, request: ForkRequest, timeout: float) -> Future[ForkResult]:
        """The saga's one provider fork call (never retried: law 1)."""
        ...

    def inspect_fork(
        self, provider: str, request: ResolveRequest, timeout: float
    ) -> Future[ResolveInspection]: ...

    def adopt_fork(
        self, provider: str, request: ResolveAdopt, timeout: float
    ) -> Future[ForkResult]: ...

    def quarantine_fork(
        self, provider: str, request: ResolveRequest, timeout: float
    ) -> Future[ResolveQuarantined]: ...


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """Static facts about a provider's driver that the saga checks before any dispatch."""

    provider: str
    binding_mode: str  # "host_copy" | "provider_owned"
    binder_available: bool
    home_dir_name: str


class ProviderCatalog(Protocol):
    """Provider-specific rules the Host must not hard-code (seed 000 §3.2)."""

    def providers(self) -> tuple[str, ...]: ...

    def driver_info(self, provider: str) -> DriverInfo: ...

    def fork_through_turn_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        """From the persisted attestation only: projection never spawns a process."""
        ...

    def binding_state(
        self, provider: str, root_provider_turn_id: str | None, binding_json: str | None
    ) -> BindingState: ...

    def turn_forkable(
        self, provider: str, root_provider_turn_id: str | None, binding_json: str | None
    ) -> bool:
        """The same per-Turn verdict as `binding_state == bound`, used by prepare."""
        ...


class RuntimeSlotsPort(Protocol):
    """The host's table of live provider runtimes (actors/session_runtime `RuntimeSlots`, one
    per daemon), as a Session actor's parts use it: a port so that `HostContext`, which the fork
    saga's port reads, never imports a Session part."""

    def acquire(
        self, provider: str, key: str, granted: Callable[[], None], *, fork: bool = False
    ) -> None: ...

    def hold_warm(self, provider: str, key: str, *, fork: bool = False) -> bool: ...

    def started(self, provider: str, key: str) -> None: ...

    def release(self, provider: str, key: str) -> None: ...

    def forget(self, provider: str, key: str) -> None: ...

    def status(self) -> dict[str, dict[str, int]]: ...


class Failpoints(Protocol):
    """The registry (drivers/failpoints.py): `armed` empty means `hit` does nothing, so a site
    on the fork's path reads it first and makes no call while nothing is armed."""

    @property
    def armed(self) -> Mapping[str, object]: ...

    def hit(self, name: str) -> None: ...


EventSink = Callable[[str, str, Mapping[str, Any]], None]
