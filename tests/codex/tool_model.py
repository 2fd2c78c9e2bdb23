"""A local fake Responses API that can ask Codex to run a command: a user text `/run <cmd>`
is answered with an `exec_command` function call that asks to run outside the sandbox
(`require_escalated`, so an `on-request` policy asks the user first); the follow-up request
(carrying the call's output) is answered `ran: <output>`. Anything else is echoed. Binds
127.0.0.1 only."""

from __future__ import annotations

import json
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

from model_fakes.bodies import decode_body
from model_fakes.http import FakeModelServer, ModelHandler
from model_fakes.responses import last_user_text

RUN = "/run "


def _reply_item(body: dict[str, Any]) -> dict[str, Any]:
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    last = items[-1] if items else {}
    if last.get("type") == "function_call_output":
        output = last.get("output")
        text = output if isinstance(output, str) else json.dumps(output)
        return _message(f"ran: {text.strip()[:200]}")
    text = last_user_text(body)
    if text.startswith(RUN):
        return {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex}",
            "call_id": f"call_{uuid.uuid4().hex}",
            "name": "exec_command",
            "arguments": json.dumps(
                {
                    "cmd": text[len(RUN) :],
                    "sandbox_permissions": "require_escalated",
                    "justification": "the test asks to run this",
                }
            ),
            "status": "completed",
        }
    return _message(f"echo: {text}")


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


class ToolModel(FakeModelServer[str]):
    """Context manager; `.requests` holds every parsed `/responses` body."""

    thread_name = "tool-model"

    def __init__(self, preface: str | None = None) -> None:
        super().__init__(last_user_text)  # replies are items here, built by `_reply_item`
        self.preface = preface
        """When set, a function call comes after this text, streamed delta by delta (a model
        that says what it is about to do)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(ModelHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_json(200, {"data": [], "models": []})

            def do_POST(self) -> None:  # noqa: N802
                raw = self.read_raw_body()
                body = json.loads(decode_body(raw, self.headers.get("Content-Encoding")))
                model.record(f"POST {self.path}", body)
                item = _reply_item(body)
                resp = {
                    "id": f"resp_{uuid.uuid4().hex}",
                    "object": "response",
                    "status": "completed",
                    "model": body.get("model", "mock-model"),
                    "output": [item],
                    "usage": {
                        "input_tokens": 1,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": 1,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": 2,
                    },
                }
                created = dict(resp, status="in_progress", output=[])
                said: list[tuple[str, dict[str, Any]]] = []
                if model.preface and item["type"] == "function_call":
                    said = _streamed_message(_message(model.preface))
                    resp["output"] = [said[-1][1]["item"], item]
                self.send_sse(
                    [
                        ("response.created", {"type": "response.created", "response": created}),
                        *said,
                        (
                            "response.output_item.done",
                            {
                                "type": "response.output_item.done",
                                "output_index": 1 if said else 0,
                                "item": item,
                            },
                        ),
                        ("response.completed", {"type": "response.completed", "response": resp}),
                    ]
                )

        return Handler


def _streamed_message(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of output item 0, `message`, streamed a few characters at a time."""
    text = message["content"][0]["text"]
    added = dict(message, status="in_progress", content=[])
    return [
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": added},
        ),
        *(
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": message["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": text[i : i + 4],
                },
            )
            for i in range(0, len(text), 4)
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": message},
        ),
    ]
