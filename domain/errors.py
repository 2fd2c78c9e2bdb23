"""Typed errors of agenthost, each carrying its wire identity (status, code, reason, retryable).

Every layer raises these (or subclasses); the API server maps them to a reply in one function,
so nothing crosses the wire as a bare exception (ARCHITECTURE.md law 7). `STATUS_BY_CODE` is
the one code → status table: every class takes its status from it, and a typed error that
crossed a process boundary as a map (a worker's answer) gets its status back from it.

Standard library only (the `domain` package): importing it never loads SQLite or ZeroMQ.
Every package imports the errors from here.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, ClassVar

STATUS_BY_CODE: Mapping[str, int] = {
    "invalid_request": 400,
    "not_found": 404,
    "conflict": 409,
    "payload_too_large": 413,
    "internal": 500,
    "provider_error": 502,
    "unavailable": 503,
}
"""The wire `code` of an error → its HTTP-like `status` (PROTOCOL.md "Errors")."""


def status_for(code: str) -> int:
    """The status of a wire error code; an unknown code is an internal error (500)."""
    return STATUS_BY_CODE.get(code, 500)


class ForkBoundaryReason(StrEnum):
    """Why a source/boundary cannot be forked (PROTOCOL.md `forkBoundaryReason`)."""

    SOURCE_NOT_ROOT = "source_not_root"
    SOURCE_PROVIDER_SESSION_MISSING = "source_provider_session_missing"
    SOURCE_TURN_ACTIVE = "source_turn_active"
    SOURCE_INTERACTION_PENDING = "source_interaction_pending"
    SOURCE_GOAL_CONTROL_ACTIVE = "source_goal_control_active"
    SOURCE_RUNTIME_OPERATION_ACTIVE = "source_runtime_operation_active"
    SOURCE_SUBMIT_CLAIM_ACTIVE = "source_submit_claim_active"
    SOURCE_FORK_ACTIVE = "source_fork_active"
    TURN_NOT_FOUND = "turn_not_found"
    TURN_NOT_SETTLED = "turn_not_settled"
    TURN_SEQUENCE_UNVERIFIED = "turn_sequence_unverified"
    PROVIDER_TURN_MISSING = "provider_turn_missing"
    # The selected Turn's provider binding is not `bound` by the provider's own hook (the same
    # verdict the projection shows as `providerForkBindingState`, e.g. `recovery_required`).
    PROVIDER_TURN_NOT_BOUND = "provider_turn_not_bound"
    DESCENDANT_LANE_IN_BOUNDARY = "descendant_lane_in_boundary"
    SESSION_LOCAL_ATTACHMENT_IN_BOUNDARY = "session_local_attachment_in_boundary"
    # Not about the source's state, but still a 409 `agent_session_fork_conflict`: every one of
    # them carries a reason (PROTOCOL.md), so a client never has to guess from the message.
    TARGET_EQUALS_SOURCE = "target_equals_source"
    TARGET_SESSION_EXISTS = "target_session_exists"
    TARGET_SESSION_RESERVED = "target_session_reserved"
    HISTORY_REFERENCE_UNSAFE = "history_reference_unsafe"


class HostError(Exception):
    """Base of every typed error. Subclasses fix `status`, `code` and usually `reason`."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = STATUS_BY_CODE[code]
    default_reason: ClassVar[str] = "internal_error"
    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A class names its `code` alone; its status comes from the one table, so the two
        # cannot disagree (an unknown code fails at import).
        cls.status = STATUS_BY_CODE[cls.code]

    def __init__(
        self, message: str, *, reason: str | None = None, params: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.params: dict[str, Any] = dict(params or {})

    def to_wire(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "retryable": self.retryable,
            "params": self.params,
        }


class InvalidRequest(HostError):
    code = "invalid_request"
    default_reason = "invalid_argument"


class InvalidArgument(InvalidRequest):
    """A bad parameter; `params.field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, reason="invalid_argument", params={"field": field})


class NotFound(HostError):
    code = "not_found"
    default_reason = "workspace_agent_session_not_found"


class SessionNotFound(NotFound):
    default_reason = "workspace_agent_session_not_found"


class ForkOperationNotFound(NotFound):
    default_reason = "agent_session_fork_operation_not_found"


class TurnNotFound(NotFound):
    default_reason = "turn_not_found"


class Conflict(HostError):
    code = "conflict"
    default_reason = "conflict"


class SessionBusy(Conflict):
    default_reason = "agent_session_busy"


class WorkspaceCheckpointMissing(Conflict):
    """The Turn has no usable workspace checkpoint (none taken, `unavailable`, or the side
    asked for is missing); `params.turnId`, and `params.workspaceReason` when the record says
    why (`cwd_missing`, `timed_out`, `disabled`, …)."""

    default_reason = "workspace_checkpoint_missing"


class WorkspaceShared(Conflict):
    """`workspace.restore` of a directory other live Sessions work in (`params.agentSessionIds`):
    their files would change behind their back; `force` overrides."""

    default_reason = "workspace_shared"


class WorkspaceWorktreeDirty(Conflict):
    """`session.delete {worktree: "remove"}` of a Session whose fork-made tree holds work that
    would be lost: files not captured by its newest checkpoint (`params.uncaptured`) or commits
    on its branch not on any other branch (`params.commits`); `force` overrides."""

    default_reason = "workspace_worktree_dirty"


class WorkspaceWorktreeDeleted(Conflict):
    """`session.create` with a `cwd` in the tree of a deleted fork child: one the daemon is
    removing (git could not yet; it tries again in the background) or has removed. A Session
    there would have its folder removed under it, or work where the fork's files were
    (`params.path`: the tree, `params.operationId`: the fork that made it, `params.state`:
    `removing` or `removed`)."""

    default_reason = "workspace_worktree_deleted"


class ForkInProgress(Conflict):
    """A fenced write (or another fork) while a fork operation on the source is active."""

    default_reason = "agent_session_fork_in_progress"
    retryable = True


class ForkUnresolved(Conflict):
    """`session.delete` of a Session that is the source of an `unknown` fork operation: its
    runtime folder holds that operation's evidence (the provider child it may have left), kept
    until a person resolves it (`fork.resolve`); `params.operationIds` names them."""

    default_reason = "agent_session_fork_unresolved"


class ForkBoundaryError(Conflict):
    """The source or boundary is not forkable; `params.forkBoundaryReason` says why."""

    default_reason = "agent_session_fork_conflict"

    def __init__(self, boundary_reason: ForkBoundaryReason, message: str | None = None) -> None:
        super().__init__(
            message or f"fork boundary rejected: {boundary_reason.value}",
            params={"forkBoundaryReason": boundary_reason.value},
        )
        self.boundary_reason = boundary_reason


class ForkConflict(Conflict):
    """A fork conflict that is not the source's state, e.g. the target id is already taken or
    reserved; it carries `params.forkBoundaryReason` like every `agent_session_fork_conflict`."""

    default_reason = "agent_session_fork_conflict"

    def __init__(
        self,
        boundary_reason: ForkBoundaryReason,
        message: str,
        *,
        params: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            message, params={**(params or {}), "forkBoundaryReason": boundary_reason.value}
        )
        self.boundary_reason = boundary_reason


class ForkUnsupported(Conflict):
    default_reason = "agent_session_fork_unsupported"


class ForkRequestConflict(Conflict):
    default_reason = "agent_session_fork_request_conflict"


class TurnRequestConflict(Conflict):
    """A `turn.submit` replayed with its `requestId` but another input; `params.turnId` is
    the Turn that `requestId` claimed."""

    default_reason = "turn_request_conflict"


def checkpoint_refusal(
    record: Mapping[str, Any] | None, turn_id: str
) -> WorkspaceCheckpointMissing | None:
    """Why a Turn's workspace checkpoint record (`turns.checkpoint_json`) cannot give a
    `worktree` fork its files — none recorded, or `unavailable` — or None when it can."""
    if record is not None and record.get("state") != "unavailable" and record.get("after"):
        return None
    why = (record or {}).get("message") or "no checkpoint was recorded"
    params: dict[str, Any] = {"turnId": turn_id}
    if record is not None and record.get("reason"):
        params["workspaceReason"] = str(record["reason"])
    return WorkspaceCheckpointMissing(
        f"cannot fork the files of Turn {turn_id}: {why}", params=params
    )


class ForkAcknowledgeConflict(Conflict):
    default_reason = "agent_session_fork_acknowledge_conflict"


class InvalidTransition(Conflict):
    """A fork operation transition that the state machine does not allow."""

    default_reason = "agent_session_fork_invalid_transition"


class PayloadTooLarge(HostError):
    code = "payload_too_large"
    default_reason = "payload_too_large"


class ProviderError(HostError):
    code = "provider_error"
    default_reason = "provider_error"


class RuntimeChanged(ProviderError):
    """A worker refused a request that named the runtime generation the host prepared,
    because another runtime (or none) is live by now; nothing reached the provider, so the
    host may prepare the runtime and send the request once more."""

    default_reason = "runtime_changed"


class ProviderNotCalled(ProviderError):
    """A worker's provider call failed before the provider could get anything of it (Claude
    Code's CLI could not be started, or ended before the Turn's prompt was handed to it): the
    host knows the Turn's start never reached the provider, as for a request never sent."""

    default_reason = "provider_not_called"


