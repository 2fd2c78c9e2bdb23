"""The narrow ports through which the actors reach the outside: driver workers, the provider
catalog (version gates, binding modes) and failpoints.

The composition root (`agenthost/`) adapts the real supervisor and catalog to these
Protocols; the actors never import zmq or a driver module (ARCHITECTURE.md layering).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from domain.enums import DeliveryDisposition as DeliveryDisposition
from domain.worker_messages import ForkRequest, ForkResult


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
    """Requests to the provider worker processes; futures fail with the exceptions above."""

    def request(
        self, provider: str, method: str, params: Mapping[str, Any], timeout: float
    ) -> Future[dict[str, Any]]: ...


def request_fork(
    workers: WorkerPort, provider: str, request: ForkRequest, timeout: float
) -> Future[ForkResult]:
    """The typed `fork` call: `ForkRequest.to_wire()` goes out over the port, the answer comes
    back as `ForkResult.from_wire()` (the same maps the worker reads and writes with the same
    types). A malformed answer fails the future with `domain.worker_messages.MalformedMessage`;
    the port's delivery exceptions pass through unchanged."""
    out: Future[ForkResult] = Future()

    def _done(f: Future[dict[str, Any]]) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(ForkResult.from_wire(f.result()))
        except Exception as parse_exc:  # noqa: BLE001 - the waiter always gets an outcome
            out.set_exception(parse_exc)

    workers.request(provider, ForkRequest.METHOD, request.to_wire(), timeout).add_done_callback(
        _done
    )
    return out


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


class Failpoints(Protocol):
    def hit(self, name: str) -> None: ...


EventSink = Callable[[str, str, Mapping[str, Any]], None]
