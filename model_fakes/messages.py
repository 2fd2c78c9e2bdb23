"""A local fake Anthropic Messages API server for the real Claude Code CLI, the only part we fake.

It answers `POST /v1/messages` (SSE or JSON), `POST /v1/messages/count_tokens` and
`GET /v1/models` on 127.0.0.1 with deterministic `echo: <last user text>` replies and records
every request body. A reply function may return a `ToolUse` instead of text: the model then
calls that tool (`stop_reason: "tool_use"`), and the CLI's next request carries its result.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from model_fakes.bodies import decode_body
from model_fakes.http import FakeModelServer, ModelHandler, chunks, sse_frames


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A model turn that calls one tool: a `tool_use` content block, `stop_reason: "tool_use"`."""

    name: str
    input: dict[str, Any]
    id: str = field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:24]}")
    preface: str = ""
    """When set, a text block streamed before the call (a model that says what it will do)."""


Reply = str | ToolUse
MessagesReplyFn = Callable[[dict[str, Any]], Reply]


def _block_texts(content: Any) -> list[str]:
    """The text blocks of one Messages `content` (a string or a list of blocks), in order.

    Claude Code injects `<system-reminder>` text blocks into user messages; they are kept
    here (the model sees them) and filtered by `last_user_text`.
    """
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
    ]


def _is_reminder(text: str) -> bool:
    return text.lstrip().startswith("<system-reminder>")


