"""Client-side helpers shared by the CLI, the GUI and the demo: streaming a turn to settlement,
resolving session/turn references, and the pure view rules (lineage tree, Fork action, divider).

The view rules live here, free of Textual, so the CLI and the GUI show the same thing and tests
can pin them without a terminal.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from transport.client import ApiError, Client, EventSubscriber
from transport.security import ClientCurve

POLL_S = 0.05
STREAM_POLL_S = 0.25

Json = dict[str, Any]


# -- view rules (seed 000 §9) ---------------------------------------------------------------


class TurnWaitTimeout(TimeoutError):
    """The daemon answered, but the Turn was still active when the caller's wait ran out (the
    Turn itself goes on in the daemon). Distinct from a `ClientTimeout` (no reply at all)."""

    def __init__(self, turn_id: str, timeout: float) -> None:
        super().__init__(f"turn {turn_id} still active after {timeout:g} s")
        self.turn_id = turn_id


class ForkAction(StrEnum):
    """How a Turn's Fork action is shown."""

    HIDDEN = "hidden"
    """The Session cannot fork through this Turn at all: capability false, a child-lane
    (non-root) Session, a Turn not settled, or a Turn whose provider binding is not `bound`."""
    ENABLED = "enabled"
    DISABLED = "disabled"
    """Shown but not clickable: a fork through this exact Turn is in flight."""


def fork_action(session: Mapping[str, Any], turn: Mapping[str, Any], pending: bool) -> ForkAction:
    capabilities = session.get("lifecycleCapabilities") or {}
    if not capabilities.get("forkThroughTurn") or session.get("kind") != "root":
        return ForkAction.HIDDEN
    if turn.get("phase") != "settled" or turn.get("providerForkBindingState") != "bound":
        return ForkAction.HIDDEN
    return ForkAction.DISABLED if pending else ForkAction.ENABLED