class Unavailable(HostError):
    code = "unavailable"
    default_reason = "overloaded"
    retryable = True


class WorkspaceUnavailable(Unavailable):
    """A diff or restore could not read or write the working tree now (git missing, the
    directory gone, a git call past its bound); `params.workspaceReason` says which."""

    default_reason = "workspace_unavailable"
    retryable = False


class StoreBusy(Unavailable):
    """The store could not take a write within its busy budget: another connection (or
    process) holds SQLite's write lock, or the disk is full. Retryable: nothing was written."""

    default_reason = "store_busy"


class StoreSyncFailed(Unavailable):
    """The disk failed to sync the store's log (an I/O error of `fdatasync`): a write after
    that may not be durable and is refused; the daemon stops (docs/design/store.md "A failed
    sync stops the writes"). Not retryable on this daemon: start it again once the disk holds."""

    default_reason = "store_sync_failed"
    retryable = False


class SessionIdTaken(Conflict):
    """The Session id already exists (even deleted) or is reserved by a fork operation."""

    default_reason = "agent_session_id_taken"


class InteractionNotFound(NotFound):
    default_reason = "interaction_not_found"


class ForkReferenceReason(StrEnum):
    """Why cloned history cannot be rewritten safely (`params.forkReferenceError`)."""

    DANGLING_REFERENCE = "dangling_reference"
    UNKNOWN_TYPED_REFERENCE = "unknown_typed_reference"
    MALFORMED_REFERENCE = "malformed_reference"
    DUPLICATE_KEY = "duplicate_key"
    NON_INJECTIVE_MAPPING = "non_injective_mapping"


