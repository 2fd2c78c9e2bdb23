"""The Engine's values: a fork mutation's record and statuses (`ForkMutation`,
`MutationStatus`, `AckState`), the change notices views receive (`EngineChange`), the boundary
key and the Engine's default deadlines. Frozen data and pure functions only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from protocol.events import ClientEvent
from protocol.objects import JsonObject, Operation

BoundaryKey = tuple[str, str]
"""`(source agentSessionId, source turnId)`: one fork boundary, the unit of a mutation."""

ACK_DEADLINE_S = 10.0
ACK_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Delays before each ACK retry; the last one repeats (seed 000 §8.3: 1/2/5/10/30 s, capped)."""
CREATE_DEADLINE_S = 30.0
POLL_INTERVAL_S = 0.25
GET_DEADLINE_S = 10.0
REQUEST_TIMEOUT_S = 30.0
"""How long `Engine.request` waits for a reply unless told (`request_timeout`, `timeout`)."""
MAX_SETTLED = 128
LATEST_SETTLED = "latestSettled"
"""The turn component of a full-Session fork's boundary key: `(source, LATEST_SETTLED)`. The
daemon resolves the real boundary (the newest settled Turn) at prepare; the record learns it
from the operation (`boundary_turn_id`). Turn ids are UUIDs, so it never names a Turn."""
THROUGH_TURN = "throughTurn"


class MutationStatus(StrEnum):
    """Where a fork mutation stands, as the GUI sees it (seed 000 §9)."""

    IN_FLIGHT = "inFlight"
    """Sent, or accepted by the daemon; a second click sends nothing."""
    SUCCEEDED = "succeeded"
    """Committed and adopted: the child is in the session cache; see `ack` for the ACK."""
    FAILED = "failed"
    """Confirmed failure: nothing was created, the boundary is free; a new click gets new ids."""
    UNKNOWN = "unknown"
    """Delivery unknown (durable `unknown`, timeout, lost reply): a retry reuses the same ids."""


class AckState(StrEnum):
    """The client-observed ACK of a committed operation (seed 000 §8.3)."""

    NONE = "none"
    """Not committed (yet); nothing to acknowledge."""
    PENDING = "pending"
    """Committed and adopted; the ACK has not succeeded yet and is being retried."""
    OBSERVED = "observed"
    """The daemon confirmed the ACK; the boundary barrier is released."""


@dataclass(frozen=True, slots=True)
class ForkMutation:
    """One fork mutation: the identities the Engine owns and what is known of its operation."""

    source_session_id: str
    turn_id: str
    request_id: str
    target_session_id: str
    status: MutationStatus
    operation_id: str | None = None
    phase: str | None = None
    ack: AckState = AckState.NONE
    ack_attempts: int = 0
    create_attempts: int = 0
    error: str | None = None
    child_session_id: str | None = None
    error_detail: JsonObject | None = None
    """The daemon's error reply when `fork.create` was refused before any operation:
    `{status, code, reason, message, params}` (`params.forkBoundaryReason` says why)."""
    point: str = THROUGH_TURN
    """`throughTurn`, or `latestSettled` for a full-Session fork (`turn_id` is then
    `LATEST_SETTLED`)."""
    boundary_turn_id: str | None = None
    """The Turn the fork goes through: `turn_id` for `throughTurn`; for `latestSettled` the
    Turn the daemon resolved (from the operation's point), None until an operation is known."""
    workspace: str = "shared"
    """`shared` (the child works in the source's directory) or `worktree` (a tree of its own
    holding the fork Turn's files); part of the request's identity, so a retry keeps it."""
    recorded_unknown: bool = False
    """The daemon recorded the operation `unknown` (not: this client lost its reply): a retry
    under the same `requestId` answers the same operation, so only a person's `fork.resolve`
    (inspect, adopt or abandon) settles it."""

    @property
    def boundary(self) -> str | None:
        return self.turn_id if self.point == THROUGH_TURN else self.boundary_turn_id

    @property
    def key(self) -> BoundaryKey:
        return (self.source_session_id, self.turn_id)

    @property
    def settled(self) -> bool:
        """Nothing left to do: only settled records may be pruned (unknown/ACK pending never)."""
        return self.status is MutationStatus.FAILED or (
            self.status is MutationStatus.SUCCEEDED and self.ack is AckState.OBSERVED
        )

    def to_dict(self) -> JsonObject:
        return {
            "sourceAgentSessionId": self.source_session_id,
            "turnId": self.turn_id,
            "requestId": self.request_id,
            "targetAgentSessionId": self.target_session_id,
            "operationId": self.operation_id,
            "status": self.status.value,
            "phase": self.phase,
            "ack": self.ack.value,
            "ackAttempts": self.ack_attempts,
            "createAttempts": self.create_attempts,
            "error": self.error,
            "childAgentSessionId": self.child_session_id,
            "errorDetail": None if self.error_detail is None else dict(self.error_detail),
            "point": self.point,
            "boundaryTurnId": self.boundary,
            "workspace": self.workspace,
        }


class ChangeKind(StrEnum):
    MUTATION = "mutation"
    """A fork mutation changed (`key` names it)."""
    SESSION = "session"
    """A session was upserted into or removed from the cache (`session_id` names it)."""
    EVENT = "event"
    """A raw daemon event (`event`), e.g. `turn.updated`, for views that render it."""
    OPERATION = "operation"
    """The set of known `unknown` operations changed (`key` = source and boundary Turn)."""


@dataclass(frozen=True, slots=True)
class EngineChange:
    kind: ChangeKind
    key: BoundaryKey | None = None
    session_id: str | None = None
    event: ClientEvent | None = None


Listener = Callable[[EngineChange], None]


def operation_key(op: Operation) -> BoundaryKey:
    """The boundary key of a wire operation: `(source, turnId)` for `throughTurn`,
    `(source, LATEST_SETTLED)` for a full-Session fork."""
    point = op.get("point") or {}
    source = str(op.get("sourceAgentSessionId"))
    if point.get("type") == LATEST_SETTLED:
        return (source, LATEST_SETTLED)
    return (source, str(point.get("turnId")))


def same_boundary(record: ForkMutation, op: Operation) -> bool:
    """Whether a wire operation may be this record's: same source, and the same boundary Turn
    once the record knows it, whatever point kind created the operation (the daemon's barrier
    answers a `latestSettled` request with the `throughTurn` operation holding the Turn, and
    the reverse). A full-Session record learns its Turn from the first operation it gets."""
    if op.get("sourceAgentSessionId") != record.source_session_id:
        return False
    boundary = record.boundary
    return boundary is None or boundary == (op.get("point") or {}).get("turnId")
