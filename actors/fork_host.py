"""What a fork saga or a `fork.resolve` needs from the Session actor it runs in, and nothing
else: the narrow seam between `actors/fork_saga.py`, `actors/fork_resolve.py` and
`actors/session_actor.py` (which satisfies `ForkHost`; neither fork module imports it, an
import-linter contract).

Why a port of its own: the saga is the crash-safety core (seed 000 §6–§10); pinning what it may
touch — the fork operations in the store, the worker port, the catalog's fork rules, failpoints,
the actor's continuation and timer, the runtime preparation it shares with turns — keeps a
change to turn handling from reaching it by accident, and lets it be read on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from actors.context import LiveOperations, Timeouts
from actors.messages import Reply
from actors.ports import Failpoints, ProviderCatalog, WorkerPort
from actors.timers import TimerHandle
from domain.errors import HostError
from storage.fork_resolution import ForkResolution
from storage.models import (
    ForkOperation,
    ForkPrepareRequest,
    ProviderForkEvidence,
    Session,
    Turn,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PreparedRuntime:
    """The runtime identity resolved once per attempt (seed 000 §6.3): used for attestation,
    re-attestation, dispatch, and frozen into a fork child's cwd/settings/runtime context."""

    provider: str
    home: str
    cwd: str
    settings: Mapping[str, Any]
    provider_session_id: str
    runtime_context: Mapping[str, Any]
    # Issue 20: the generation of the worker runtime `session.start` found or started (None:
    # the driver has none) and that start's own attested verdict (its `runtimeContext`). A
    # fork re-attests only when this generation is not the one its Session last attested.
    generation: str | None = None
    verdict: Mapping[str, Any] | None = None


class SagaStore(Protocol):
    """The store's fork operations (and the two reads they need) — the saga's and the
    resolver's whole view of `storage.Store`."""

    def get_session(self, ws: str, sid: str) -> Session: ...

    def timeline(
        self, ws: str, sid: str, *, after_sequence: int = 0, limit: int = 100
    ) -> tuple[list[Turn], int | None]: ...

    def existing_fork(
        self,
        ws: str,
        *,
        source_session_id: str,
        request_id: str,
        target_session_id: str,
        turn_id: str,
        point_kind: str = ...,
    ) -> ForkOperation | None: ...

    def prepare_fork(
        self,
        ws: str,
        req: ForkPrepareRequest,
        *,
        turn_forkable: Callable[[str | None, str | None], bool] | None = None,
    ) -> tuple[ForkOperation, bool]: ...

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation: ...

    def mark_fork_dispatching(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]: ...

    def mark_fork_failed(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]: ...

    def mark_fork_unknown(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]: ...

    def mark_fork_provider_accepted(
        self, ws: str, op_id: str, evidence: ProviderForkEvidence
    ) -> tuple[ForkOperation, bool]: ...

    def commit_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]: ...

    # fork.resolve (issue 21 §1)
    def claimed_provider_children(self, ws: str, source_session_id: str) -> list[str]: ...

    def get_fork_resolution(self, ws: str, op_id: str) -> ForkResolution | None: ...

    def begin_resolution(
        self,
        ws: str,
        op_id: str,
        *,
        request_id: str,
        action: str,
        child_id: str | None,
        evidence: Any,
    ) -> tuple[ForkResolution, bool]: ...

    def adopt_unknown_fork(
        self, ws: str, op_id: str, evidence: ProviderForkEvidence
    ) -> tuple[ForkOperation, bool]: ...

    def abandon_fork(self, ws: str, op_id: str, result: Any) -> tuple[ForkOperation, bool]: ...

    def finish_resolution(self, ws: str, op_id: str, result: Any) -> ForkResolution | None: ...

    def rollback_resolution(self, ws: str, op_id: str) -> None: ...


class LiveSaga(Protocol):
    """A saga running in this process: another caller of the same operation joins it."""

    def join(self, reply: Reply) -> None: ...


class ForkHost(Protocol):
    """The Session actor as a fork saga / resolver sees it. Everything runs on the actor's own
    thread: `later` and `after` bring a worker answer or a timer back to it."""

    ws: str
    sid: str
    key: str
    sagas: dict[str, LiveSaga]
    """Operation id → its saga in this actor (the actor stays busy while any runs)."""
    resolves: dict[str, Any]
    """Operation id → the `fork.resolve` in flight for it (actors/fork_resolve.py)."""
    attested_runtime: tuple[str, ...] | None
    """The runtime this Session's last passed `runtime.attest` proved — its generation and the
    prepared home, cwd and settings it was asked about (actors/fork_saga.py, issue 20)."""

    @property
    def store(self) -> SagaStore: ...

    @property
    def workers(self) -> WorkerPort: ...

    @property
    def catalog(self) -> ProviderCatalog: ...

    @property
    def failpoints(self) -> Failpoints: ...

    @property
    def timeouts(self) -> Timeouts: ...

    @property
    def live_operations(self) -> LiveOperations: ...

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path: ...

    def session(self) -> Session: ...

    def prepare_runtime(
        self, session: Session, on_ready: Callable[[PreparedRuntime | HostError], None]
    ) -> None:
        """The runtime preparation turns use (`session.start`, slots, re-bind)."""
        ...

    def later(
        self,
        future: Future[T],
        on_done: Callable[[Future[T]], None],
        reply: Callable[[Any], None] | None = None,
    ) -> None: ...

    def after(self, seconds: float, fn: Callable[[], None]) -> TimerHandle: ...

    def apply_late_bindings(self) -> None:
        """A fork of this source ended: write the checkpoints its fence deferred."""
        ...
