"""Every wire method in one table: its name, its params and result types, and the error
reasons it may answer beyond the ones every method may (`COMMON_ERRORS`). `METHODS` is what
the daemon's handlers and the clients' calls are checked against; a test walks it against
docs/protocol.md's method table so neither can drift.

A method is named once, here (`FORK_CREATE.name`); a params type says which keys a request
carries (`workspaceId` in all of them), a result type what the reply's body holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, NotRequired, TypedDict, TypeVar

from protocol.objects import (
    Ancestor,
    ChangedFile,
    Evidence,
    ForkPoint,
    Interaction,
    JsonObject,
    LineageNode,
    LineageTruncation,
    Operation,
    ResolveAction,
    Session,
    Turn,
    WorkerStatus,
)

P = TypeVar("P")
R = TypeVar("R")

COMMON_ERRORS = (
    "invalid_request",
    "invalid_argument",
    "unknown_method",
    "payload_too_large",
    "store_busy",
    "internal_error",
)
"""Reasons any method may answer: a malformed or oversized request, a busy store, a bug."""

NOT_FOUND = ("workspace_agent_session_not_found",)
FENCED = ("agent_session_fork_in_progress",)


@dataclass(frozen=True, slots=True)
class Method(Generic[P, R]):
    name: str
    params: type[P]
    result: type[R]
    errors: tuple[str, ...] = ()
    fenced: bool = False
    """A fenced write: refused with `agent_session_fork_in_progress` while a fork of the
    Session is active (law 3)."""


class WorkspaceParams(TypedDict):
    workspaceId: str


class SessionParams(WorkspaceParams):
    agentSessionId: str


class HostStatusParams(TypedDict, total=False):
    """Nothing needed: the status is the daemon's, whatever the workspace."""

    workspaceId: str


class HostStatusResult(TypedDict):
    version: str
    protocol: int
    home: str
    workers: list[WorkerStatus]
    uptimeMs: int
    # This implementation's additions (docs/protocol.md "Methods (this implementation)").
    sessionActors: NotRequired[int]
    threads: NotRequired[int]
    storeConnections: NotRequired[int]
    timers: NotRequired[int]
    requestsInFlight: NotRequired[int]
    """Requests the daemon has taken and not yet answered, this `host.status` included."""
    providers: NotRequired[list[JsonObject]]
    runtimes: NotRequired[dict[str, dict[str, int]]]
    connections: NotRequired[JsonObject | None]
    """Null when the daemon serves no listener yet."""
    checkpoints: NotRequired[JsonObject]
    late: NotRequired[list[str]]
    """The parts answered as last known (or null) because they did not answer within the
    status's bound, e.g. `checkpoints.bytes`, `providers.codex.version`."""
    log: NotRequired[JsonObject | None]
    """`agenthost serve`'s log queue, `{dropped, queued, capacity}`; null when the daemon
    logs otherwise (in-process)."""
    leftGits: NotRequired[JsonObject]
    """The gits a killed daemon left that outlived their kill at this start, still alive:
    `{alive, pids, repositories}`; their repositories' lock files are kept until they are gone."""
    homeRemovals: NotRequired[list[JsonObject]]
    """Deleted Sessions' runtime folders whose removal is asked for and not ended:
    `{workspaceId, agentSessionId, calls, held, waitingMs}`; `calls`: the worker calls in flight
    that may start an app-server there, which the removal waits for; `held`: the calls that
    came since, sent once the folder is gone."""
    worktreeRemovals: NotRequired[JsonObject | None]
    """The deleted fork children's trees not removed yet (`removing`) that the daemon tries
    again: `{pending, paths, trees, rounds, removed}`; `trees[]`: `{path, reason}`, `reason`
    `in_use` (`inUseBy`), `git_failed` (`error`), `not_recorded` (`error`) or `not_tried`."""


class SessionCreateParams(WorkspaceParams):
    agentSessionId: NotRequired[str]
    provider: str
    title: NotRequired[str]
    cwd: NotRequired[str]
    settings: NotRequired[JsonObject]
    model: NotRequired[str]


class SessionResult(TypedDict):
    session: Session


class SessionListParams(WorkspaceParams):
    cursor: NotRequired[str | None]
    limit: NotRequired[int]


class SessionListResult(TypedDict):
    sessions: list[Session]
    nextCursor: str | None


class TimelineParams(SessionParams):
    afterSequence: NotRequired[int]
    limit: NotRequired[int]


