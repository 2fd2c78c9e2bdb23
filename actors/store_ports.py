"""The store as each actor sees it: one narrow port per actor, listing only what it calls.

`storage.Store` is one owner (`db`: connections, the write baton, batches) and one part per
concern (`sessions`, `turns`, `history`, `fork_prepare`, ...); no actor needs more than a
handful of their methods. Each port here is a `typing.Protocol` naming the parts one actor
reaches and, on each, exactly the methods (and the parameters) it calls, so what an actor may
read or write is visible in one place, a change to one actor cannot start leaning on another's
durability boundary by accident, and a test (or another store) can stand in for it without
implementing the rest. The composition root (`agenthost/daemon.py`) hands over the real
`storage.Store`; it fits every port structurally, which `mypy --strict` checks where
`HostContext` is built. The actors import `storage` only for its values and errors, never the
`Store` class nor its parts (an import-linter contract in pyproject.toml).

Who uses which port (each port's docstring says why it is separate):

- `SessionActorStore`: `SessionActor` (actors/session_*.py, turn_writes.py);
- `SagaStore`: the fork saga (actors/fork_saga.py), through `ForkHost.store`;
- `ResolveStore`: `fork.resolve` (actors/fork_resolve.py), through `ForkHost.resolve_store`;
- `HostActorStore`: `HostActor` (actors/host_actor.py);
- `RestartRuleStore`: `actors.recovery.apply_restart_rule` (and, inside `SagaStore`, the saga);
- `StartupRecoveryStore`: `recover_fork_operations`, `settle_orphaned_turns`;
- `DeletedSessionsStore`: `actors.runtime_dirs.sweep`.

`ActorStore` is their union: what `HostContext.store` must be (the Session actor hands its
store to the saga and the resolver it runs).

A port names a part as a read-only property, so the real part (a plain attribute of the
`Store`, with more methods than the port lists) fits it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from storage import models as store_models
from storage.models import (
    ChangeEvent,
    ForkOperation,
    ForkPrepareRequest,
    ForkResolution,
    Interaction,
    LeftoverCommit,
    Message,
    NewMessage,
    PlanWorkspace,
    ProviderForkEvidence,
    Session,
    TreeToRemove,
    Turn,
    TurnBound,
)

# -- the parts' methods, grouped by part ----------------------------------------------------


class TimelineReads(Protocol):
    """`store.history`: the Session timeline."""

    def timeline(
        self, ws: str, sid: str, *, after_sequence: int = 0, limit: int = 100
    ) -> tuple[list[Turn], int | None]: ...


class TurnHistory(TimelineReads, Protocol):
    """`store.history`: a Turn's Messages and Interactions."""

    def append_message(
        self,
        ws: str,
        sid: str,
        turn_id: str | None,
        *,
        kind: str,
        text: str | None,
        payload: Mapping[str, Any] | None = None,
    ) -> Message: ...

    def open_interaction(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        *,
        request_id: str,
        kind: str,
        input: Mapping[str, Any],
    ) -> Interaction: ...

    def resolve_interaction(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        request_id: str,
        output: Mapping[str, Any],
        *,
        delivered: bool = False,
    ) -> Interaction: ...


class SessionRecord(Protocol):
    """`store.sessions`: the Session row and its runtime record (actors/session_runtime.py)."""

    def get_session(self, ws: str, sid: str) -> Session: ...

    def update_runtime(
        self,
        ws: str,
        sid: str,
        *,
        provider_session_id: str | None = None,
        runtime_context: Mapping[str, Any] | None = None,
    ) -> Session: ...


class DeletedSessions(Protocol):
    """`store.sessions`: which Sessions are deleted."""

    def deleted_sessions(self) -> list[tuple[str, str]]: ...

    def runtime_owners(self) -> list[tuple[str, str]]: ...

    def runtime_owners_among(self, session_ids: Sequence[str]) -> list[tuple[str, str]]: ...


