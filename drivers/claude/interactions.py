"""Claude Code's tool-permission requests as Interactions: the SDK's `can_use_tool` callback
raises `interaction.requested` (an `approval`, or a `question` for the CLI's ask-the-user tool)
and waits on the driver's loop; `interaction.respond` resolves it with the SDK's permission
result. `Interactions` is the part of `ClaudeDriver` that owns that exchange.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from domain.errors import Conflict, InvalidArgument
from domain.turn_events import InteractionRequested
from drivers.claude.checkpoints import scan_root
from drivers.claude.state import PendingPermission, SessionState, TurnState
from drivers.errors import DriverError

RESPOND_TIMEOUT_S = 10.0

QUESTION_TOOL = "AskUserQuestion"
"""The CLI's ask-the-user tool: its permission request is a `question`, answered by allowing it
with `answers: {question text: answer}` added to its input (observed with CLI 2.1.332)."""
DECLINED_MESSAGE = "The user declined this tool use."


class Interactions:
    """`interaction.respond` and the `can_use_tool` callback, on the driver's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def respond(self, session: SessionState, params: Mapping[str, Any]) -> dict[str, Any]:
        request_id = str(params.get("requestId") or "")
        response = params.get("response")
        if not isinstance(response, Mapping):
            raise InvalidArgument("response", "response must be a map")
        with session.lock:
            turn = session.active
            pending = turn.pending.get(request_id) if turn is not None else None
        if pending is None:
            raise Conflict(
                f"interaction {request_id} is not pending", reason="interaction_not_pending"
            )
        result = permission_result(pending, response)
        # Resolved on the loop (which owns the future); a request the CLI cancelled or a turn
        # that ended meanwhile is not pending any more, and the caller must hear so.
        resolved = asyncio.run_coroutine_threadsafe(
            resolve_answer(pending.answer, result), self._loop
        )
        try:
            delivered = resolved.result(timeout=RESPOND_TIMEOUT_S)
        except FutureTimeout:
            raise DriverError("the Claude driver loop did not take the answer in time") from None
        if not delivered:
            raise Conflict(
                f"interaction {request_id} is not pending", reason="interaction_not_pending"
            )
        return {}

    async def can_use_tool(
        self,
        session: SessionState,
        turn: TurnState,
        tool: str,
        tool_input: dict[str, Any],
        context: Any,
    ) -> Any:
        """The SDK's `can_use_tool` callback: raises an Interaction and waits for its answer.

        Runs on the loop thread while the CLI blocks on the permission control request.
        """
        # The host binds an Interaction to a Turn it knows has started at the provider (an
        # interrupt of an unstarted Turn never reaches us): observe the root first.
        scan_root(session, turn)
        request_id = str(getattr(context, "tool_use_id", None) or f"claude-{uuid.uuid4()}")
        kind = "question" if tool == QUESTION_TOOL else "approval"
        pending = PendingPermission(
            request_id, kind, tool, dict(tool_input), asyncio.get_running_loop().create_future()
        )
        with session.lock:
            turn.pending[request_id] = pending
        try:
            turn.emit(
                session.agent_session_id,
                InteractionRequested(
                    turn.turn_id, request_id, kind, interaction_input(tool, tool_input, context)
                ),
            )
            return await pending.answer
        finally:
            with session.lock:
                turn.pending.pop(request_id, None)


async def resolve_answer(answer: asyncio.Future[Any], result: Any) -> bool:
    """Hands an answer to a waiting permission request; False if it stopped waiting."""
    if answer.done():
        return False
    answer.set_result(result)
    return True


def interaction_input(tool: str, tool_input: Mapping[str, Any], context: Any) -> dict[str, Any]:
    """The Interaction `input` of one permission request: the tool, its input and a human text
    (the Bash command, the question, the plan, else the CLI's own prompt sentence)."""
    out: dict[str, Any] = {"tool": tool, "input": dict(tool_input)}
    for key, attr in (
        ("title", "title"),
        ("description", "description"),
        ("displayName", "display_name"),
        ("blockedPath", "blocked_path"),
        ("decisionReason", "decision_reason"),
    ):
        value = getattr(context, attr, None)
        if isinstance(value, str) and value:
            out[key] = value
    questions = questions_of(tool_input)
    if tool == QUESTION_TOOL:
        out["questions"] = questions
        text = questions[0] if questions else ""
    else:
        text = next(
            (
                v
                for v in (
                    tool_input.get("command"),
                    tool_input.get("plan"),
                    out.get("title"),
                    out.get("description"),
                )
                if isinstance(v, str) and v
            ),
            tool,
        )
    out["text"] = text
    return out


def questions_of(tool_input: Mapping[str, Any]) -> list[str]:
    """The question texts of an `AskUserQuestion` input, in order."""
    raw = tool_input.get("questions")
    items = raw if isinstance(raw, list) else []
    return [str(q["question"]) for q in items if isinstance(q, Mapping) and "question" in q]


def permission_result(pending: PendingPermission, response: Mapping[str, Any]) -> Any:
    """An Interaction response → the SDK's permission result (same rules as the app-server
    drivers: an approval takes `{decision}`, a question `{text}`)."""
    from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

    if pending.kind == "approval":
        decision = response.get("decision")
        if decision not in ("approve", "decline"):
            raise InvalidArgument("response.decision", "decision must be approve or decline")
        if decision == "approve":
            return PermissionResultAllow()
        return PermissionResultDeny(message=DECLINED_MESSAGE)
    text = response.get("text")
    if not isinstance(text, str):
        raise InvalidArgument("response.text", "a question needs a text answer")
    # One answer text answers every question of the request (the Interaction shows the first).
    answers = {question: text for question in questions_of(pending.tool_input)}
    return PermissionResultAllow(updated_input={**pending.tool_input, "answers": answers})