class TimelineResult(TypedDict):
    turns: list[Turn]
    nextSequence: int | None


class LineageParams(SessionParams):
    maxDepth: NotRequired[int]
    maxNodes: NotRequired[int]
    afterOrdinal: NotRequired[int]


class LineageResult(TypedDict):
    session: Session
    ancestors: list[Ancestor]
    descendants: list[LineageNode]
    truncated: LineageTruncation | None


class UpdateSettingsParams(SessionParams):
    settings: JsonObject


class UpdateTitleParams(SessionParams):
    title: str


class PinParams(SessionParams):
    pinned: bool


class DeleteParams(SessionParams):
    worktree: NotRequired[Literal["keep", "remove"]]
    """For a worktree fork's child: keep (the default) or remove the tree the fork made."""
    force: NotRequired[bool]
    """Remove the tree even with work not captured or not on another branch."""


class DeletedTree(TypedDict):
    path: str
    cwd: str
    branch: str | None
    state: Literal["kept", "removed", "removing"]
    branchKept: NotRequired[bool]
    inUseBy: NotRequired[list[str]]
    error: NotRequired[str]


class DeleteResult(TypedDict):
    deleted: bool
    worktree: NotRequired[DeletedTree]


class TextInput(TypedDict):
    type: Literal["text"]
    text: str


class TurnSubmitParams(SessionParams):
    requestId: str
    input: list[TextInput]


class TurnResult(TypedDict):
    turn: Turn


class TurnInterruptParams(SessionParams):
    turnId: str
    by: NotRequired[Literal["ctrl_c", "cli", "gui", "host", "client"]]
    reason: NotRequired[str]


AnsweredBy = Literal["cli", "gui", "client"]


class InteractionRespondParams(SessionParams):
    turnId: str
    requestId: str
    response: JsonObject
    by: NotRequired[AnsweredBy]


class InteractionResult(TypedDict):
    interaction: Interaction


class GoalSetParams(SessionParams):
    goal: str


class ForkCreateParams(SessionParams):
    requestId: str
    targetAgentSessionId: str
    point: ForkPoint
    # `shared` (default) or `worktree`: the child gets a tree holding the fork Turn's files.
    workspace: NotRequired[Literal["shared", "worktree"]]


class OperationParams(WorkspaceParams):
    operationId: str


class OperationResult(TypedDict):
    operation: Operation


class ForkResolveParams(OperationParams):
    requestId: str
    action: ResolveAction


class ForkResolveResult(TypedDict):
    operation: Operation
    evidence: Evidence | None


class FailpointsParams(TypedDict):
    points: dict[str, str]


class FailpointsResult(TypedDict):
    points: dict[str, str]


HOST_STATUS = Method("host.status", HostStatusParams, HostStatusResult)
SESSION_CREATE = Method(
    "session.create",
    SessionCreateParams,
    SessionResult,
    ("agent_session_id_taken", "provider_not_installed", "workspace_worktree_deleted"),
)
SESSION_GET = Method("session.get", SessionParams, SessionResult, NOT_FOUND)
SESSION_LIST = Method("session.list", SessionListParams, SessionListResult)
SESSION_TIMELINE = Method("session.timeline", TimelineParams, TimelineResult, NOT_FOUND)
SESSION_LINEAGE = Method("session.lineage", LineageParams, LineageResult, NOT_FOUND)
SESSION_UPDATE_SETTINGS = Method(
    "session.updateSettings",
    UpdateSettingsParams,
    SessionResult,
    NOT_FOUND + FENCED,
    fenced=True,
)
SESSION_UPDATE_TITLE = Method("session.updateTitle", UpdateTitleParams, SessionResult, NOT_FOUND)
SESSION_PIN = Method("session.pin", PinParams, SessionResult, NOT_FOUND)
SESSION_DELETE = Method(
    "session.delete",
    DeleteParams,
    DeleteResult,
    NOT_FOUND
    + FENCED
    + (
        "agent_session_busy",
        "agent_session_fork_unresolved",
        "workspace_worktree_dirty",
        "workspace_unavailable",
    ),
    fenced=True,
)
TURN_SUBMIT = Method(
    "turn.submit",
    TurnSubmitParams,
    TurnResult,
    NOT_FOUND + FENCED + ("agent_session_busy",),
    fenced=True,
)
TURN_INTERRUPT = Method(
    "turn.interrupt", TurnInterruptParams, TurnResult, NOT_FOUND + FENCED + ("turn_not_found",)
)
INTERACTION_RESPOND = Method(
    "interaction.respond",
    InteractionRespondParams,
    InteractionResult,
    NOT_FOUND + FENCED + ("interaction_not_found",),
    fenced=True,
)
GOAL_SET = Method("goal.set", GoalSetParams, SessionResult, NOT_FOUND + FENCED, fenced=True)
GOAL_CLEAR = Method("goal.clear", SessionParams, SessionResult, NOT_FOUND + FENCED, fenced=True)
FORK_CREATE = Method(
    "fork.create",
    ForkCreateParams,
    OperationResult,
    NOT_FOUND
    + FENCED
    + (
        "agent_session_fork_conflict",
        "agent_session_fork_unsupported",
        "agent_session_fork_request_conflict",
        "agent_session_fork_failed",
        "workspace_checkpoint_missing",
    ),
)
FORK_GET = Method(
    "fork.get", OperationParams, OperationResult, ("agent_session_fork_operation_not_found",)
)
FORK_ACKNOWLEDGE = Method(
    "fork.acknowledge",
    OperationParams,
    OperationResult,
    ("agent_session_fork_operation_not_found", "agent_session_fork_acknowledge_conflict"),
)
FORK_RESOLVE = Method(
    "fork.resolve",
    ForkResolveParams,
    ForkResolveResult,
    FENCED
    + (
        "agent_session_fork_operation_not_found",
        "agent_session_fork_resolve_in_progress",
        "agent_session_fork_resolve_conflict",
        "agent_session_fork_evidence_unreadable",
        "fork_resolve_failed",
    ),
)


