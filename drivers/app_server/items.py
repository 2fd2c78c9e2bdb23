"""The app-server wire read as internals.md turn events: which server→client requests are
Interactions, which notifications stream text, how a turn status reads as an outcome, and how a
completed ThreadItem maps to `item` payloads. Pure functions of the JSON-RPC payloads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from domain.enums import TurnOutcome

# Server→client requests raised as Interactions (`approval`, `question`); any other is refused.
APPROVAL_METHODS = frozenset(
    {
        "item/commandExecution/requestApproval",
        "item/fileChange/requestApproval",
        "item/permissions/requestApproval",
        "execCommandApproval",
        "applyPatchApproval",
    }
)
QUESTION_METHODS = frozenset({"item/tool/requestUserInput"})
# Streamed text of an item still being generated → the `message.delta` kind.
DELTA_METHODS = {
    "item/agentMessage/delta": "assistant",
    "item/reasoning/summaryTextDelta": "reasoning",
    "item/reasoning/textDelta": "reasoning",
}
# A settled provider turn status → its outcome (anything else reads as failed).
OUTCOMES = {
    "completed": TurnOutcome.COMPLETED,
    "interrupted": TurnOutcome.INTERRUPTED,
    "failed": TurnOutcome.FAILED,
}


def _text_of(item: Mapping[str, Any], key: str) -> str:
    parts = item.get(key)
    if isinstance(parts, str):
        return parts
    out: list[str] = []
    for part in parts or []:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return "\n".join(out)


# App-server ThreadItem types that open a provider-native descendant lane (a sub-agent thread
# or a collaboration with another agent): recorded with `descendantLane: true`, so a fork
# boundary that holds one fails closed (seed 000 §4 `descendant_lane_in_boundary`).
DESCENDANT_LANE_ITEM_TYPES = frozenset({"collabAgentToolCall", "collabToolCall", "subAgent"})


def map_item(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A completed app-server ThreadItem → the `item` payloads of internals.md turn events."""
    kind = item.get("type")
    item_id = item.get("id")
    base = {"providerItemId": item_id, "providerItemType": kind}
    if kind in DESCENDANT_LANE_ITEM_TYPES:
        lane = {**base, "descendantLane": True, "item": dict(item)}
        return [{"kind": str(kind), "text": None, "payload": lane}]
    if kind == "userMessage":
        text = "\n".join(
            str(c.get("text", ""))
            for c in item.get("content") or []
            if isinstance(c, Mapping) and c.get("type") == "text"
        )
        return [{"kind": "user", "text": text, "payload": base}]
    if kind == "agentMessage":
        return [{"kind": "assistant", "text": str(item.get("text") or ""), "payload": base}]
    if kind == "reasoning":
        text = "\n".join(t for t in (_text_of(item, "summary"), _text_of(item, "content")) if t)
        return [{"kind": "reasoning", "text": text, "payload": base}]
    if kind == "commandExecution":
        call = {**base, "command": item.get("command"), "cwd": item.get("cwd")}
        result = {
            **base,
            "status": item.get("status"),
            "exitCode": item.get("exitCode"),
        }
        return [
            {"kind": "tool_call", "text": str(item.get("command") or ""), "payload": call},
            {
                "kind": "tool_result",
                "text": str(item.get("aggregatedOutput") or ""),
                "payload": result,
            },
        ]
    if kind in ("dynamicToolCall", "mcpToolCall"):
        call = {**base, "tool": item.get("tool"), "arguments": item.get("arguments")}
        output = _text_of(item, "contentItems") if kind == "dynamicToolCall" else ""
        if kind == "mcpToolCall" and item.get("result") is not None:
            output = json.dumps(item.get("result"))
        result = {**base, "status": item.get("status"), "success": item.get("success")}
        return [
            {"kind": "tool_call", "text": str(item.get("tool") or ""), "payload": call},
            {"kind": "tool_result", "text": output, "payload": result},
        ]
    return [{"kind": str(kind or "unknown"), "text": None, "payload": {**base, "item": dict(item)}}]


def turn_ids(turns: Any) -> list[str]:
    return [str(t.get("id")) for t in turns or [] if isinstance(t, Mapping)]


def user_text(turn: Mapping[str, Any]) -> str | None:
    """The text of a provider turn's user message, or None when the turn shows none."""
    for item in turn.get("items") or []:
        if isinstance(item, Mapping) and item.get("type") == "userMessage":
            parts = [
                str(part.get("text") or "")
                for part in item.get("content") or []
                if isinstance(part, Mapping) and part.get("type") == "text"
            ]
            return "\n".join(parts)
    return None


def thread_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    thread = result.get("thread")
    return thread if isinstance(thread, Mapping) else {}
