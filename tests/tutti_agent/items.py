"""Builders of synthetic rollout items for the history and fork tests."""

from __future__ import annotations

from tutti_agent.rollout import LineType, RolloutItem


def user_msg(text: str) -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    )


def assistant_msg(text: str) -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        },
    )


def env_context(cwd: str = "/w") -> RolloutItem:
    return user_msg(f"<environment_context>\n  <cwd>{cwd}</cwd>\n</environment_context>")


def instructions() -> RolloutItem:
    return user_msg("<user_instructions>\nbe brief\n</user_instructions>")


def reasoning(text: str = "s") -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": text}]},
    )


def function_call(call_id: str = "c1", name: str = "tool") -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"},
    )


def function_output(call_id: str = "c1") -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {"type": "function_call_output", "call_id": call_id, "output": "ok"},
    )


def task_started(turn_id: str, started_at: int = 1) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG, {"type": "task_started", "turn_id": turn_id, "started_at": started_at}
    )


def task_complete(turn_id: str | None) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {"type": "task_complete", "turn_id": turn_id, "last_agent_message": None},
    )


def turn_aborted(turn_id: str | None) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {"type": "turn_aborted", "turn_id": turn_id, "reason": "interrupted"},
    )


def error_event(message: str) -> RolloutItem:
    return RolloutItem(LineType.EVENT_MSG, {"type": "error", "message": message})


def session_meta(thread_id: str = "t") -> RolloutItem:
    return RolloutItem(LineType.SESSION_META, {"id": thread_id})


def explicit_turn(turn_id: str, user: str, reply: str, *, closed: bool = True) -> list[RolloutItem]:
    out = [task_started(turn_id), user_msg(user), assistant_msg(reply)]
    if closed:
        out.append(task_complete(turn_id))
    return out
