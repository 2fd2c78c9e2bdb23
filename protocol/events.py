"""The events the daemon publishes (docs/protocol.md "Events"), each after its change is
durable: their `type` names and bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypedDict

from protocol.objects import JsonObject, Operation, Session, Turn

EventType = Literal["session.upserted", "session.removed", "turn.updated", "fork.operation"]

SESSION_UPSERTED: Final = "session.upserted"
SESSION_REMOVED: Final = "session.removed"
TURN_UPDATED: Final = "turn.updated"
FORK_OPERATION: Final = "fork.operation"
MESSAGE_DELTA: Final = "message.delta"
"""Streamed text (docs/protocol.md "Streaming"): published, never stored, so not in
`EVENT_TYPES` (the durable events)."""


class SessionUpserted(TypedDict):
    type: Literal["session.upserted"]
    session: Session


class SessionRemoved(TypedDict):
    type: Literal["session.removed"]
    agentSessionId: str


class EventTurn(Turn, total=False):
    """A Turn as `turn.updated` carries it: whole, or only its messages at ordinals
    `messagesFrom` .. `messageCount - 1` with `messagesTruncated: true`."""

    messagesTruncated: bool
    messageCount: int
    messagesFrom: int


class InteractionsTruncatedTurn(EventTurn, total=False):
    """An `EventTurn` some of whose Interactions are carried without their input and output
    (`omitted`), with `interactionsTruncated: true`: read the Turn with `session.timeline`."""

    interactionsTruncated: bool


class TurnUpdated(TypedDict):
    type: Literal["turn.updated"]
    agentSessionId: str
    turn: Turn | EventTurn
    """Whole (a `Turn`), or a run of its messages (an `EventTurn` with `messagesTruncated`)."""


class ForkOperationEvent(TypedDict):
    type: Literal["fork.operation"]
    operation: Operation


class MessageDelta(TypedDict):
    type: Literal["message.delta"]
    agentSessionId: str
    turnId: str
    itemId: str
    kind: str
    """`assistant`, `reasoning` or `progress` from the providers this daemon runs; the
    daemon passes on what the provider's worker said."""
    delta: str


Event = SessionUpserted | SessionRemoved | TurnUpdated | ForkOperationEvent | MessageDelta


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event a client does not know: a `type` this table lacks (a newer daemon), or a known
    `type` whose body misses a key its type requires. Kept whole so a client can log or show
    it; never a crash, never silently dropped by the decoder."""

    type: str
    """The body's `type` as sent ("" when it had none or not a string)."""
    body: JsonObject
    """The decoded body (`{"value": …}` around a frame that was not a map)."""
    problem: str
    """Why it is not one of `Event`: `unknown type`, or the key that is missing or wrong."""


ClientEvent = Event | UnknownEvent
"""What a client's event subscriber hands on: a typed event, or an `UnknownEvent`."""

EVENT_SHAPES: dict[str, type] = {
    SESSION_UPSERTED: SessionUpserted,
    SESSION_REMOVED: SessionRemoved,
    TURN_UPDATED: TurnUpdated,
    FORK_OPERATION: ForkOperationEvent,
    MESSAGE_DELTA: MessageDelta,
}
"""Every event `type` a client decodes, with its body type: the durable events and
`message.delta`."""

EVENT_TYPES: tuple[EventType, ...] = (
    SESSION_UPSERTED,
    SESSION_REMOVED,
    TURN_UPDATED,
    FORK_OPERATION,
)