def model_input_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The model-visible conversation of one request as `(role, text)`, in order.

    One entry per `user` / `assistant` message, its text blocks joined with newlines,
    CLI `<system-reminder>` blocks removed; messages with no text left (tool results,
    pure reminders) are skipped. The `system` prompt and the CLI's `role: "system"`
    environment message are not part of the conversation and are left out.
    """
    out: list[tuple[str, str]] = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            continue
        texts = [t for t in _block_texts(msg.get("content")) if not _is_reminder(t)]
        if texts:
            out.append((str(msg.get("role", "")), "\n".join(texts)))
    return out


def last_user_text(body: dict[str, Any]) -> str:
    """The last non-reminder text of the last user message in one request ("" if none)."""
    for msg in reversed(body.get("messages") or []):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        texts = [t for t in _block_texts(msg.get("content")) if not _is_reminder(t)]
        if texts:
            return texts[-1]
    return ""


def tool_result(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `tool_result` block of the request's last message, if that message answers a tool
    call (the CLI's follow-up request after running — or refusing — the tool)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    if not messages or messages[-1].get("role") != "user":
        return None
    content = messages[-1].get("content")
    blocks = content if isinstance(content, list) else []
    return next((b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"), None)


def tool_result_text(block: dict[str, Any]) -> str:
    """The text of one `tool_result` block (its content is a string or text blocks)."""
    return "\n".join(_block_texts(block.get("content")))


def default_reply(body: dict[str, Any]) -> str:
    return f"echo: {last_user_text(body)}"


class MessagesServer(FakeModelServer[Reply]):
    """Context manager running the fake Messages API on an ephemeral 127.0.0.1 port.

    `reply` maps a request body to the assistant text (default `echo: <last user text>`) or to
    a `ToolUse`. `.requests` holds every parsed `/v1/messages` body (not `count_tokens`), in order.
    `.base_url` has no `/v1`: it is what `ANTHROPIC_BASE_URL` expects.
    """

    thread_name = "messages-server"

    def __init__(
        self,
        reply: MessagesReplyFn | None = None,
        *,
        api_key: str | None = None,
        gate: threading.Event | None = None,
        hold_after: int = 3,
        fail_status: int | None = None,
    ) -> None:
        super().__init__(reply or default_reply, api_key=api_key)
        self.gate = gate
        """When given, each streamed reply stops after its first `hold_after` SSE events (with
        the default, its first text delta) until it is set: a model that stalls mid-reply."""
        self.hold_after = hold_after
        self.fail_status = fail_status
        """When set, every model request is answered with this HTTP status and an `api_error`
        (an overloaded server's 503, say): the client retries it on its own. May be changed
        while serving."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(ModelHandler):
            def do_HEAD(self) -> None:  # noqa: N802
                server.record(f"HEAD {self.path}", None)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                if self.route().endswith("/v1/models"):
                    self.answer(
                        server,
                        200,
                        {
                            "data": [
                                {
                                    "type": "model",
                                    "id": "claude-sonnet-4-5",
                                    "display_name": "Mock",
                                    "created_at": "2025-01-01T00:00:00Z",
                                }
                            ],
                            "has_more": False,
                            "first_id": "claude-sonnet-4-5",
                            "last_id": "claude-sonnet-4-5",
                        },
                    )
                    return
                self.answer(server, 404, _error("not_found_error", f"no route {self.path}"))

            def do_POST(self) -> None:  # noqa: N802
                raw = self.read_raw_body()
                path = self.route()
                try:
                    body = json.loads(decode_body(raw, self.headers.get("Content-Encoding")))
                except Exception as exc:  # a bad body is a 400 for the client, not a crash
                    self.answer(server, 400, _error("invalid_request_error", f"bad body: {exc}"))
                    return
                if not server.authorized(self):
                    refusal = _error("authentication_error", "invalid x-api-key")
                    self.answer(server, 401, refusal, seen=" 401")
                    return
                if path.endswith("/v1/messages/count_tokens"):
                    server.record(f"POST {self.path}", None)
                    n = sum(len(t) for _, t in model_input_texts(body)) // 4 + 1
                    self.send_json(200, {"input_tokens": n})
                    return
                if not path.endswith("/v1/messages"):
                    self.answer(server, 404, _error("not_found_error", f"no route {self.path}"))
                    return
                status = server.fail_status
                if status is not None:
                    overloaded = _error("api_error", "the model is overloaded")
                    self.answer(server, status, overloaded, seen=f" {status}")
                    return
                server.record(f"POST {self.path}", body)
                reply = server.reply_to(body)
                msg = _message_object(body, reply)
                if body.get("stream") and server.gate is not None:
                    events = _stream_events(msg, reply)
                    self.send_stream_live(
                        sse_frames(events), hold_after=server.hold_after, gate=server.gate
                    )
                elif body.get("stream"):
                    self.send_sse(_stream_events(msg, reply))
                else:
                    self.send_json(200, msg)

        return Handler


def _stream_events(msg: dict[str, Any], reply: Reply) -> list[tuple[str, dict[str, Any]]]:
    start = dict(msg, content=[], stop_reason=None)
    start["usage"] = dict(msg["usage"], output_tokens=1)
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    if isinstance(reply, ToolUse):
        if reply.preface:
            blocks.append(_text_block(reply.preface))
        tool = {"type": "tool_use", "id": reply.id, "name": reply.name, "input": {}}
        partial = json.dumps(reply.input)
        blocks.append((tool, [{"type": "input_json_delta", "partial_json": partial}]))
    else:
        blocks.append(_text_block(reply))
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, (block, deltas) in enumerate(blocks):
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            ),
            *(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": d},
                )
                for d in deltas
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    return [
        *events,
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": msg["usage"]["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _text_block(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A text content block and its deltas, a few characters each (a long text in at most 64
    deltas: a megabyte in 4-character deltas would take the CLI minutes)."""
    return {"type": "text", "text": ""}, [
        {"type": "text_delta", "text": piece} for piece in chunks(text, max(4, len(text) // 64))
    ]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _message_object(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    in_tokens = sum(len(t) for _, t in model_input_texts(body)) // 4 + 1
    if isinstance(reply, ToolUse):
        content = [{"type": "tool_use", "id": reply.id, "name": reply.name, "input": reply.input}]
        if reply.preface:
            content.insert(0, {"type": "text", "text": reply.preface})
        stop_reason, out_len = "tool_use", len(json.dumps(reply.input))
    else:
        content = [{"type": "text", "text": reply}]
        stop_reason, out_len = "end_turn", len(reply)
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude-sonnet-4-5"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": in_tokens,
            "output_tokens": out_len // 4 + 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