class TurnWrites(Protocol):
    """`store.turns`: the submit claim and a Turn's durable writes."""

    def get_turn(self, ws: str, sid: str, turn_id: str) -> Turn: ...

    def active_turn(self, ws: str, sid: str) -> Turn | None: ...

    def turns_missing_binding(self, ws: str, sid: str) -> list[str]: ...

    def has_bound_turn(self, ws: str, sid: str) -> bool: ...

    def last_completed_provider_turn(self, ws: str, sid: str) -> str | None: ...

    def unanswered_turns_missing_binding(self, ws: str, sid: str) -> list[str]: ...

    def claim_submit(
        self, ws: str, sid: str, request_id: str, text: str, turn_id: str | None = None
    ) -> tuple[Turn, bool]: ...

    def bind_provider_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        root_provider_turn_id: str,
        binding_json: str | None = None,
    ) -> Turn:
        """The re-bind from the provider's history (actors/session_runtime.py)."""
        ...

    def mark_host_only(self, ws: str, sid: str, turn_id: str) -> bool:
        """The re-bind's proof that the provider never got a settled Turn (a final history
        without it): whether this write marked it."""
        ...

    # A Turn's own writes answer nothing back (no read-back of the whole Turn
    # inside the writer's baton); the actor has no use for it.
    def record_provider_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        root_provider_turn_id: str,
        binding_json: str | None = None,
    ) -> None: ...

    def record_turn_binding(self, ws: str, sid: str, turn_id: str, binding_json: str) -> None: ...

    def record_settlement(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        *,
        outcome: str,
        final_assistant_message_id: str | None = None,
        error: str | None = None,
        checkpoint_json: str | None = None,
        turn: Turn | None = None,
        bound: TurnBound | None = None,
        messages: tuple[NewMessage, ...] = (),
        host_only: bool = False,
    ) -> bool: ...


class TurnCheckpoints(Protocol):
    """`store.turns`: a Turn's workspace checkpoint record."""

    def turn_checkpoint(self, ws: str, sid: str, turn_id: str) -> dict[str, Any] | None:
        """The Turn's workspace checkpoint record (actors/checkpoints.py), None if it has
        none (settled before checkpoints existed, or a cloned Turn of a fork child)."""
        ...


class OrphanedTurns(Protocol):
    """`store.turns`: the Turns a dead process left active, and their settle."""

    def all_active_turns(self) -> list[tuple[str, str, str]]: ...

    def settle_turn(
        self,
        ws: str,
        sid: str,
        turn_id: str,
        *,
        outcome: str,
        error: str | None = None,
        include_deleted: bool = False,
    ) -> tuple[Turn, bool]: ...


class FenceReads(Protocol):
    """`store.fork_fence`: whether a fork operation holds the Session now."""

    def check_fence(self, ws: str, sid: str) -> None: ...


class ForkReads(Protocol):
    """`store.fork_queries`: one fork operation by id."""

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation: ...


class ForkPrepares(Protocol):
    """`store.fork_prepare`: the idempotent prepare and the lookup of a request's operation."""

    def existing_fork(
        self,
        ws: str,
        *,
        source_session_id: str,
        request_id: str,
        target_session_id: str,
        turn_id: str,
        point_kind: str = ...,
        workspace: str = ...,
    ) -> ForkOperation | None: ...

    def prepare_fork(
        self,
        ws: str,
        req: ForkPrepareRequest,
        *,
        turn_forkable: Callable[[str | None, str | None], bool] | None = None,
        plan_workspace: PlanWorkspace | None = None,
        durable: bool = True,
        dispatching: bool = False,
    ) -> tuple[ForkOperation, bool]: ...


class RestartMoves(Protocol):
    """`store.fork_transitions`: the two status moves of the restart rule."""

    def mark_fork_failed(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]: ...

    def mark_fork_unknown(self, ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]: ...


class SagaMoves(RestartMoves, Protocol):
    """`store.fork_transitions`: the saga's guarded status moves."""

    def mark_fork_dispatching(
        self, ws: str, op_id: str, *, known: ForkOperation | None = None
    ) -> tuple[ForkOperation, bool]: ...

    def mark_fork_provider_accepted(
        self,
        ws: str,
        op_id: str,
        evidence: ProviderForkEvidence,
        *,
        durable: bool = True,
        known: ForkOperation | None = None,
    ) -> tuple[ForkOperation, bool]: ...


