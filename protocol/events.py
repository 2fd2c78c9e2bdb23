"""The events the daemon publishes (docs/protocol.md "Events"), each after its change is
durable: their `type` names and bodies."""

from __future__ import annotations

from typing import Final, Literal, TypedDict

from protocol.objects import Operation, Session, Turn

EventType = Literal["session.upserted", "session.removed", "turn.updated", "fork.operation"]

SESSION_UPSERTED: Final = "session.upserted"
SESSION_REMOVED: Final = "session.removed"
TURN_UPDATED: Final = "turn.updated"
FORK_OPERATION: Final = "fork.operation"


class SessionUpserted(TypedDict):
    type: Literal["session.upserted"]
    session: Session


class SessionRemoved(TypedDict):
    type: Literal["session.removed"]
    agentSessionId: str


class TurnUpdated(TypedDict):
    type: Literal["turn.updated"]
    agentSessionId: str
    turn: Turn


class ForkOperationEvent(TypedDict):
    type: Literal["fork.operation"]
    operation: Operation


Event = SessionUpserted | SessionRemoved | TurnUpdated | ForkOperationEvent

EVENT_TYPES: tuple[EventType, ...] = (
    SESSION_UPSERTED,
    SESSION_REMOVED,
    TURN_UPDATED,
    FORK_OPERATION,
)
