"""Following one request to its end without an Engine: a Turn submitted and streamed to its
settlement (events first, polling as the fallback; pending Interactions answered through a
handler), printed as it goes, and a one-shot fork followed to its commit and ACK.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from client.references import timeline
from client.transcript_text import format_message, says_nothing
from protocol.events import MESSAGE_DELTA, TURN_UPDATED, EventTurn, MessageDelta, UnknownEvent
from protocol.methods import (
    FORK_ACKNOWLEDGE,
    FORK_CREATE,
    FORK_GET,
    INTERACTION_RESPOND,
    SESSION_TIMELINE,
    TURN_SUBMIT,
    AnsweredBy,
    ForkCreateParams,
    InteractionRespondParams,
    OperationParams,
    TimelineParams,
    TurnSubmitParams,
)
from protocol.objects import Interaction, JsonObject, Operation, Turn
from transport.client import ApiError, Client, EventSubscriber, merge_turn
from transport.security import ClientCurve

POLL_S = 0.05
STREAM_POLL_S = 0.25


class TurnWaitTimeout(TimeoutError):
    """The daemon answered, but the Turn was still active when the caller's wait ran out (the
    Turn itself goes on in the daemon). Distinct from a `ClientTimeout` (no reply at all)."""

    def __init__(self, turn_id: str, timeout: float) -> None:
        super().__init__(f"turn {turn_id} still active after {timeout:g} s")
        self.turn_id = turn_id


# -- turns ---------------------------------------------------------------------------------


def get_turn(client: Client, ws: str, sid: str, turn_id: str, sequence: int | None = None) -> Turn:
    if sequence is not None:
        page = client.call(
            SESSION_TIMELINE,
            TimelineParams(workspaceId=ws, agentSessionId=sid, afterSequence=sequence - 1, limit=1),
        )
        for turn in page["turns"]:
            if turn["turnId"] == turn_id:
                return turn
    for known in timeline(client, ws, sid):
        if known["turnId"] == turn_id:
            return known
    raise LookupError(f"turn {turn_id} not in session {sid}")


class TurnPrinter:
    """Prints each message of a turn once, when it can no longer grow; with `write`, an
    assistant reply is printed as it streams (`message.delta`) and its line is ended when
    the settled message arrives."""

    def __init__(
        self, emit: Callable[[str], None], write: Callable[[str], None] | None = None
    ) -> None:
        self.emit = emit
        self.write = write
        self.printed: set[str] = set()
        self.asked: set[str] = set()
        self.streamed: dict[str, str] = {}  # provider item id → text written so far
        self.open_item: str | None = None  # the item whose line is still open

    def delta(self, event: MessageDelta) -> None:
        if event.get("kind") == "progress":
            # The provider's note about its own retry: a line of its own, as it happens.
            if self.open_item is not None and self.write is not None:
                self.write("\n")
                self.open_item = None
            self.emit(f"  {'progress':>9}: {event.get('delta') or ''}")
            return
        if self.write is None or event.get("kind") != "assistant":
            return
        item = str(event.get("itemId") or "")
        text = str(event.get("delta") or "")
        if item != self.open_item:
            if self.open_item is not None:
                self.write("\n")
            self.write(f"  {'assistant':>9}: ")
            self.open_item = item
        self.streamed[item] = self.streamed.get(item, "") + text
        self.write(text)

    def update(self, turn: Mapping[str, Any]) -> None:
        messages = list(turn.get("messages") or [])
        settled = turn.get("phase") == "settled"
        for index, message in enumerate(messages):
            if message["messageId"] in self.printed:
                continue
            last = index == len(messages) - 1
            if not settled and last and message.get("kind") == "assistant":
                continue  # may still be streaming
            self.printed.add(message["messageId"])
            item = str((message.get("payload") or {}).get("providerItemId") or "")
            seen = self.streamed.pop(item, None) if item else None
            text = str(message.get("text") or "")
            if seen is not None and self.write is not None and text.startswith(seen):
                # Already on screen as it streamed: finish the line (and any missed tail).
                self.write(text[len(seen) :] + "\n")
                if self.open_item == item:
                    self.open_item = None
                continue
            if says_nothing(message):
                continue
            if self.open_item is not None and self.write is not None:
                self.write("\n")
                self.open_item = None
            self.emit(format_message(message))


InteractionHandler = Callable[[Interaction], JsonObject | None]
"""Given a pending Interaction, the `response` to send, or None to leave it pending; it raises
`AnsweredElsewhere` when another client answered it meanwhile."""


class AnsweredElsewhere(Exception):  # noqa: N818 - an outcome the handler reports, not a fault
    """Raised by an `InteractionHandler`: another client answered the Interaction first, so
    there is nothing to send and the Turn goes on."""


def stream_turn(
    client: Client,
    ws: str,
    sid: str,
    text: str,
    *,
    events_endpoint: str | None = None,
    events_curve: ClientCurve | None = None,
    events_exact: bool = False,
    on_update: Callable[[Turn], None] | None = None,
    on_interaction: InteractionHandler | None = None,
    timeout: float = 600.0,
    request_id: str | None = None,
    on_delta: Callable[[MessageDelta], None] | None = None,
    answered_by: AnsweredBy | None = None,
) -> Turn:
    """Submit a turn and follow it to settlement, from `turn.updated` events when an events
    endpoint is given (polling as a fallback: a SUB socket misses what precedes its join);
    `on_delta` gets the turn's `message.delta` events as the reply streams; `events_exact`:
    the endpoint is the daemon's terminated-topic one (`eventsExact`); `answered_by`: who this
    client is, recorded with each answer it sends (`interaction.respond`'s `by`)."""
    subscriber = (
        EventSubscriber(events_endpoint, (ws,), curve=events_curve, exact=events_exact)
        if events_endpoint
        else None
    )
    try:
        turn = client.call(
            TURN_SUBMIT,
            TurnSubmitParams(
                workspaceId=ws,
                agentSessionId=sid,
                requestId=request_id or str(uuid.uuid4()),
                input=[{"type": "text", "text": text}],
            ),
        )["turn"]
        turn_id, sequence = turn["turnId"], int(turn["sequence"])
        answered: set[str] = set()
        deadline = time.monotonic() + timeout
        while True:
            if on_update is not None:
                on_update(turn)
            if turn["phase"] == "settled":
                return turn
            for interaction in turn.get("interactions") or []:
                if interaction["status"] != "pending" or interaction["requestId"] in answered:
                    continue
                try:
                    response = None if on_interaction is None else on_interaction(interaction)
                except AnsweredElsewhere:
                    answered.add(interaction["requestId"])
                    continue
                if response is None:
                    continue
                answered.add(interaction["requestId"])
                answer = InteractionRespondParams(
                    workspaceId=ws,
                    agentSessionId=sid,
                    turnId=turn_id,
                    requestId=interaction["requestId"],
                    response=response,
                )
                if answered_by:
                    answer["by"] = answered_by
                try:
                    client.call(INTERACTION_RESPOND, answer)
                except ApiError as exc:
                    # Answered elsewhere in the same instant: that answer stands and the Turn
                    # goes on; the printed Interaction says whose it was.
                    if (exc.status, exc.reason) != (409, "conflict"):
                        raise
            if time.monotonic() > deadline:
                raise TurnWaitTimeout(turn_id, timeout)
            fresh = _next_turn_event(subscriber, ws, sid, turn_id, on_delta)
            # An event carries the messages added since the previous one: merge it by message
            # id; a gap (a missed event, a message too big for one) is read back whole.
            merged = None if fresh is None else merge_turn(turn, fresh)
            turn = merged if merged is not None else get_turn(client, ws, sid, turn_id, sequence)
    finally:
        if subscriber is not None:
            subscriber.close()


def _next_turn_event(
    subscriber: EventSubscriber | None,
    ws: str,
    sid: str,
    turn_id: str,
    on_delta: Callable[[MessageDelta], None] | None = None,
) -> Turn | EventTurn | None:
    if subscriber is None:
        time.sleep(POLL_S)
        return None
    deadline = time.monotonic() + STREAM_POLL_S
    while (left := deadline - time.monotonic()) > 0:
        message = subscriber.next_message(left)
        if message is None:
            return None
        topic, event = message
        if topic != ws or isinstance(event, UnknownEvent):
            continue  # an event of a newer daemon says nothing about this Turn
        if (
            on_delta is not None
            and event["type"] == MESSAGE_DELTA
            and event["agentSessionId"] == sid
            and event["turnId"] == turn_id
        ):
            on_delta(event)
            continue
        if (
            event["type"] == TURN_UPDATED
            and event["agentSessionId"] == sid
            and event["turn"].get("turnId") == turn_id
        ):
            return event["turn"]
    return None


def run_turn(
    client: Client, ws: str, sid: str, text: str, *, echo: bool = False, timeout: float = 120.0
) -> Turn:
    """Submit a turn and poll until it settles; with `echo`, print messages as they settle."""
    printer = TurnPrinter(print)
    return stream_turn(
        client, ws, sid, text, on_update=printer.update if echo else None, timeout=timeout
    )


# -- forks (without an Engine: the demo and scripts) ---------------------------------------


def fork_and_wait(
    client: Client,
    ws: str,
    sid: str,
    turn_id: str,
    *,
    progress: Callable[[str], None] | None = None,
    timeout: float = 120.0,
    acknowledge: bool = True,
) -> Operation:
    """fork.create, then fork.get while accepted; a committed result is ACKed (seed 000 §8.3).

    A one-shot helper: a lost reply is not retried here. Interactive clients use the Engine.
    """
    op = client.call(
        FORK_CREATE,
        ForkCreateParams(
            workspaceId=ws,
            agentSessionId=sid,
            requestId=str(uuid.uuid4()),
            targetAgentSessionId=str(uuid.uuid4()),
            point={"type": "throughTurn", "turnId": turn_id},
        ),
    )["operation"]
    deadline = time.monotonic() + timeout
    while op["status"] == "accepted":
        if progress is not None:
            progress(op["phase"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"fork {op['operationId']} still accepted after {timeout} s")
        time.sleep(POLL_S * 2)
        op = client.call(FORK_GET, OperationParams(workspaceId=ws, operationId=op["operationId"]))[
            "operation"
        ]
    if op["status"] == "committed" and acknowledge:
        op = client.call(
            FORK_ACKNOWLEDGE, OperationParams(workspaceId=ws, operationId=op["operationId"])
        )["operation"]
    return op
