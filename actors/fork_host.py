"""What a fork saga or a `fork.resolve` needs from the Session actor it runs in, and nothing
else: the narrow seam between `actors/fork_saga.py`, `actors/fork_resolve.py` and
`actors/session_actor.py` (which satisfies `ForkHost`; neither fork module imports it, an
import-linter contract).

Why a port of its own: the saga is the crash-safety core (seed 000 §6–§10); pinning what it may
touch — the fork operations in the store (`SagaStore`; `fork.resolve`'s `ResolveStore`: both
in actors/store_ports.py), the worker port, the catalog's fork rules, failpoints,
the actor's continuation and timer, the runtime preparation it shares with turns — keeps a
change to turn handling from reaching it by accident, and lets it be read on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from actors.context import LiveOperations, Timeouts
from actors.messages import Reply
from actors.pool import TimerHandle
from actors.ports import Failpoints, ProviderCatalog, WorkerPort
from actors.store_ports import ResolveStore, SagaStore
from domain.errors import HostError
from storage.models import (
    Session,
)
from workspace.worktree import ForkTrees

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
    # The generation of the worker runtime `session.start` found or started (None:
    # the driver has none) and that start's own attested verdict (its `runtimeContext`). A
    # fork re-attests only when this generation is not the one its Session last attested.
    generation: str | None = None
    verdict: Mapping[str, Any] | None = None
    # What lets the next fork reuse this runtime without `session.start`: the pid
    # of the process that is the runtime (checked alive first; None: the driver has none),
    # the driver's idle limit (the reuse window stays inside it) and the pid of the worker
    # the runtime lives in or under (checked alive too: the runtime dies with it).
    pid: int | None = None
    idle_s: float | None = None
    worker_pid: int | None = None


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
    tree_records: set[str]
    """Failed forks whose removed tree's record waits for a retry (`fork_saga.end_failed_tree`):
    the actor stays busy, so no idle stop drops the retry."""
    attested_runtime: tuple[str, ...] | None
    """The runtime this Session's last passed `runtime.attest` proved — its generation and the
    prepared home, cwd and settings it was asked about (actors/fork_saga.py)."""

    @property
    def store(self) -> SagaStore:
        """The saga's store port (actors/store_ports.py)."""
        ...

    @property
    def resolve_store(self) -> ResolveStore:
        """`fork.resolve`'s store port (actors/store_ports.py)."""
        ...

    @property
    def workers(self) -> WorkerPort: ...

    @property
    def catalog(self) -> ProviderCatalog: ...

    @property
    def failpoints(self) -> Failpoints: ...

    @property
    def timeouts(self) -> Timeouts: ...

    @property
    def fork_trees(self) -> ForkTrees | None:
        """Makes and removes `worktree` forks' trees (None: no checkpoints on this host)."""
        ...

    @property
    def retry_failed_tree(self) -> Callable[[str, str, str, str], None] | None:
        """Hands a failed fork's tree git could not remove (workspace, operation, path,
        git's error) to the daemon's live retries (None: the next start removes it)."""
        ...

    @property
    def live_operations(self) -> LiveOperations: ...

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path: ...

    def session(self) -> Session: ...

    def cached_session(self) -> Session:
        """The Session row for a fork's start, from the actor's row cache (emptied
        by every message that may write the row, replaced by the actor's own runtime write)."""
        ...

    def warm_runtime(self, session: Session) -> PreparedRuntime | None:
        """The runtime a fork may use without `session.start`, its slot held, or
        None: then `prepare_runtime`. Only a runtime whose generation this Session's last
        fork attestation proved, still at the identity `session` asks for, its process alive
        and its start recent; the worker still refuses the fork if the generation moved."""
        ...

    def forget_warm_runtime(self) -> None:
        """A fork did not commit: its next one starts the runtime again."""
        ...

    def prepare_runtime(
        self,
        session: Session,
        on_ready: Callable[[PreparedRuntime | HostError], None],
        *,
        fork: bool = False,
    ) -> None:
        """The runtime preparation turns use (`session.start`, slots, re-bind); a `fork`
        takes its slot within the forks' share (actors/session_runtime `RuntimeSlots`)."""
        ...

    def later(
        self,
        future: Future[T],
        on_done: Callable[[Future[T]], None],
        reply: Callable[[Any], None] | None = None,
    ) -> None: ...

    def after(self, seconds: float, fn: Callable[[], None]) -> TimerHandle: ...

    def use_homes(self, session_ids: Sequence[str], go: Callable[[], None]) -> None:
        """Run `go` (a worker call that may start an app-server in these Sessions' runtime
        folders) now, or on this actor's thread once a delete's removal of one of them has
        ended; its caller ends the use with `homes_done` when the worker has answered
        (actors/home_uses), and `home_call_ended` once that answer is back on this actor's
        thread (or `go` sent nothing): the actor stays busy until then."""
        ...

    def homes_done(self, session_ids: Sequence[str]) -> None:
        """The worker call `use_homes` ran has answered (from any thread)."""
        ...

    def home_call_ended(self) -> None:
        """The call `use_homes` took is over on this actor's thread."""
        ...

    def apply_late_bindings(self) -> None:
        """A fork of this source ended: write the checkpoints its fence deferred."""
        ...
