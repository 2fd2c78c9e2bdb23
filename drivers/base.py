"""The provider-driver port (`ProviderDriver`). The typed values of a driver fork (request,
delivery disposition, child evidence and binding receipt, seed 000 §7, §7.1) are the host's and
the worker's shared `domain.worker_messages` types, imported from there.

The worker main dispatches every worker method to a `ProviderDriver`; each driver module exposes
`create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ProviderDriver`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from domain.turn_events import TurnEvent
from domain.worker_messages import (
    ForkRequest,
    ForkResult,
    ResolveAdopt,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from drivers.failpoints import Failpoints

SERVED_BY = "_servedByGeneration"
"""A driver's `session.start` answer's key for the generation (its `runtime_generation`'s
value) of the runtime that gave the verdict: a start that spawned the runtime is stamped by it
(drivers/worker.py `_stamped`). Never sent to the host."""

Emit = Callable[[str, TurnEvent], None]
"""`emit(agent_session_id, event)`: stream one turn event (a `domain.worker_messages.TurnEvent`)
to the host. Thread-safe; drivers call it from whatever thread observes the provider. Drivers
never build the event's wire map: the worker serialises it (`to_wire`) as it leaves."""


class ProviderDriver(Protocol):
    """One provider kind inside its worker process. Params and results are the worker-method
    maps of internals.md; raise `domain.errors.HostError` subclasses for typed failures.

    Every method may be called concurrently from the worker's thread pool (turns on different
    sessions stream at once); a driver serializes per session itself.
    """

    def attest(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`runtime.attest {home, cwd, env?}` → `{driverKind, driverVersion, userAgent,
        bindingMode, binderAvailable}`."""
        ...

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.start` (start or resume) → `{providerSessionId, runtimeContext}`, and
        optionally `SERVED_BY`: the driver's generation of the runtime that gave the verdict
        (the worker takes it off the answer and stamps it while still live)."""
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

    def inspect_fork(self, request: ResolveRequest) -> ResolveInspection:
        """`fork.inspect`: the provider children this operation may have left (those its
        Turns attribute to it), each with what the provider reads in it. Never forks."""
        ...

    def adopt_fork(self, request: ResolveAdopt) -> ForkResult:
        """`fork.adopt`: the idempotent binder on one verified child; answers like `fork`."""
        ...

    def quarantine_fork(self, request: ResolveRequest) -> ResolveQuarantined:
        """`fork.quarantine`: move `request.child_ids` aside, never delete."""
        ...

    def after_answer(self) -> None:
        """Work the driver left for after a `fork`'s answer has left, run by the worker on the
        fork's own thread right after the send (Claude: the next child's home made ahead);
        nothing for most drivers."""
        ...

    def close(self) -> None: ...


DriverFactory = Callable[[Mapping[str, Any], Failpoints], ProviderDriver]
