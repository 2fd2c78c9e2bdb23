"""A local fake Responses API that can ask Codex to run a command: a user text `/run <cmd>`
is answered with an `exec_command` function call that asks to run outside the sandbox
(`require_escalated`, so an `on-request` policy asks the user first); the follow-up request
(carrying the call's output) is answered `ran: <output>`. Anything else is echoed. Binds
127.0.0.1 only."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.support import decode_body
from tests.support.responses_server import last_user_text

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


class ToolModel:
    """Context manager; `.requests` holds every parsed `/responses` body."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> ToolModel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, ctype: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, "application/json", json.dumps({"data": [], "models": []}).encode())

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(decode_body(raw, self.headers.get("Content-Encoding")))
                with model._lock:
                    model._requests.append(body)
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
                events = [
                    ("response.created", {"response": dict(resp, status="in_progress", output=[])}),
                    ("response.output_item.done", {"output_index": 0, "item": item}),
                    ("response.completed", {"response": resp}),
                ]
                payload = "".join(
                    f"event: {name}\ndata: {json.dumps(dict(data, type=name))}\n\n"
                    for name, data in events
                ).encode()
                self._send(200, "text/event-stream", payload)

        return Handler
