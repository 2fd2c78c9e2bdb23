"""Immutable values the canonical store returns: Sessions, Turns, Messages, Interactions, fork
operations and lineage, plus the change events delivered after COMMIT.

Every value is a frozen slotted dataclass with snake_case fields; the camelCase wire projection
lives in `agenthost/projection.py`, so nothing here knows about the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from domain.fork_states import ACTIVE, ForkStatus


class SessionKind(StrEnum):
    """`root` Sessions are independent (fork children included); `child` is provider-native."""

    ROOT = "root"
    CHILD = "child"


class TurnPhase(StrEnum):
    ACTIVE = "active"
    SETTLED = "settled"


class SequenceProvenance(StrEnum):
    """Who assigned a Turn's `sequence`; only host-assigned sequences are fork-verifiable.

    - `host`: assigned by `claim_submit` inside the store's write transaction (next integer).
    - `fork_clone`: copied from a frozen snapshot at commit, itself host-verified at prepare.
    - `imported`: came from outside (e.g. a provider history import); a boundary containing
      one is rejected with `turn_sequence_unverified` rather than guessed.
    """

    HOST = "host"
    FORK_CLONE = "fork_clone"
    IMPORTED = "imported"


VERIFIABLE_PROVENANCE: frozenset[str] = frozenset(
    {SequenceProvenance.HOST.value, SequenceProvenance.FORK_CLONE.value}
)


class InteractionStatus(StrEnum):
    PENDING = "pending"
    RESOLVED = "resolved"
    SUPERSEDED = "superseded"


class ForkPointKind(StrEnum):
    """Where a fork cuts the source history.

    - `through_turn`: inclusive; the child holds the selected settled Turn and every Turn
      before it. The only kind implemented; an unknown kind is rejected, never guessed.
    """

    THROUGH_TURN = "through_turn"
    # The whole Session: its newest settled Turn, resolved and frozen at prepare.
    LATEST_SETTLED = "latest_settled"


ACTIVE_FORK_STATUSES: frozenset[ForkStatus] = ACTIVE
"""Re-export of `domain.fork_states.ACTIVE` for the store's own imports."""


class ForkPublicStatus(StrEnum):
    ACCEPTED = "accepted"
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    ABANDONED = "abandoned"


class ForkPhase(StrEnum):
    FROZEN = "frozen"
    DISPATCHING = "dispatching"
    MATERIALIZING = "materializing"
    COMMITTED = "committed"
    FAILED = "failed"
    DELIVERY_UNKNOWN = "deliveryUnknown"
    ABANDONED = "abandoned"


_PUBLIC: dict[ForkStatus, tuple[ForkPublicStatus, ForkPhase]] = {
    ForkStatus.PREPARED: (ForkPublicStatus.ACCEPTED, ForkPhase.FROZEN),
    ForkStatus.DISPATCHING: (ForkPublicStatus.ACCEPTED, ForkPhase.DISPATCHING),
    ForkStatus.PROVIDER_ACCEPTED: (ForkPublicStatus.ACCEPTED, ForkPhase.MATERIALIZING),
    ForkStatus.COMMITTED: (ForkPublicStatus.COMMITTED, ForkPhase.COMMITTED),
    ForkStatus.FAILED: (ForkPublicStatus.FAILED, ForkPhase.FAILED),
    ForkStatus.UNKNOWN: (ForkPublicStatus.UNKNOWN, ForkPhase.DELIVERY_UNKNOWN),
    ForkStatus.ABANDONED: (ForkPublicStatus.ABANDONED, ForkPhase.ABANDONED),
}


@dataclass(frozen=True, slots=True)
class Lineage:
    """The forkedFrom row of a fork child: where it came from and its own boundary Turn."""

    source_session_id: str
    source_turn_id: str
    target_session_id: str
    target_turn_id: str
    operation_id: str
    forked_at_ms: int


