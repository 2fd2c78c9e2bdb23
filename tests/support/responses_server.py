"""A local fake OpenAI Responses API server: the only part of the Codex/Tutti Agent stack we fake.

It answers `POST /v1/responses` (SSE, possibly zstd-encoded bodies) and `GET /v1/models` on
127.0.0.1 with deterministic `echo: <last user text>` replies and records every request body.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.support import decode_body

ReplyFn = Callable[[dict[str, Any]], str]


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
    for role, text in reversed(model_input_texts(body)):
        if role == "user":
            return text
    return ""


def default_reply(body: dict[str, Any]) -> str:
    return f"echo: {last_user_text(body)}"


class ResponsesServer:
    """Context manager running the fake Responses API on an ephemeral 127.0.0.1 port.

    `reply` maps a request body to the assistant text (default `echo: <last user text>`).
    `.requests` holds every parsed `/responses` body, in arrival order.
    """

    def __init__(self, reply: ReplyFn | None = None) -> None:
        self._reply = reply or default_reply
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._paths: list[str] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="responses-server", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot copy of the recorded `/responses` request bodies."""
        with self._lock:
            return list(self._requests)

    @property
    def paths(self) -> list[str]:
        """Every `METHOD path` the server saw, including probes (for diagnostics)."""
        with self._lock:
            return list(self._paths)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ResponsesServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _record(self, line: str, body: dict[str, Any] | None) -> None:
        with self._lock:
            self._paths.append(line)
            if body is not None:
                self._requests.append(body)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                # Keep test output clean; `.paths` is the log.
                pass

            def _send_json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # A client that hung up (an interrupted turn) is not a server error.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                server._record(f"GET {self.path}", None)
                path = self.path.split("?", 1)[0].rstrip("/")
                if path.endswith("/models"):
                    self._send_json(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": "mock-model", "object": "model", "owned_by": "test"}],
                            "models": [],
                        },
                    )
                    return
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = self.path.split("?", 1)[0].rstrip("/")
                if not path.endswith("/responses"):
                    server._record(f"POST {self.path}", None)
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(decode_body(raw, self.headers.get("Content-Encoding")))
                except Exception as exc:  # a bad body is a 400 for the client, not a crash
                    server._record(f"POST {self.path}", None)
                    self._send_json(400, {"error": {"message": f"bad body: {exc}"}})
                    return
                server._record(f"POST {self.path}", body)
                text = server._reply(body)
                if body.get("stream"):
                    self._stream(body, text)
                else:
                    self._send_json(200, _response_object(body, text))

            def _stream(self, body: dict[str, Any], text: str) -> None:
                resp = _response_object(body, text)
                item = resp["output"][0]
                created = dict(resp, status="in_progress", output=[])
                events: list[tuple[str, dict[str, Any]]] = [
                    ("response.created", {"type": "response.created", "response": created}),
                    (
                        "response.output_item.done",
                        {"type": "response.output_item.done", "output_index": 0, "item": item},
                    ),
                    ("response.completed", {"type": "response.completed", "response": resp}),
                ]
                payload = "".join(
                    f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(payload)

        return Handler


def _response_object(body: dict[str, Any], text: str) -> dict[str, Any]:
    rid = f"resp_{uuid.uuid4().hex}"
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
        "output": [item],
        "usage": {
            "input_tokens": in_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": in_tokens + out_tokens,
        },
    }