class ForkCommits(Protocol):
    """`store.fork_commit`: the child written from the snapshot."""

    def commit_fork(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]: ...


class BatchedCommits(ForkCommits, Protocol):
    """`store.fork_commit`: recovery's batched commit."""

    def commit_fork_operations(
        self, ops: Sequence[store_models.OperationKey]
    ) -> tuple[int, int]: ...


class ForkWorktrees(Protocol):
    """`store.fork_workspace`: a `worktree` fork's tree on its operation."""

    def record_fork_worktree(self, ws: str, op_id: str) -> tuple[ForkOperation, bool]: ...

    def mark_fork_worktree_removed(self, ws: str, op_id: str) -> bool: ...

    def fork_worktrees_to_remove(self, limit: int = 500) -> list[TreeToRemove]: ...


class LeftoverForks(Protocol):
    """`store.fork_recovery`: start-up leftovers' status changes all at once, and the
    remaining (commits) listed by their keys."""

    def settle_leftover_fork_statuses(
        self, *, prepared_error: str, dispatching_error: str
    ) -> tuple[int, int]: ...

    def leftover_commits(self) -> list[LeftoverCommit]: ...


class Resolutions(Protocol):
    """`store.resolution`: `fork.resolve`'s own record and the ways out of `unknown`."""

    def claimed_provider_children(self, ws: str, source_session_id: str) -> list[str]: ...

    def other_fork_prefixes(
        self, ws: str, source_session_id: str, operation_id: str
    ) -> list[tuple[str, ...]]: ...

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

    def end_stale_resolution(self, ws: str, op_id: str) -> None: ...


class ResolutionRecovery(Protocol):
    """`store.resolution` at start-up: every half-done resolution finished or rolled back."""

    def recover_fork_resolutions(self) -> tuple[int, int]: ...


class TurnBatches(Protocol):
    """`store.db`: the queued writes of one drain as one transaction (turn_writes.py)."""

    def write_batch(self) -> AbstractContextManager[None]: ...

    def release_thread_connection(self) -> None:
        """An actor's pool thread ends: its connection goes with it."""
        ...


class BackgroundWrites(Protocol):
    """`store.db`: background writes."""

    def background(self) -> AbstractContextManager[None]:
        """The block's writes are background ones: no request waits on them, so a client's
        write queued meanwhile goes ahead, for a bounded time (`storage.sqlite.Baton`)."""
        ...

    def events_after(self, into: list[ChangeEvent] | None = None) -> AbstractContextManager[None]:
        """The block's durable writes tell their subscribers when it ends (the saga answers
        its callers first), each still after its COMMIT is durable; `into`: kept in that
        list instead, for the caller to `notify` later."""
        ...

    def notify(self, events: list[ChangeEvent]) -> None:
        """Hand kept events to the subscribers (or to an enclosing `events_after` block)."""
        ...


class ActorDatabase(TurnBatches, BackgroundWrites, Protocol):
    """`store.db` as the actors together see it."""


# -- the ports, one per actor ----------------------------------------------------------------


class SessionActorStore(Protocol):
    """The Session actor's view: the submit claim, the Turn's durable writes (binding,
    Messages, Interactions, settlement), the runtime record, the fence check of a control,
    and the reads these need. Separate from the fork ports so turn handling and the saga
    each show their own durable steps (the saga never settles a Turn; a Turn never moves a
    fork operation)."""

    @property
    def sessions(self) -> SessionRecord: ...

    @property
    def turns(self) -> TurnWrites: ...

    @property
    def history(self) -> TurnHistory: ...

    @property
    def fork_fence(self) -> FenceReads: ...

    @property
    def db(self) -> TurnBatches: ...