def divider_after(session: Mapping[str, Any], turns: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the loaded Turn after which "continued from …" goes, or None.

    Only right after the Turn that `forkedFrom.targetTurnId` names; while that Turn is not
    loaded the divider is hidden, never moved to the end of the timeline.
    """
    lineage = session.get("forkedFrom")
    if not isinstance(lineage, Mapping):
        return None
    for index, turn in enumerate(turns):
        if turn.get("turnId") == lineage.get("targetTurnId"):
            return index
    return None


@dataclass(frozen=True, slots=True)
class TreeRow:
    depth: int
    session: Json


def session_tree(sessions: Iterable[Mapping[str, Any]]) -> list[TreeRow]:
    """Sessions in lineage order: each fork child under its source (orphans become roots)."""
    by_id = {str(s["agentSessionId"]): dict(s) for s in sessions}
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for sid, session in by_id.items():
        source = (session.get("forkedFrom") or {}).get("sourceAgentSessionId")
        if source in by_id and source != sid:
            children.setdefault(str(source), []).append(sid)
        else:
            roots.append(sid)

    def order(ids: list[str]) -> list[str]:
        return sorted(ids, key=lambda i: (by_id[i].get("createdAtUnixMs") or 0, i))

    rows: list[TreeRow] = []
    seen: set[str] = set()

    def walk(sid: str, depth: int) -> None:
        if sid in seen:
            return
        seen.add(sid)
        rows.append(TreeRow(depth, by_id[sid]))
        for child in order(children.get(sid, [])):
            walk(child, depth + 1)

    for root in order(roots):
        walk(root, 0)
    return rows


def divider_text(source_title: str) -> str:
    return f"continued from {source_title}"


# -- references ----------------------------------------------------------------------------


class ReferenceError_(LookupError):
    """A session or turn reference that matches nothing, or more than one thing."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def list_sessions(client: Client, ws: str) -> list[Json]:
    sessions: list[Json] = []
    cursor: str | None = None
    while True:
        params: Json = {"workspaceId": ws, "limit": 200}
        if cursor:
            params["cursor"] = cursor
        page = client.call("session.list", params)
        sessions.extend(page["sessions"])
        cursor = page.get("nextCursor")
        if not cursor:
            return sessions


def resolve_session(client: Client, ws: str, ref: str) -> str:
    """A full session id as given, or the one session whose id starts with `ref`."""
    if _is_uuid(ref):
        return ref
    matches = [
        s["agentSessionId"]
        for s in list_sessions(client, ws)
        if s["agentSessionId"].startswith(ref)
    ]
    if len(matches) == 1:
        return str(matches[0])
    if not matches:
        raise ReferenceError_("workspace_agent_session_not_found", f"no session matches {ref!r}")
    raise ReferenceError_("ambiguous_reference", f"{ref!r} matches {len(matches)} sessions")


def timeline(client: Client, ws: str, sid: str) -> list[Json]:
    turns: list[Json] = []
    after = 0
    while True:
        page = client.call(
            "session.timeline",
            {"workspaceId": ws, "agentSessionId": sid, "afterSequence": after, "limit": 200},
        )
        turns.extend(page["turns"])
        nxt = page.get("nextSequence")
        if not nxt or not page["turns"]:
            return turns
        after = int(page["turns"][-1]["sequence"])


def resolve_turn(turns: Sequence[Mapping[str, Any]], ref: str) -> str:
    """A Turn by id, by sequence number (`2`), or by unique id prefix."""
    for turn in turns:
        if turn["turnId"] == ref:
            return str(turn["turnId"])
    if ref.isdigit():
        for turn in turns:
            if int(turn["sequence"]) == int(ref):
                return str(turn["turnId"])
        raise ReferenceError_("turn_not_found", f"no turn with sequence {ref}")
    matches = [t["turnId"] for t in turns if str(t["turnId"]).startswith(ref)]
    if len(matches) == 1:
        return str(matches[0])
    if not matches:
        raise ReferenceError_("turn_not_found", f"no turn matches {ref!r}")
    raise ReferenceError_("ambiguous_reference", f"{ref!r} matches {len(matches)} turns")


# -- turns ---------------------------------------------------------------------------------


def get_turn(client: Client, ws: str, sid: str, turn_id: str, sequence: int | None = None) -> Json:
    if sequence is not None:
        page = client.call(
            "session.timeline",
            {"workspaceId": ws, "agentSessionId": sid, "afterSequence": sequence - 1, "limit": 1},
        )
        for turn in page["turns"]:
            if turn["turnId"] == turn_id:
                return dict(turn)
    for turn in timeline(client, ws, sid):
        if turn["turnId"] == turn_id:
            return dict(turn)
    raise LookupError(f"turn {turn_id} not in session {sid}")


class TurnPrinter:
    """Prints each message of a turn once, when it can no longer grow."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.printed: set[str] = set()
        self.asked: set[str] = set()

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
            self.emit(format_message(message))


def format_message(message: Mapping[str, Any]) -> str:
    return f"  {message.get('kind', ''):>9}: {message.get('text') or ''}"


InteractionHandler = Callable[[Mapping[str, Any]], "Json | None"]
"""Given a pending Interaction, the `response` to send, or None to leave it pending."""


def stream_turn(
    client: Client,
    ws: str,
    sid: str,
    text: str,
    *,
    events_endpoint: str | None = None,
    events_curve: ClientCurve | None = None,
    on_update: Callable[[Json], None] | None = None,
    on_interaction: InteractionHandler | None = None,
    timeout: float = 600.0,
    request_id: str | None = None,
) -> Json:
    """Submit a turn and follow it to settlement, from `turn.updated` events when an events
    endpoint is given (polling as a fallback: a SUB socket misses what precedes its join)."""
    subscriber = (
        EventSubscriber(events_endpoint, (ws,), curve=events_curve) if events_endpoint else None
    )
    try:
        turn = client.call(
            "turn.submit",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "requestId": request_id or str(uuid.uuid4()),
                "input": [{"type": "text", "text": text}],
            },
        )["turn"]
        turn_id, sequence = turn["turnId"], int(turn["sequence"])
        answered: set[str] = set()
        deadline = time.monotonic() + timeout
        while True:
            if on_update is not None:
                on_update(turn)
            if turn["phase"] == "settled":
                return dict(turn)
            for interaction in turn.get("interactions") or []:
                if interaction["status"] != "pending" or interaction["requestId"] in answered:
                    continue
                response = None if on_interaction is None else on_interaction(interaction)
                if response is None:
                    continue
                answered.add(interaction["requestId"])
                client.call(
                    "interaction.respond",
                    {
                        "workspaceId": ws,
                        "agentSessionId": sid,
                        "turnId": turn_id,
                        "requestId": interaction["requestId"],
                        "response": response,
                    },
                )
            if time.monotonic() > deadline:
                raise TurnWaitTimeout(turn_id, timeout)
            fresh = _next_turn_event(subscriber, ws, sid, turn_id)
            turn = fresh if fresh is not None else get_turn(client, ws, sid, turn_id, sequence)
    finally:
        if subscriber is not None:
            subscriber.close()


def _next_turn_event(
    subscriber: EventSubscriber | None, ws: str, sid: str, turn_id: str
) -> Json | None:
    if subscriber is None:
        time.sleep(POLL_S)
        return None
    deadline = time.monotonic() + STREAM_POLL_S
    while (left := deadline - time.monotonic()) > 0:
        message = subscriber.next_message(left)
        if message is None:
            return None
        topic, event = message
        if (
            topic == ws
            and event.get("type") == "turn.updated"
            and event.get("agentSessionId") == sid
            and (event.get("turn") or {}).get("turnId") == turn_id
        ):
            return dict(event["turn"])
    return None


def run_turn(
    client: Client, ws: str, sid: str, text: str, *, echo: bool = False, timeout: float = 120.0
) -> Json:
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
) -> Json:
    """fork.create, then fork.get while accepted; a committed result is ACKed (seed 000 §8.3).

    A one-shot helper: a lost reply is not retried here. Interactive clients use the Engine.
    """
    op = client.call(
        "fork.create",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "targetAgentSessionId": str(uuid.uuid4()),
            "point": {"type": "throughTurn", "turnId": turn_id},
        },
    )["operation"]
    deadline = time.monotonic() + timeout
    while op["status"] == "accepted":
        if progress is not None:
            progress(op["phase"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"fork {op['operationId']} still accepted after {timeout} s")
        time.sleep(POLL_S * 2)
        op = client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
            "operation"
        ]
    if op["status"] == "committed" and acknowledge:
        op = client.call("fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})[
            "operation"
        ]
    return dict(op)


# -- transcript ----------------------------------------------------------------------------


def source_title(client: Client, ws: str, session: Mapping[str, Any]) -> str | None:
    """The current title of a child's source session, or None when it is gone."""
    lineage = session.get("forkedFrom")
    if not isinstance(lineage, Mapping):
        return None
    try:
        source = client.call(
            "session.get", {"workspaceId": ws, "agentSessionId": lineage["sourceAgentSessionId"]}
        )["session"]
    except ApiError:
        return None
    return str(source["title"])


def format_transcript(
    session: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], source: str | None = None
) -> str:
    """Human transcript: Turn ids, phases, binding states, lineage and the divider."""
    capabilities = session.get("lifecycleCapabilities") or {}
    lines = [
        f"Session {session['agentSessionId']} — {session['title']} [{session['provider']}]"
        f"  fork through turn: {'yes' if capabilities.get('forkThroughTurn') else 'no'}"
    ]
    lineage = session.get("forkedFrom")
    if isinstance(lineage, Mapping):
        lines.append(
            f"  forked from {source or lineage['sourceAgentSessionId']} "
            f"({lineage['sourceAgentSessionId']}) through turn {lineage['sourceTurnId']}, "
            f"operation {lineage['operationId']}"
        )
    boundary = divider_after(session, turns)
    for index, turn in enumerate(turns):
        outcome = f"/{turn['outcome']}" if turn.get("outcome") else ""
        lines.append(
            f"  Turn {turn['sequence']} {turn['turnId']} [{turn['phase']}{outcome}, "
            f"binding {turn['providerForkBindingState']}]"
        )
        for message in turn.get("messages") or []:
            lines.append("  " + format_message(message))
        for interaction in turn.get("interactions") or []:
            lines.append(
                f"    {interaction['kind']:>9}? {interaction['status']} {interaction['input']}"
            )
        if index == boundary:
            title = source or (lineage or {}).get("sourceAgentSessionId", "the source")
            lines.append(f"    ──── {divider_text(str(title))} ────")
    return "\n".join(lines)
