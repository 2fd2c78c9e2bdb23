"""A local fake OpenAI Chat Completions server (what Ollama, vLLM, llama.cpp and most proxies
speak): `POST /v1/chat/completions` streamed as `chat.completion.chunk` SSE ending in
`data: [DONE]`, with tool calls and usage; `GET /v1/models`. Replies are deterministic
(`echo: <last user text>`) unless a reply function says otherwise, and may be a `ToolCall`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from model_fakes.bodies import decode_body
from model_fakes.http import INVALID_API_KEY, FakeModelServer, ModelHandler, chunks, last_text_of


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A model answer that calls one function (`finish_reason: "tool_calls"`)."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


ChatReply = str | ToolCall


def conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    """`(role, text)` of every message with text, in order (tool messages included as
    `("tool", output)`, assistant tool calls as `("assistant", "call:<name>")`)."""
    out: list[tuple[str, str]] = []
    for msg in body.get("messages") or []:
        role = str(msg.get("role"))
        if msg.get("tool_calls"):
            for call in msg["tool_calls"]:
                out.append((role, f"call:{call['function']['name']}"))
            continue
        content = msg.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        out.append((role, str(content or "")))
    return out


def last_user_text(body: dict[str, Any]) -> str:
    return last_text_of(conversation(body))


def default_reply(body: dict[str, Any]) -> str:
    return f"echo: {last_user_text(body)}"


class ChatServer(FakeModelServer[ChatReply]):
    """Context manager running the fake Chat Completions API on 127.0.0.1."""

    thread_name = "chat-server"

    def __init__(
        self,
        reply: Callable[[dict[str, Any]], ChatReply] | None = None,
        *,
        api_key: str | None = None,
        gate: threading.Event | None = None,
        hold_after: int = 2,
    ) -> None:
        super().__init__(reply or default_reply, api_key=api_key)
        self.gate = gate
        """When given, each streamed reply stops after its first `hold_after` chunks (with the
        default, the role chunk and the first piece of text) until it is set: a model that
        stalls mid-reply."""
        self.hold_after = hold_after

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(ModelHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.route().endswith("/models"):
                    listing = {"object": "list", "data": [{"id": "mock-model"}]}
                    self.answer(server, 200, listing)
                    return
                self.answer(server, 404, self.no_route())

            def do_POST(self) -> None:  # noqa: N802
                raw = self.read_raw_body()
                if not self.route().endswith("/chat/completions"):
                    self.answer(server, 404, self.no_route())
                    return
                if not server.authorized(self):
                    self.answer(server, 401, INVALID_API_KEY, seen=" 401")
                    return
                body = json.loads(decode_body(raw, self.headers.get("Content-Encoding")))
                server.record(f"POST {self.path}", body)
                reply = server.reply_to(body)
                self.send_chunks(_chunks(body, reply))

            def send_chunks(self, payloads: list[dict[str, Any]]) -> None:
                """The payloads as `data:` frames ending in `data: [DONE]`; with a gate, one at
                a time, waiting for it before frame `hold_after`."""
                frames = [f"data: {json.dumps(p)}\n\n" for p in payloads] + ["data: [DONE]\n\n"]
                if server.gate is not None:
                    self.send_stream_live(frames, hold_after=server.hold_after, gate=server.gate)
                    return
                self.send_stream(frames)

        return Handler


def _chunks(body: dict[str, Any], reply: ChatReply) -> list[dict[str, Any]]:
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    base = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "mock-model"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

    out = [chunk({"role": "assistant", "content": ""})]
    if isinstance(reply, ToolCall):
        args = json.dumps(reply.arguments)
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": reply.id,
                            "type": "function",
                            "function": {"name": reply.name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        out += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in chunks(args, 8)
        ]
        out.append(chunk({}, "tool_calls"))
        completion = len(args) // 4 + 1
    else:
        out += [chunk({"content": piece}) for piece in chunks(reply)]
        out.append(chunk({}, "stop"))
        completion = len(reply) // 4 + 1
    prompt = sum(len(t) for _, t in conversation(body)) // 4 + 1
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(
            dict(
                base,
                choices=[],
                usage={
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            )
        )
    return out
