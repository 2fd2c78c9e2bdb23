"""The turn events a driver streams to the host (docs/design/internals.md "Turn events"),
standard library only: a driver builds each as its `TurnEvent` type, the worker sends it with
`to_wire`, and the host parses it once with `turn_event_from_wire` at its end of the link."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from domain.worker_messages import MalformedMessage


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """`turn.started`: the provider's turn id of the Turn; `binding_json`, when set, is the
    Turn's first `turn.binding` carried by the same event (a driver that knows both at once:
    the host handles it as the start followed by that binding, one message, not two)."""

    TYPE: ClassVar[str] = "turn.started"
    turn_id: str
    provider_turn_id: str
    binding_json: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "providerTurnId": self.provider_turn_id,
        }
        if self.binding_json is not None:
            out["bindingJson"] = self.binding_json
        return out


@dataclass(frozen=True, slots=True)
class TurnItem:
    """One Message of the Turn (`item: {kind, text, payload}`: assistant, reasoning,
    tool_call, tool_result, user, …); `item` is kept as sent."""

    TYPE: ClassVar[str] = "item"
    turn_id: str
    item: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.item.get("kind") or "assistant")

    @property
    def text(self) -> str | None:
        text = self.item.get("text")
        return None if text is None else str(text)

    @property
    def payload(self) -> dict[str, Any]:
        return dict(self.item.get("payload") or {})

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id, "item": dict(self.item)}


@dataclass(frozen=True, slots=True)
class InteractionRequested:
    TYPE: ClassVar[str] = "interaction.requested"
    turn_id: str
    request_id: str
    kind: str
    input: Mapping[str, Any]
    # Any further keys a driver sends (kept as sent).
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "requestId": self.request_id,
            "kind": self.kind,
            "input": dict(self.input),
            **self.extra,
        }


@dataclass(frozen=True, slots=True)
class TurnBindingMoved:
    """`turn.binding`: the Turn's provider checkpoint (binding JSON); may come after the Turn
    settled (Claude's trailing system message)."""

    TYPE: ClassVar[str] = "turn.binding"
    turn_id: str
    binding_json: str

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id, "bindingJson": self.binding_json}


@dataclass(frozen=True, slots=True)
class TurnCompleted:
    TYPE: ClassVar[str] = "turn.completed"
    turn_id: str
    provider_turn_id: str
    outcome: str  # domain.enums.TurnOutcome's values
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "providerTurnId": self.provider_turn_id,
            "outcome": self.outcome,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


PROGRESS = "progress"
"""The `MessageDelta` kind of a provider's note about its own work on the Turn (a retry of the
model request): one line per delta, for a person; never settled into a message."""


@dataclass(frozen=True, slots=True)
class MessageDelta:
    """A piece of a reply as it streams (`kind` `assistant` or `reasoning`), or a `progress`
    note: published, never stored."""

    TYPE: ClassVar[str] = "message.delta"
    turn_id: str
    item_id: str
    kind: str
    delta: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "turnId": self.turn_id,
            "itemId": self.item_id,
            "kind": self.kind,
            "delta": self.delta,
        }


ACTIVITY_STREAM = "stream"
"""`TurnActivity.kind` the host gives a reply's `message.delta` (`assistant`, `reasoning`): the
model is in the middle of a reply, and the host's stream-idle backstop runs from it."""
ACTIVITY_PROGRESS = "progress"
"""`TurnActivity.kind` the host gives a `progress` note (the provider retries its model request
on its own): not silence, but not the model answering either."""
ACTIVITY_ITEM = "item"
"""`TurnActivity.kind` a driver sends when the model has answered with an item that now runs
(a tool call, a command): the model is not mid-stream while it runs. Also what a
`turn.activity` without a kind (an older driver) reads as."""


@dataclass(frozen=True, slots=True)
class TurnActivity:
    """A note that the Turn is not hung: from the host, a reply is streaming (`stream`) or the
    provider retries (`progress`); from a driver, the model has answered with a tool that is now
    running (`item`; nothing else to show meanwhile)."""

    TYPE: ClassVar[str] = "turn.activity"
    turn_id: str
    kind: str = ACTIVITY_ITEM

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "turnId": self.turn_id, "kind": self.kind}


TurnEvent = (
    TurnStarted
    | TurnItem
    | InteractionRequested
    | TurnBindingMoved
    | TurnCompleted
    | MessageDelta
    | TurnActivity
)
"""Every event a driver streams for a Turn (plus the host's `turn.activity`)."""


def turn_event_from_wire(event: Mapping[str, Any]) -> TurnEvent:
    """The typed event of a wire map; `MalformedMessage` for an unknown `type`."""
    kind = event.get("type")
    turn_id = str(event.get("turnId") or "")
    if kind == TurnStarted.TYPE:
        binding = event.get("bindingJson")
        return TurnStarted(
            turn_id,
            str(event.get("providerTurnId") or ""),
            None if binding is None else str(binding),
        )
    if kind == TurnItem.TYPE:
        item = event.get("item")
        return TurnItem(turn_id, dict(item) if isinstance(item, Mapping) else {})
    if kind == InteractionRequested.TYPE:
        known = {"type", "turnId", "requestId", "kind", "input"}
        raw_input = event.get("input")
        return InteractionRequested(
            turn_id,
            str(event.get("requestId")),
            str(event.get("kind") or "question"),
            dict(raw_input) if isinstance(raw_input, Mapping) else {},
            {k: v for k, v in event.items() if k not in known},
        )
    if kind == TurnBindingMoved.TYPE:
        return TurnBindingMoved(turn_id, str(event.get("bindingJson") or ""))
    if kind == TurnCompleted.TYPE:
        error = event.get("error")
        return TurnCompleted(
            turn_id,
            str(event.get("providerTurnId") or ""),
            str(event.get("outcome") or "completed"),
            None if error is None else str(error),
        )
    if kind == MessageDelta.TYPE:
        return MessageDelta(
            turn_id,
            str(event.get("itemId") or ""),
            str(event.get("kind") or ""),
            str(event.get("delta") or ""),
        )
    if kind == TurnActivity.TYPE:
        return TurnActivity(turn_id, str(event.get("kind") or ACTIVITY_ITEM))
    raise MalformedMessage(f"unknown turn event type {kind!r}")