class ForkReferenceError(ForkConflict):
    """Law 5 fail-closed: a dangling/unknown typed reference, duplicate key or non-injective
    mapping in the boundary; raised at prepare, before anything is dispatched."""

    def __init__(self, reason: ForkReferenceReason, message: str) -> None:
        super().__init__(
            ForkBoundaryReason.HISTORY_REFERENCE_UNSAFE,
            message,
            params={"forkReferenceError": reason.value},
        )
        self.reference_reason = reason


class ForkEvidenceRejected(ProviderError):
    """The provider's answer does not prove an independent child; the saga records `unknown`."""

    default_reason = "agent_session_fork_delivery_unknown"


class ForkResolveInProgress(Conflict):
    """Another `fork.resolve` of this operation is under way."""

    default_reason = "agent_session_fork_resolve_in_progress"
    retryable = True


class ForkResolveConflict(Conflict):
    """The operation is not `unknown` (any more), or was resolved another way."""

    default_reason = "agent_session_fork_resolve_conflict"


class ForkEvidenceUnreadable(Conflict):
    """An abandon whose inspection found a provider child of the source that cannot be read
    now while another fork of the source could own it: nothing is moved; retry."""

    default_reason = "agent_session_fork_evidence_unreadable"
    retryable = True


class ForkSnapshotCorrupt(HostError):
    """The stored snapshot no longer matches its hash or contradicts its operation (500)."""

    default_reason = "agent_session_fork_snapshot_corrupt"


class StoreCorrupt(HostError):
    """SQLite found the store file damaged (`database disk image is malformed`, or not a
    database) where this request read or wrote it (500, not retryable: it stays damaged)."""

    default_reason = "store_corrupt"


class SchemaTooNew(HostError):
    """The store file was written by a newer agenthost; opening it could corrupt it."""

    default_reason = "store_schema_too_new"


_log = logging.getLogger("agenthost.internal")


def internal_error(
    failure: object, what: str = "", *, logger: logging.Logger | None = None
) -> HostError:
    """The one builder of a 500 `internal`/`internal_error` for an untyped failure (law 7):
    an exception no layer typed, or a value where a reply was expected.

    Its text (and an exception's traceback) goes to the log under a fresh reference id; the
    client's message names only its type and that reference, never its text, which may hold
    paths, keys or provider output (docs/protocol.md "Internal errors"). `what` says what
    failed, for the log line."""
    ref = secrets.token_hex(4)
    kind = type(failure).__name__
    (logger or _log).error(
        "internal error [ref %s]%s: %s: %s",
        ref,
        f" in {what}" if what else "",
        kind,
        failure,
        exc_info=failure if isinstance(failure, BaseException) else None,
    )
    return HostError(f"internal error ({kind}); see the daemon log (ref {ref})")
