"""The Chat Completions model (`--wire-api chat`): what Ollama, vLLM, llama.cpp server, LM Studio,
OpenRouter and most OpenAI-compatible proxies speak.

The thread's history stays in Responses-item form (the rollout is the record, and a fork copies
it); each request converts it to chat `messages`. `stream: true` chunks become message deltas;
tool calls are recorded as the turn's tool items (Tutti Agent runs no tools, so each gets a
refusal as its output) and the model is asked again with them, up to `MAX_ROUNDS` times.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tutti_agent.errors import ModelError
from tutti_agent.ids import uuid7
from tutti_agent.model import (
    Endpoint,
    Lines,
    ModelClient,
    TurnCancelled,
    TurnIO,
    _delta,
    _sse_events,
    _usage,
)

MAX_ROUNDS = 8
TOOL_UNAVAILABLE = "tool unavailable in tutti_agent"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text", ""))
        for p in content or []
        if isinstance(p, Mapping) and p.get("type") in ("input_text", "output_text", "text")
    )


def chat_messages(items: list[Mapping[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """Responses input items → Chat Completions `messages`, order kept: messages by role,
    `function_call` → an assistant message's `tool_calls` (consecutive calls share one), its
    `function_call_output` → a `tool` message; reasoning items are not sent back."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = str(item.get("role") or "user")
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content")),
                }
            )
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or ""),
                "type": "function",
                "function": {
                    "name": str(item.get("name") or ""),
                    "arguments": str(item.get("arguments") or ""),
                },
            }
            last = out[-1] if out else None
            if last is not None and last.get("role") == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or ""),
                    "content": str(item.get("output") or ""),
                }
            )
    return out


class ChatModel:
    """POST {base}/chat/completions with `stream: true` (and usage in the last chunk)."""

    provider = "chat"

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.name = endpoint.model
        self.client = ModelClient(endpoint, "/chat/completions")

    def warm(self) -> None:
        self.client.warm()

    def run(self, text: str, io: TurnIO) -> None:
        for _ in range(MAX_ROUNDS):
            body: dict[str, Any] = {
                "model": self.client.model_for(io),
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": chat_messages(io.model_input(), self.endpoint.instructions),
            }
            round_ = _Round(io)
            self.client.post(body, io, round_.consume)
            if not round_.tool_calls:
                return
        raise ModelError(f"model kept calling tools after {MAX_ROUNDS} rounds")


class _Round:
    """One streamed chat completion: text and reasoning deltas as they arrive, then the settled
    items (reasoning, message, tool calls) in that order."""

    def __init__(self, io: TurnIO) -> None:
        self.io = io
        self.message_id = f"msg_{uuid7()}"
        self.reasoning_id = f"rs_{uuid7()}"
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, str]] = {}

    def consume(self, lines: Lines) -> None:
        io = self.io
        done = False
        usage: Mapping[str, Any] | None = None
        for event in _sse_events(lines, done_marker=True):
            if io.cancelled.is_set():
                raise TurnCancelled()
            if event.get("type") == "done":
                done = True
                break
            if "error" in event and not event.get("choices"):
                raise ModelError(f"model stream failed: {json.dumps(event['error'])[:500]}")
            if isinstance(event.get("usage"), Mapping):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") if isinstance(choice, Mapping) else None
                if isinstance(delta, Mapping):
                    self._delta(delta)
                if isinstance(choice, Mapping) and choice.get("finish_reason"):
                    done = True
        if not done:
            if io.cancelled.is_set():
                raise TurnCancelled()
            raise ModelError("model stream ended before its last chunk")
        if self.reasoning:
            io.reasoning("".join(self.reasoning), item_id=self.reasoning_id)
        if self.text or not self.tool_calls:
            io.agent_message("".join(self.text), item_id=self.message_id)
        for index in sorted(self.tool_calls):
            call = self.tool_calls[index]
            io.tool_call(call["name"], call["arguments"], TOOL_UNAVAILABLE)
        if usage is not None:
            _usage(io, usage.get("prompt_tokens"), usage.get("completion_tokens"))

    def _delta(self, delta: Mapping[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            _delta(self.io, self.message_id, "assistant", content)
        # Local servers name the thinking stream either way (Ollama/vLLM vs DeepSeek style).
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str) and thought:
            self.reasoning.append(thought)
            _delta(self.io, self.reasoning_id, "reasoning", thought)
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            index = int(call.get("index") or 0)
            slot = self.tool_calls.setdefault(index, {"name": "", "arguments": ""})
            fn = call.get("function")
            if isinstance(fn, Mapping):
                slot["name"] += str(fn.get("name") or "")
                slot["arguments"] += str(fn.get("arguments") or "")