@dataclass(frozen=True, slots=True)
class Session:
    workspace_id: str
    session_id: str
    kind: str
    provider: str
    provider_session_id: str | None
    title: str
    cwd: str
    settings: Mapping[str, Any]
    runtime_context: Mapping[str, Any]
    model: str | None
    pinned: bool
    deleted: bool
    goal: str | None
    active_turn_id: str | None
    parent_session_id: str | None
    parent_turn_id: str | None
    created_at_ms: int
    updated_at_ms: int
    lineage: Lineage | None
    # Inherited by a fork child (seed 000 §5 "rail placement, visibility").
    rail_placement: str | None = None
    visibility: str = "visible"
    version: int = 0
    """The row's version: one more at every change of what the row shows (docs/design/store.md,
    "A Turn's Session events carried"); a Session just inserted is at 0. Not on the wire."""


@dataclass(frozen=True, slots=True)
class Message:
    message_id: str
    turn_id: str | None
    kind: str
    text: str | None
    payload: Mapping[str, Any]
    version: int
    position: int


@dataclass(frozen=True, slots=True)
class Interaction:
    interaction_id: str
    request_id: str
    turn_id: str
    kind: str
    status: str
    input: Mapping[str, Any]
    output: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Turn:
    workspace_id: str
    session_id: str
    turn_id: str
    sequence: int
    sequence_provenance: str
    phase: str
    outcome: str | None
    root_provider_turn_id: str | None
    provider_turn_binding_json: str | None
    final_assistant_message_id: str | None
    error: str | None
    created_at_ms: int
    settled_at_ms: int | None
    messages: tuple[Message, ...] = ()
    interactions: tuple[Interaction, ...] = ()
    # The workspace checkpoint record (JSON; docs/design/workspace.md), None before any.
    checkpoint_json: str | None = None
    # The provider never got this Turn (docs/design/store.md, v24): left out of every fork's
    # provider prefix.
    host_only: bool = False


