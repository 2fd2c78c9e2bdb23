"""A local fake OpenAI Responses API server: the only part of the Codex/Tutti Agent stack we fake.

It answers `POST /v1/responses` (SSE, possibly zstd-encoded bodies) and `GET /v1/models` on
127.0.0.1 with deterministic `echo: <last user text>` replies and records every request body.
A reply function may return a `FunctionCall`: the response then holds a `function_call` output
item (the model calling a tool) followed by a short assistant message.
"""

from __future__ import annotations

import json
import ssl
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from model_fakes.bodies import decode_body
from model_fakes.http import (
    INVALID_API_KEY,
    FakeModelServer,
    ModelHandler,
    chunks,
    last_text_of,
    sse_frames,
)


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A model reply that calls one tool: a `function_call` item with JSON-string `arguments`."""

    name: str
    arguments: str
    text: str = "called the tool"
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass(frozen=True, slots=True)
class Steps:
    """A model reply of many output items: one `reasoning` item per step (each becomes a
    Message of the Turn), then the assistant message `text`."""

    reasoning: tuple[str, ...]
    text: str = "done"


Reply = str | FunctionCall | Steps
ReplyFn = Callable[[dict[str, Any]], Reply]


def _content_text(content: Any) -> str:
    """Joins the text parts of a Responses message `content` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [
        str(p.get("text", ""))
        for p in content
        if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
    ]
    return "".join(parts)


def model_input_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The model-visible conversation of one request as `(role, text)`, in order.

    Only `message` items are included (user, assistant, developer, system); tool calls and
    reasoning items are left out. Codex also sends its own context messages (environment,
    permissions) as user/developer messages: callers filter on the texts they sent.
    """
    raw = body.get("input")
    if isinstance(raw, str):
        return [("user", raw)]
    out: list[tuple[str, str]] = []
    for item in raw or []:
        if not isinstance(item, dict):
            continue
        if item.get("type", "message") != "message":
            continue
        out.append((str(item.get("role", "")), _content_text(item.get("content"))))
    return out


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message in one request (empty if there is none)."""
    return last_text_of(model_input_texts(body))


def function_call_output(body: dict[str, Any]) -> str | None:
    """The output of the request's last input item, if that item answers a function call
    (Codex's follow-up request after running — or being refused — the call), as text."""
    raw = body.get("input")
    items = [i for i in raw if isinstance(i, dict)] if isinstance(raw, list) else []
    if not items or items[-1].get("type") != "function_call_output":
        return None
    output = items[-1].get("output")
    return output if isinstance(output, str) else json.dumps(output)


def default_reply(body: dict[str, Any]) -> str:
    return f"echo: {last_user_text(body)}"


class ResponsesServer(FakeModelServer[Reply]):
    """Context manager running the fake Responses API on an ephemeral 127.0.0.1 port.

    `reply` maps a request body to the assistant text (default `echo: <last user text>`).
    `.requests` holds every parsed `/responses` body, in arrival order.
    """

    thread_name = "responses-server"

    def __init__(
        self,
        reply: ReplyFn | None = None,
        *,
        api_key: str | None = None,
        gate: threading.Event | None = None,
        drip_s: float = 0.0,
        hold_after: int = 3,
        tls: ssl.SSLContext | None = None,
        delta_chars: int = 4,
    ) -> None:
        super().__init__(reply or default_reply, api_key=api_key, tls=tls)
        self.gate = gate
        """When given, each streamed reply stops after its first text delta until it is set."""
        self.drip_s = drip_s
        """When > 0, streamed replies send their events this many seconds apart."""
        self.hold_after = hold_after
        """With `gate`: how many SSE events of a streamed reply are sent before it waits."""
        self.delta_chars = delta_chars
        """The characters of a streamed reply's text deltas (the last may be shorter): a large
        one makes a model that streams its whole reply as one delta."""

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(ModelHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.route().endswith("/models"):
                    model = {"id": "mock-model", "object": "model", "owned_by": "test"}
                    self.answer(server, 200, {"object": "list", "data": [model], "models": []})
                    return
                self.answer(server, 404, self.no_route())

            def do_POST(self) -> None:  # noqa: N802
                raw = self.read_raw_body()
                if not self.route().endswith("/responses"):
                    self.answer(server, 404, self.no_route())
                    return
                try:
                    body = json.loads(decode_body(raw, self.headers.get("Content-Encoding")))
                except Exception as exc:  # a bad body is a 400 for the client, not a crash
                    self.answer(server, 400, {"error": {"message": f"bad body: {exc}"}})
                    return
                if not server.authorized(self):
                    self.answer(server, 401, INVALID_API_KEY, seen=" 401")
                    return
                server.record(f"POST {self.path}", body)
                text = server.reply_to(body)
                if not body.get("stream"):
                    self.send_json(200, _response_object(body, text))
                    return
                resp = _response_object(body, text)
                created = dict(resp, status="in_progress", output=[])
                msg_index = len(resp["output"]) - 1
                item = resp["output"][msg_index]
                added = dict(item, status="in_progress", content=[])
                deltas = [
                    (
                        "response.output_text.delta",
                        {
                            "type": "response.output_text.delta",
                            "item_id": item["id"],
                            "output_index": msg_index,
                            "content_index": 0,
                            "delta": piece,
                        },
                    )
                    for piece in chunks(item["content"][0]["text"], server.delta_chars)
                ]
                send = self.send_sse
                if server.gate is not None or server.drip_s:
                    gate, drip, hold = server.gate, server.drip_s, server.hold_after

                    def send(events: Sequence[tuple[str, dict[str, Any]]]) -> None:
                        self.send_stream_live(
                            sse_frames(events), hold_after=hold, gate=gate, delay_s=drip
                        )

                send(
                    [
                        ("response.created", {"type": "response.created", "response": created}),
                        *(
                            (
                                "response.output_item.done",
                                {
                                    "type": "response.output_item.done",
                                    "output_index": i,
                                    "item": it,
                                },
                            )
                            for i, it in enumerate(resp["output"][:msg_index])
                        ),
                        (
                            "response.output_item.added",
                            {
                                "type": "response.output_item.added",
                                "output_index": msg_index,
                                "item": added,
                            },
                        ),
                        *deltas,
                        (
                            "response.output_item.done",
                            {
                                "type": "response.output_item.done",
                                "output_index": msg_index,
                                "item": item,
                            },
                        ),
                        ("response.completed", {"type": "response.completed", "response": resp}),
                    ]
                )

        return Handler


def _response_object(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    rid = f"resp_{uuid.uuid4().hex}"
    output: list[dict[str, Any]] = []
    if isinstance(reply, Steps):
        output.extend(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [{"type": "summary_text", "text": step}],
            }
            for step in reply.reasoning
        )
        text = reply.text
    elif isinstance(reply, FunctionCall):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": reply.call_id,
                "name": reply.name,
                "arguments": reply.arguments,
                "status": "completed",
            }
        )
        text = reply.text
    else:
        text = reply
    item = {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    in_tokens = sum(len(t) for _, t in model_input_texts(body)) // 4 + 1
    out_tokens = len(text) // 4 + 1
    return {
        "id": rid,
        "object": "response",
        "status": "completed",
        "model": body.get("model", "mock-model"),
        "output": [*output, item],
        "usage": {
            "input_tokens": in_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": in_tokens + out_tokens,
        },
    }