class RestartRuleStore(Protocol):
    """The three moves of the restart rule (`domain.fork_states.after_restart`). Separate
    because three callers apply it — start-up recovery, `fork.get` on a leftover, a saga's
    abort — and each must be able to hand over only this, whatever else it holds."""

    @property
    def fork_transitions(self) -> RestartMoves: ...

    @property
    def fork_commit(self) -> ForkCommits: ...


class WorktreeStore(Protocol):
    """A `worktree` fork's tree on its operation: recorded once whole (before dispatch),
    marked removed once its failed fork's tree is gone, and the failed ones still to remove.
    Separate because the saga, `fork.get` on a leftover and start-up recovery all remove a
    failed fork's tree."""

    @property
    def fork_workspace(self) -> ForkWorktrees: ...


class SagaStore(RestartRuleStore, WorktreeStore, Protocol):
    """The fork saga's whole view of the store (seed 000 §6–§10): idempotent prepare, the
    guarded status moves, the commit, and the two reads the dispatch needs (the existing
    operation of a request, the source's Turns for their frozen bindings). Separate because
    the saga is the crash-safety core: what it may touch is pinned here, apart from the
    Session's turn writes and from `fork.resolve`."""

    @property
    def history(self) -> TimelineReads: ...

    @property
    def fork_prepare(self) -> ForkPrepares: ...

    @property
    def fork_queries(self) -> ForkReads: ...

    @property
    def turns(self) -> TurnCheckpoints: ...

    @property
    def fork_transitions(self) -> SagaMoves: ...

    @property
    def db(self) -> BackgroundWrites: ...


class ResolveStore(Protocol):
    """`fork.resolve`'s view: its own durable resolution record (begin, finish,
    roll back), the two ways out of `unknown` (adopt with evidence, abandon), the commit an
    adoption leads to, and the reads its provider calls need. Separate from `SagaStore`
    because a resolution never dispatches nor moves a live operation: it only settles one
    the saga left `unknown`."""

    @property
    def fork_queries(self) -> ForkReads: ...

    @property
    def history(self) -> TimelineReads: ...

    @property
    def resolution(self) -> Resolutions: ...

    @property
    def fork_commit(self) -> ForkCommits: ...


class HostActorStore(Protocol):
    """The HostActor's view: it only routes, and reads a fork operation to route `fork.get`
    to the operation's source (or to answer a settled one directly). Separate so routing can
    never grow a write."""

    @property
    def fork_queries(self) -> ForkReads: ...


class StartupRecoveryStore(WorktreeStore, Protocol):
    """Start-up recovery (seed 000 §10), before any request is served: the leftover fork
    operations' status changes all at once, their commits a page at a time (workspace-wide:
    recovery cannot guess workspaces), and the Turns a dead process left active. Separate
    because it runs once, outside any actor, over every workspace."""

    @property
    def fork_recovery(self) -> LeftoverForks: ...

    @property
    def db(self) -> BackgroundWrites: ...

    @property
    def fork_commit(self) -> BatchedCommits: ...

    @property
    def turns(self) -> OrphanedTurns: ...

    @property
    def resolution(self) -> ResolutionRecovery: ...


class DeletedSessionsStore(Protocol):
    """The start-up sweep of runtime directories (actors/runtime_dirs.py): which Sessions are
    deleted. Separate because it is a file-system chore that must not reach anything else."""

    @property
    def sessions(self) -> DeletedSessions: ...


class ActorTurns(TurnWrites, TurnCheckpoints, Protocol):
    """`store.turns` as the actors together see it."""


class ActorStore(SessionActorStore, SagaStore, ResolveStore, HostActorStore, Protocol):
    """What `actors.context.HostContext.store` must be: every actor's port at once (the
    Session actor runs the saga and the resolver, the HostActor shares its context). Only
    the composition root sees it whole; each actor keeps to its own port."""

    @property
    def turns(self) -> ActorTurns: ...

    @property
    def history(self) -> TurnHistory: ...

    @property
    def fork_transitions(self) -> SagaMoves: ...

    @property
    def db(self) -> ActorDatabase: ...