class WorkspaceDiffParams(SessionParams):
    turnId: NotRequired[str]
    """Default: the newest settled Turn."""
    fromTurnId: NotRequired[str]
    """Diff from this Turn's `after` instead of the Turn's own `before`."""
    maxBytes: NotRequired[int]


# Functional form: `from` is a Python keyword.
WorkspaceDiffResult = TypedDict(
    "WorkspaceDiffResult",
    {
        "turnId": str,
        "fromTurnId": str | None,
        "cwd": str,
        "from": str,
        "to": str,
        "changedFiles": list[ChangedFile],
        "diff": str,
        "truncated": bool,
    },
)


class WorkspaceRestoreParams(SessionParams):
    turnId: NotRequired[str]
    which: NotRequired[Literal["before", "after"]]
    tree: NotRequired[str]
    """A checkpoint id instead of a Turn: a previous restore's `undo.tree`."""
    force: NotRequired[bool]


class RestoreUndo(TypedDict):
    tree: str
    headCommit: str | None


class WorkspaceRestoreResult(TypedDict):
    cwd: str
    turnId: str | None
    which: str | None
    restored: str
    undo: RestoreUndo
    changedFiles: list[ChangedFile]


WORKSPACE_ERRORS = ("turn_not_found", "workspace_checkpoint_missing", "workspace_unavailable")
SESSION_WORKSPACE_DIFF = Method(
    "session.workspaceDiff", WorkspaceDiffParams, WorkspaceDiffResult, NOT_FOUND + WORKSPACE_ERRORS
)
WORKSPACE_RESTORE = Method(
    "workspace.restore",
    WorkspaceRestoreParams,
    WorkspaceRestoreResult,
    NOT_FOUND + WORKSPACE_ERRORS + ("agent_session_busy", "workspace_shared"),
)
DEBUG_FAILPOINTS = Method("debug.failpoints", FailpointsParams, FailpointsResult)

METHODS: Mapping[str, Method[Any, Any]] = {
    m.name: m
    for m in (
        HOST_STATUS,
        SESSION_CREATE,
        SESSION_GET,
        SESSION_LIST,
        SESSION_TIMELINE,
        SESSION_LINEAGE,
        SESSION_UPDATE_SETTINGS,
        SESSION_UPDATE_TITLE,
        SESSION_PIN,
        SESSION_DELETE,
        TURN_SUBMIT,
        TURN_INTERRUPT,
        INTERACTION_RESPOND,
        GOAL_SET,
        GOAL_CLEAR,
        FORK_CREATE,
        FORK_GET,
        FORK_ACKNOWLEDGE,
        FORK_RESOLVE,
        SESSION_WORKSPACE_DIFF,
        WORKSPACE_RESTORE,
        DEBUG_FAILPOINTS,
    )
}
"""Every wire method by name."""
