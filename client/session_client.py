"""Client-side helpers shared by the CLI, the GUI and the demo: streaming a turn to settlement,
resolving session/turn references, and the pure view rules (lineage tree, Fork action, divider).

The view rules live here, free of Textual, so the CLI and the GUI show the same thing and tests
can pin them without a terminal.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from transport.client import ApiError, Client, EventSubscriber, merge_turn
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
    BLOCKED = "blocked"
    """Shown but not clickable: the source is not quiet (a Turn is running or waiting for an
    answer); `fork_blocked` gives the reason for the tooltip."""


def fork_action(
    session: Mapping[str, Any], turn: Mapping[str, Any], pending: bool, blocked: bool = False
) -> ForkAction:
    capabilities = session.get("lifecycleCapabilities") or {}
    if not capabilities.get("forkThroughTurn") or session.get("kind") != "root":
        return ForkAction.HIDDEN
    if turn.get("phase") != "settled" or turn.get("providerForkBindingState") != "bound":
        return ForkAction.HIDDEN
    if pending:
        return ForkAction.DISABLED
    return ForkAction.BLOCKED if blocked else ForkAction.ENABLED


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


def resolve_operation(client: Client, ws: str, ref: str) -> str:
    """A full operation id as given, or the one committed fork operation (named by a live
    child's lineage) whose id starts with `ref`. A failed operation needs its full id: no wire
    method lists operations."""
    if _is_uuid(ref):
        return ref
    matches = sorted(
        {
            str(lineage["operationId"])
            for s in list_sessions(client, ws)
            if isinstance(lineage := s.get("forkedFrom"), Mapping)
            and str(lineage.get("operationId", "")).startswith(ref)
        }
    )
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return ref  # let the daemon say `agent_session_fork_operation_not_found`
    raise ReferenceError_("ambiguous_reference", f"{ref!r} matches {len(matches)} operations")


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

    def delta(self, event: Mapping[str, Any]) -> None:
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
            if self.open_item is not None and self.write is not None:
                self.write("\n")
                self.open_item = None
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
    events_exact: bool = False,
    on_update: Callable[[Json], None] | None = None,
    on_interaction: InteractionHandler | None = None,
    timeout: float = 600.0,
    request_id: str | None = None,
    on_delta: Callable[[Json], None] | None = None,
) -> Json:
    """Submit a turn and follow it to settlement, from `turn.updated` events when an events
    endpoint is given (polling as a fallback: a SUB socket misses what precedes its join);
    `on_delta` gets the turn's `message.delta` events as the reply streams; `events_exact`:
    the endpoint is the daemon's terminated-topic one (`eventsExact`)."""
    subscriber = (
        EventSubscriber(events_endpoint, (ws,), curve=events_curve, exact=events_exact)
        if events_endpoint
        else None
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
    on_delta: Callable[[Json], None] | None = None,
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
            on_delta is not None
            and topic == ws
            and event.get("type") == "message.delta"
            and event.get("agentSessionId") == sid
            and event.get("turnId") == turn_id
        ):
            on_delta(dict(event))
            continue
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


@dataclass(frozen=True, slots=True)
class Ancestor:
    """One step of a fork child's ancestry: the session id, its title (None when deleted)."""

    session_id: str
    title: str | None


def ancestry(
    client: Client, ws: str, session: Mapping[str, Any], limit: int = 64
) -> list[Ancestor]:
    """The sources of a fork child, oldest first, ending with the session itself.

    A deleted ancestor cannot be read any more: it is listed with `title=None` and the walk
    stops there (its own source is unknown to a client).
    """
    chain = [Ancestor(str(session["agentSessionId"]), str(session["title"]))]
    current: Mapping[str, Any] = session
    seen = {chain[0].session_id}
    while len(chain) < limit:
        lineage = current.get("forkedFrom")
        if not isinstance(lineage, Mapping):
            break
        source_id = str(lineage["sourceAgentSessionId"])
        if source_id in seen:
            break
        seen.add(source_id)
        try:
            current = client.call("session.get", {"workspaceId": ws, "agentSessionId": source_id})[
                "session"
            ]
        except ApiError:
            chain.append(Ancestor(source_id, None))
            break
        chain.append(Ancestor(source_id, str(current["title"])))
    chain.reverse()
    return chain


def format_ancestry(chain: Sequence[Ancestor]) -> str:
    """`A → A (2) → A (3)`; a deleted ancestor reads `(deleted <id8>)`."""
    return " → ".join(
        a.title if a.title is not None else f"(deleted {a.session_id[:8]})" for a in chain
    )


def describe_interaction(interaction: Mapping[str, Any]) -> str:
    """What an Interaction asks: the question, or the command/action awaiting approval."""
    value = interaction.get("input") or {}
    for key in ("text", "question", "command", "prompt", "title", "toolName"):
        if value.get(key):
            return str(value[key])
    return ", ".join(f"{k}={v}" for k, v in value.items()) or str(interaction.get("kind"))


def format_interaction(
    interaction: Mapping[str, Any], pending_hint: str = "answer with `agenthost answer`"
) -> str:
    """One readable line: `approval: ls  → approved`, `question: color?  → "blue"`, or the
    pending one with a hint to answer it."""
    kind = str(interaction.get("kind") or "interaction")
    head = f"{kind}: {describe_interaction(interaction)}"
    status = str(interaction.get("status") or "")
    output = interaction.get("output") or {}
    if status == "pending":
        return f"{head}  (pending — {pending_hint})"
    if "decision" in output:
        verdict = {"approve": "approved", "decline": "declined"}.get(
            str(output["decision"]), str(output["decision"])
        )
        return f"{head}  → {verdict}"
    if "text" in output:
        return f"{head}  → {json.dumps(str(output['text']), ensure_ascii=False)}"
    return f"{head}  ({status})"


def format_transcript(
    session: Mapping[str, Any],
    turns: Sequence[Mapping[str, Any]],
    source: str | None = None,
    chain: Sequence[Ancestor] | None = None,
) -> str:
    """Human transcript: Turn ids, phases, binding states, lineage, ancestry, the divider,
    Interactions and why a Turn failed or was interrupted."""
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
        if chain and len(chain) > 1:
            lines.append(f"  ancestry: {format_ancestry(chain)}")
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
            lines.append(f"      {format_interaction(interaction)}")
        why = turn_error_text(turn)
        if why:
            lines.append(f"      {why}")
        if index == boundary:
            title = source or (lineage or {}).get("sourceAgentSessionId", "the source")
            lines.append(f"    ──── {divider_text(str(title))} ────")
    return "\n".join(lines)


def turn_error_text(turn: Mapping[str, Any]) -> str | None:
    """`failed: <why>` / `interrupted: <why>` for a Turn that did not complete, else None."""
    outcome = turn.get("outcome")
    if turn.get("phase") != "settled" or outcome in (None, "completed"):
        return None
    why = turn.get("error")
    return f"{outcome}: {why}" if why else f"{outcome} (no reason given)"


# -- fork refusals in words ----------------------------------------------------------------

_BOUNDARY_SENTENCES: dict[str, str] = {
    "source_not_root": "the session is not a root session (only a root Session can be forked)",
    "source_provider_session_missing": (
        "the session has no provider session yet (no turn has run on the provider)"
    ),
    "source_turn_active": "{active} is still running",
    "source_interaction_pending": (
        "{active} is waiting for an answer (`agenthost answer` or interrupt it first)"
    ),
    "source_goal_control_active": "a goal control is running on the session",
    "source_runtime_operation_active": (
        "a runtime operation (such as a compaction) is running on the session"
    ),
    "source_submit_claim_active": "a new turn is being submitted to the session",
    "source_fork_active": "another fork of this session is still in progress",
    "turn_not_found": "the session has no such turn",
    "turn_not_settled": "{turn} has not finished yet",
    "turn_sequence_unverified": (
        "the history up to {turn} was not recorded in order by agenthost, so it cannot be "
        "copied safely"
    ),
    "provider_turn_missing": (
        "a turn up to {turn} has no provider turn id, so the provider's history cannot be cut there"
    ),
    "descendant_lane_in_boundary": (
        "the history up to {turn} contains a sub-agent lane, which cannot be forked"
    ),
    "session_local_attachment_in_boundary": (
        "the history up to {turn} contains a session-local attachment, which cannot be copied"
    ),
    "provider_turn_not_bound": (
        "{turn} has no verified provider checkpoint (recovery required), so the provider's "
        "history cannot be cut there"
    ),
    "target_equals_source": "the new session id is the source session's own id",
    "target_session_exists": "the new session id is already used by a session",
    "target_session_reserved": "the new session id is reserved by another fork",
    "history_reference_unsafe": (
        "the history up to {turn} holds a reference that cannot be rewritten safely"
    ),
}
BOUNDARY_REASONS = tuple(_BOUNDARY_SENTENCES)

_FORK_REASON_SENTENCES: dict[str, str] = {
    "agent_session_fork_unsupported": "this session's provider cannot fork through a turn",
    "agent_session_fork_in_progress": "another fork of this session is still in progress",
    "agent_session_busy": "the session is busy",
    "agent_session_fork_request_conflict": "that request id was already used for another fork",
    "workspace_agent_session_not_found": "the session does not exist",
}


def _turn_label(turn_id: str | None, turns: Sequence[Mapping[str, Any]]) -> str:
    for turn in turns:
        if turn.get("turnId") == turn_id:
            return f"Turn {turn['sequence']}"
    return f"turn {turn_id[:8]}" if turn_id else "that turn"


def fork_refusal(
    reason: str,
    params: Mapping[str, Any] | None,
    *,
    turn_id: str | None,
    turns: Sequence[Mapping[str, Any]] = (),
    session: Mapping[str, Any] | None = None,
    message: str | None = None,
    latest: bool = False,
) -> str:
    """One sentence saying why a fork through `turn_id` was refused, ending with the machine
    reason in parentheses, e.g. `cannot fork through Turn 2: Turn 3 is still running
    (source_turn_active)`. With `latest` (a full-Session fork, `point: latestSettled`) it reads
    `cannot fork the whole session: …`."""
    params = params or {}
    boundary = params.get("forkBoundaryReason")
    active_id = (session or {}).get("activeTurnId")
    active = _turn_label(active_id, turns) if active_id else "a turn"
    if active == "a turn" and boundary == "source_turn_active":
        active = "a turn of the session"
    turn = "its latest turn" if latest else _turn_label(turn_id, turns)
    fields = {"turn": turn, "active": active}
    head = "cannot fork the whole session" if latest else f"cannot fork through {turn}"
    if latest and (boundary == "turn_not_found" or reason == "turn_not_found"):
        return f"{head}: it has no settled turn yet ({boundary or reason})"
    if latest and reason == "agent_session_fork_unsupported":
        return (
            f"{head}: it does not support a full-session fork (its provider does not declare "
            f"forkFullSession for it, or no turn has been verified yet) ({reason})"
        )
    if isinstance(boundary, str):
        template = _BOUNDARY_SENTENCES.get(boundary)
        why = template.format(**fields) if template else (message or boundary)
        return f"{head}: {why} ({boundary})"
    if params.get("field") == "targetAgentSessionId":
        return f"{head}: the target session id is already taken ({reason})"
    if params.get("forkReferenceError"):
        return (
            f"{head}: the history cannot be rewritten safely "
            f"({reason}/{params['forkReferenceError']})"
        )
    why = _FORK_REASON_SENTENCES.get(reason) or message or reason
    return f"{head}: {why} ({reason})"


def fork_blocked(
    session: Mapping[str, Any] | None, turns: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no Turn of this session can be forked right now (the source is not quiet), as the
    sentence a refusal would carry, or None when it is quiet."""
    if not session or not session.get("activeTurnId"):
        return None
    active = next((t for t in turns if t.get("turnId") == session["activeTurnId"]), None)
    pending = any(i.get("status") == "pending" for i in ((active or {}).get("interactions") or []))
    label = _turn_label(str(session["activeTurnId"]), turns)
    if pending:
        return f"{label} is waiting for an answer (source_interaction_pending)"
    return f"{label} is still running (source_turn_active)"


_ERROR_WORDS: dict[str, str] = {
    "agent_session_busy": "a turn is already running in this session (wait, or interrupt it)",
    "agent_session_fork_in_progress": (
        "a fork of this session is in progress (try again when it finishes)"
    ),
    "workspace_agent_session_not_found": "the session no longer exists",
    "turn_not_found": "that turn no longer exists",
    "interaction_not_pending": "that question was already answered, or its turn has ended",
    "provider_unavailable": "the provider is not available (its worker could not start)",
    "provider_lost": "the provider's worker stopped while handling it",
    "shutting_down": "the daemon is shutting down",
    "overloaded": "the daemon is overloaded (try again)",
    "store_busy": "the daemon's store is busy (try again)",
    "invalid_argument": "a value was not accepted",
    "agent_session_fork_operation_not_found": "that fork operation does not exist",
    "agent_session_fork_resolve_in_progress": (
        "another resolve of this fork is running (try again when it finishes)"
    ),
    "agent_session_fork_resolve_conflict": "this fork was already resolved (inspect it again)",
    "fork_resolve_failed": (
        "the provider's worker failed while resolving; the fork is still unknown (try again)"
    ),
}


def error_words(action: str, exc: BaseException) -> str:
    """A sentence for a failed request, for a person: `cannot send: a turn is already running
    in this session (wait, or interrupt it)`, not `409 conflict/agent_session_busy`."""
    if isinstance(exc, ApiError):
        if isinstance((exc.params or {}).get("forkBoundaryReason"), str):
            return fork_refusal(exc.reason or exc.code, exc.params, turn_id=None)
        words = _ERROR_WORDS.get(exc.reason or "") or exc.message or exc.reason or exc.code
        params = exc.params or {}
        if exc.reason == "agent_session_fork_resolve_conflict" and params.get("verdict"):
            words = (
                f"the evidence is {params['verdict']}, not adoptable "
                "(only one verified provider child can be adopted; abandon it instead)"
            )
        elif exc.reason == "agent_session_fork_resolve_conflict" and params.get("status"):
            words = f"this fork is already {params['status']}, not unknown"
        if exc.reason == "invalid_argument" and exc.message:
            words = exc.message
        return f"cannot {action}: {words}"
    if isinstance(exc, TimeoutError):
        return f"cannot {action}: the daemon did not answer in time"
    return f"cannot {action}: {exc}"
