"""The objects the wire carries (docs/protocol.md "Objects"), as `TypedDict`s: what a reply or
an event holds under `session`, `turn`, `operation` and the rest. Fields marked `NotRequired`
are absent from some replies; `None` is a value the wire sends (msgpack nil)."""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"
"""A value an open-ended field holds: what JSON (and so msgpack without bytes) can say."""
JsonObject: TypeAlias = dict[str, JsonValue]
"""An open map the protocol does not shape: a Session's `settings`, a message's `payload`, an
interaction's `input`/`output`, a response to one, an error's `params`."""

SessionKind = Literal["root", "child"]
TurnPhase = Literal["active", "settled"]
TurnOutcome = Literal["completed", "interrupted", "failed"]
BindingState = Literal["bound", "recovery_required", "unavailable"]
InteractionKind = Literal["approval", "question", "plan"]
InteractionStatus = Literal["pending", "resolved", "superseded"]
PointType = Literal["throughTurn", "latestSettled"]
OperationStatus = Literal["accepted", "committed", "failed", "unknown", "abandoned"]
OperationPhase = Literal[
    "frozen", "dispatching", "materializing", "committed", "failed", "deliveryUnknown", "abandoned"
]
ResolveAction = Literal["inspect", "adopt", "abandon"]
Verdict = Literal["adoptable", "absent", "ambiguous"]
WorktreeState = Literal["planned", "made", "removing", "removed"]


class Lineage(TypedDict):
    sourceAgentSessionId: str
    sourceTurnId: str
    targetTurnId: str
    operationId: str
    forkedAtUnixMs: int


class LifecycleCapabilities(TypedDict):
    fork: bool
    """Whole-Session fork (`point: latestSettled`); canonical."""
    forkThroughTurn: bool
    forkFullSession: bool
    """Alias of `fork`, kept for clients that read it."""


class Session(TypedDict):
    workspaceId: str
    agentSessionId: str
    kind: SessionKind
    provider: str
    providerSessionId: str | None
    title: str
    cwd: str
    settings: JsonObject
    model: str | None
    pinned: bool
    goal: str | None
    activeTurnId: str | None
    parentAgentSessionId: str | None
    parentTurnId: str | None
    createdAtUnixMs: int
    updatedAtUnixMs: int
    lifecycleCapabilities: LifecycleCapabilities
    forkedFrom: Lineage | None
    settingsOmitted: NotRequired[bool]
    """In an event, or a `session.lineage` ancestor past that reply's bound, only: true when
    the Session's `settings` were too big to carry (sent as `{}`); `session.get` reads them."""


class Message(TypedDict):
    messageId: str
    turnId: str | None
    kind: str
    text: str | None
    payload: JsonObject
    version: int


class Interaction(TypedDict):
    requestId: str
    turnId: str
    kind: InteractionKind
    status: InteractionStatus
    input: JsonObject
    output: JsonObject | None
    omitted: NotRequired[bool]
    """In a `turn.updated` event only: true when this Interaction was too big to carry
    (`input` `{}`, `output` `{}` once answered); `session.timeline` reads it whole."""


class ChangedFile(TypedDict):
    path: str
    kind: Literal["added", "modified", "deleted"]


class CaptureUnavailable(TypedDict):
    """Why a capture failed (`TurnWorkspace.beforeUnavailable`)."""

    reason: str
    message: str


class TurnWorkspace(TypedDict, total=False):
    """A Turn's workspace checkpoint record: either the checkpoint (`cwd`, `before`, `after`,
    `changedFiles`, `headCommit`, `repoRoot`, `tooLarge`; `after` is null while the Turn runs;
    `beforeUnavailable` says why a null `before` failed) or `{state: "unavailable", reason,
    message}`."""

    cwd: str
    before: str | None
    after: str | None
    changedFiles: list[ChangedFile]
    headCommit: str | None
    repoRoot: str | None
    tooLarge: list[str]
    beforeUnavailable: CaptureUnavailable
    state: Literal["unavailable"]
    reason: str
    message: str


class Turn(TypedDict):
    turnId: str
    sequence: int
    phase: TurnPhase
    outcome: TurnOutcome | None
    error: str | None
    errorReason: str | None
    rootProviderTurnId: str | None
    providerForkBindingState: BindingState
    finalAssistantMessageId: str | None
    messages: list[Message]
    interactions: list[Interaction]
    createdAtUnixMs: int
    settledAtUnixMs: int | None
    workspace: NotRequired[TurnWorkspace | None]
    """The Turn's workspace checkpoint record; null when it has none."""
    hostOnly: NotRequired[bool]
    """True: the provider never got this Turn; it is left out of every fork's provider prefix
    and no fork goes through it (absent from a daemon older than this field: false)."""


class ForkPoint(TypedDict):
    type: PointType
    turnId: NotRequired[str]
    """Required for `throughTurn` in a request; always present in an operation."""


class Operation(TypedDict):
    operationId: str
    requestId: str
    sourceAgentSessionId: str
    targetAgentSessionId: str
    point: ForkPoint
    status: OperationStatus
    phase: OperationPhase
    session: Session | None
    lineage: Lineage | None
    error: str | None
    workspace: NotRequired[OperationWorkspace]


class OperationWorkspace(TypedDict):
    """`shared`: the child works in the source's directory. `worktree`: a tree of its own
    holding the fork Turn's checkpoint — `planned` (being made), `made` (whole, recorded
    before the provider fork), `removed` (the fork failed)."""

    mode: Literal["shared", "worktree"]
    path: NotRequired[str | None]
    cwd: NotRequired[str | None]
    branch: NotRequired[str | None]
    state: NotRequired[WorktreeState | None]
    """Null (as `path` and `cwd`) only for a record the daemon never finished writing."""


class ResolvedChild(TypedDict):
    providerSessionId: str
    forkedFromId: str
    providerTurnIds: list[str]
    turnsEqualPrefix: bool
    readsFromOwnHome: bool
    locations: list[Literal["source", "target"]]
    readError: NotRequired[str | None]


class Evidence(TypedDict):
    children: list[ResolvedChild]
    quarantined: list[str]
    verdict: Verdict
    quarantinedNow: NotRequired[list[str]]


class NodeTruncation(TypedDict):
    reason: Literal["depth", "nodes"]
    omittedChildren: int


class LineageNode(TypedDict):
    agentSessionId: str
    title: str
    deleted: bool
    ordinal: int
    lineage: Lineage | None
    children: list[LineageNode]
    truncated: NotRequired[NodeTruncation]
    """Present when this node's children are not listed."""


class LineageTruncation(TypedDict):
    """Why a `session.lineage` read stopped (null on a whole tree)."""

    reason: Literal["depth", "nodes", "ancestors"]
    maxDepth: int
    maxNodes: int
    omittedChildren: int
    ancestors: bool


class Ancestor(TypedDict):
    agentSessionId: str
    session: Session | None
    lineage: Lineage | None


class WorkerStatus(TypedDict):
    provider: str
    pid: int | None
    state: str
    restarts: int
    lastError: NotRequired[str | None]
    """Why the last incarnation died or could not start; null until one did."""
    busySilences: NotRequired[int]
    """Watchdog windows in which the worker was silent but running (busy, kept)."""


class Error(TypedDict):
    """The body of every error reply (law 7: never a bare exception)."""

    code: str
    reason: str
    message: str
    retryable: bool
    params: NotRequired[JsonObject]
