"""A tiny local OpenAI Responses API echo server for `make demo PROVIDER=codex`: Codex needs a
model endpoint, the demo has no network and no credentials, so this answers `echo: <last user
text>` on 127.0.0.1 and logs every request body so the demo can show what the model saw.

The test suite has its own, richer fake (`tests/support/responses_server.py`); this one exists
because the installed `agenthost` package must not import the repository's `tests/`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


def user_texts(body: dict[str, Any]) -> list[str]:
    """The text of every user message in one request, in order (Codex's own context messages
    included; callers filter on the texts they sent)."""
    out = []
    for item in body.get("input") or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        if item.get("role") != "user":
            continue
        parts = item.get("content")
        if isinstance(parts, str):
            out.append(parts)
        elif isinstance(parts, list):
            out.append("".join(str(p.get("text", "")) for p in parts if isinstance(p, dict)))
    return out


class MockResponsesModel:
    """Context manager serving `POST /v1/responses` (SSE) and `GET /v1/models`."""

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

    def __enter__(self) -> MockResponsesModel:
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

            def _send(self, ctype: str, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send("application/json", b'{"object": "list", "data": [], "models": []}')

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                with model._lock:
                    model._requests.append(body)
                texts = user_texts(body)
                item = {
                    "type": "message",
                    "id": f"msg_{uuid.uuid4().hex}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "text": f"echo: {texts[-1] if texts else ''}",
                            "annotations": [],
                        }
                    ],
                }
                usage = {
                    "input_tokens": 1,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 1,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 2,
                }
                resp = {
                    "id": f"resp_{uuid.uuid4().hex}",
                    "object": "response",
                    "status": "completed",
                    "model": body.get("model", "mock-model"),
                    "output": [item],
                    "usage": usage,
                }
                events: list[tuple[str, dict[str, Any]]] = [
                    ("response.created", {"response": dict(resp, status="in_progress", output=[])}),
                    ("response.output_item.done", {"output_index": 0, "item": item}),
                    ("response.completed", {"response": resp}),
                ]
                self._send(
                    "text/event-stream",
                    "".join(
                        f"event: {name}\ndata: {json.dumps(dict(data, type=name))}\n\n"
                        for name, data in events
                    ).encode(),
                )

        return Handler