@dataclass(frozen=True, slots=True)
class TurnBound:
    """A Turn's provider bind and binding that its settlement writes in its own statement
    (`TurnStore.record_settlement`), as the two lone writes would have just before it: the
    provider's turn id unless the Turn is bound to another one (the lone bind's `Conflict`
    wrote nothing), and the newest binding JSON. None: not part of it."""

    root_provider_turn_id: str | None = None
    binding_json: str | None = None

    def applied_to(self, turn: Turn) -> tuple[str | None, str | None]:
        """(provider turn id, binding JSON) to write over `turn`'s row; None: left as it is."""
        root = self.root_provider_turn_id
        if turn.root_provider_turn_id not in (None, root):
            root = None
        return root, self.binding_json


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A Message of a Turn that its settlement inserts first, in the same write
    (`TurnStore.record_settlement(…, messages=…)`), as `HistoryStore.append_message` would have
    just before it (a new Message, last): its id chosen by the caller, its payload a JSON
    object."""

    message_id: str
    kind: str
    text: str | None
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TurnTail:
    """A Turn read from its first changed Message on (`HistoryStore.turn_since`): `turn` has
    its row and all its Interactions, and its Messages at ordinals `messages_from` ..
    `message_count - 1` (0-based, presentation order); `messages_from == 0` is the whole Turn."""

    turn: Turn
    message_count: int
    messages_from: int


@dataclass(frozen=True, slots=True)
class ForkPrepareRequest:
    """What the saga asks the store to freeze. `runtime_identity` holds the prepared `cwd`,
    `settings` and `runtime_context` only (never env or provider target refs)."""

    source_session_id: str
    request_id: str
    target_session_id: str
    turn_id: str
    driver_kind: str
    driver_version: str
    binding_mode: str
    runtime_identity: Mapping[str, Any] = field(default_factory=dict)
    point_kind: str = ForkPointKind.THROUGH_TURN.value
    # `shared` (the child works in the source's directory) or `worktree` (a tree of its own
    # holding the fork Turn's `after` checkpoint, planned by the prepare's `plan_workspace`).
    workspace: str = "shared"


PlanWorkspace = Callable[[Mapping[str, Any], str, str], Mapping[str, Any]]
"""(the fork Turn's checkpoint record, operation id, child title) → a `worktree` fork's tree
plan (workspace.worktree.TreePlan's JSON), decided inside the prepare transaction."""


@dataclass(frozen=True, slots=True)
class TreeToRemove:
    """A `worktree` fork's tree not yet known removed: a failed fork's, or a deleted child's
    (`removing`; `session_id`: that child, whose tree it was)."""

    workspace_id: str
    operation_id: str
    plan: Mapping[str, Any]
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProviderForkEvidence:
    """A verified provider child, checked again by the store before `provider_accepted`.

    `turn_bindings` maps a *source* canonical Turn id to the child's
    `(root_provider_turn_id, binding_json)`; required for `provider_owned`.
    """

    child_provider_session_id: str
    provider_turn_ids: tuple[str, ...]
    binding_mode: str
    receipt: Mapping[str, Any]
    turn_bindings: Mapping[str, tuple[str, str | None]] | None = None


@dataclass(frozen=True, slots=True)
class ForkOperation:
    workspace_id: str
    operation_id: str
    request_id: str
    request_hash: str
    source_session_id: str
    target_session_id: str
    point_kind: str
    source_turn_id: str
    source_provider_session_id: str
    source_provider_turn_id: str
    source_provider_turn_ids: tuple[str, ...]
    target_provider_session_id: str | None
    target_provider_turn_ids: tuple[str, ...] | None
    target_turn_id: str | None
    driver_kind: str
    driver_version: str
    binding_mode: str
    binding_receipt: Mapping[str, Any] | None
    snapshot_hash: str
    status: ForkStatus
    error: str | None
    created_at_ms: int
    dispatched_at_ms: int | None
    accepted_at_ms: int | None
    completed_at_ms: int | None
    client_observed_at_ms: int | None
    committed_session: Session | None
    lineage: Lineage | None
    # The frozen child title, so the saga can pass it to the provider (seed 000 §7).
    target_title: str = ""
    # (canonical Turn id, provider binding JSON) of each Turn of the frozen prefix,
    # lined up with `source_provider_turn_ids` — the snapshot's own values, handed back by
    # `prepare_fork` (None on every other read) so the saga dispatches without re-reading the
    # source timeline. Not part of the operation's identity.
    frozen_turns: tuple[tuple[str, str | None], ...] | None = field(
        default=None, compare=False, repr=False
    )
    # `shared` or `worktree`; for a worktree, the tree's plan frozen at prepare (path, branch,
    # child cwd, checkpoint: workspace.worktree.TreePlan's JSON) and where it got to:
    # `planned` (not on disk, or half-made), `made` (whole, recorded before dispatch),
    # `removed` (its fork failed).
    workspace_mode: str = "shared"
    worktree: Mapping[str, Any] | None = None
    worktree_state: str | None = None

    @property
    def public_status(self) -> ForkPublicStatus:
        return _PUBLIC[self.status][0]

    @property
    def phase(self) -> ForkPhase:
        return _PUBLIC[self.status][1]

    @property
    def is_active(self) -> bool:
        """True while the source fence holds (prepared, dispatching, provider_accepted)."""
        return self.status in ACTIVE_FORK_STATUSES


class OperationKey(Protocol):
    """What a batched commit needs of an operation: its key (a `ForkOperation` is one)."""

    @property
    def workspace_id(self) -> str: ...

    @property
    def operation_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class LeftoverCommit:
    """A `provider_accepted` leftover by its key: all its commit reads of it (the commit reads
    the row itself, inside its own transaction)."""

    workspace_id: str
    operation_id: str


@dataclass(frozen=True, slots=True)
class ForkResolution:
    """A `fork.resolve`'s durable record of one operation (`fork_resolutions`): the winning
    request, its action, its state (`started`, `done`, `rolled_back`), the child it adopts, the
    evidence and the result."""

    workspace_id: str
    operation_id: str
    request_id: str
    action: str
    state: str
    child_id: str | None
    evidence: Any
    result: Any


@dataclass(frozen=True, slots=True)
class ForkReadiness:
    """Inputs for capability/availability resolution: why a fork would be rejected now.

    `blocking` is empty when prepare would pass the source conditions for `turn_id`.
    """

    session: Session
    turn: Turn | None
    blocking: tuple[str, ...]
    active_operation_id: str | None


@dataclass(frozen=True, slots=True)
class SessionTouch:
    """What a write's `touch` changed of its Session's row, and nothing else of it did: the row
    it left is the row at `version - 1` with `updated_at_ms` set and, for a Turn's claim or
    settlement, its active Turn set (`claimed`) or cleared (`settled`). A subscriber that holds
    the row at exactly `version - 1` builds the new one without a read (docs/design/store.md,
    "A Turn's Session events carried")."""

    version: int
    """The row's version this write left (the touch's `RETURNING`)."""
    updated_at_ms: int
    claimed: str | None = None
    """The Turn this write made the Session's active one (it had none)."""
    settled: str | None = None
    """The Turn this write settled (the Session's active one; it has none after)."""

    def apply(self, base: Session) -> Session | None:
        """The row this write left, from `base`; None unless `base` is the row it changed
        (its version exactly one less, live, and showing the active Turn this write found)."""
        if base.version != self.version - 1 or base.deleted:
            return None
        active = base.active_turn_id
        if self.claimed is not None:
            if active is not None:
                return None
            active = self.claimed
        elif self.settled is not None:
            if active != self.settled:
                return None
            active = None
        # Built field by field, not by `dataclasses.replace` (~2x its cost: it walks the
        # class's fields and reads each by name); tests/storage pins that every field is kept.
        return Session(
            base.workspace_id,
            base.session_id,
            base.kind,
            base.provider,
            base.provider_session_id,
            base.title,
            base.cwd,
            base.settings,
            base.runtime_context,
            base.model,
            base.pinned,
            base.deleted,
            base.goal,
            active,
            base.parent_session_id,
            base.parent_turn_id,
            base.created_at_ms,
            self.updated_at_ms,
            base.lineage,
            base.rail_placement,
            base.visibility,
            self.version,
        )


@dataclass(frozen=True, slots=True)
class SessionChanged:
    workspace_id: str
    session_id: str
    removed: bool = False
    row: Session | None = field(default=None, compare=False, repr=False)
    """The Session as the emitting write left it, read inside that write's transaction after
    its last change of the row (a write that emits it changes the row no further), or None:
    a subscriber reads it back. Not part of the change's identity (equality, hash)."""
    seq: int = field(default=0, compare=False, repr=False)
    """The emitting write's `Tx.seq` (with `row` or `touch`): the store's writes in the order
    they were made, which is their commit order (docs/design/store.md, "Change events that
    carry their row")."""
    touch: SessionTouch | None = field(default=None, compare=False, repr=False)
    """Without `row`: what the write changed of the row (its last change of it), for a
    subscriber that holds the row it changed; None: read back."""


@dataclass(frozen=True, slots=True)
class TurnChanged:
    workspace_id: str
    session_id: str
    turn_id: str
    row: Turn | None = field(default=None, compare=False, repr=False)
    """The whole Turn (its Messages and Interactions) as the emitting write left it, built or
    read inside that write's transaction after its last change of the Turn, or None: a
    subscriber reads it back. Not part of the change's identity (equality, hash)."""
    seq: int = field(default=0, compare=False, repr=False)
    """The emitting write's `Tx.seq` (with `row`), as `SessionChanged.seq`."""


@dataclass(frozen=True, slots=True)
class ForkOperationChanged:
    workspace_id: str
    operation_id: str
    row: ForkOperation | None = field(default=None, compare=False, repr=False)
    """The operation as the emitting write left it (its child projection with it once
    committed), built inside that write's transaction after its last change of the row, or
    None: a subscriber reads it back. Not part of the change's identity (equality, hash)."""
    seq: int = field(default=0, compare=False, repr=False)
    """The emitting write's `Tx.seq` (with `row`), as `SessionChanged.seq`."""


ChangeEvent = SessionChanged | TurnChanged | ForkOperationChanged
