"""The HTTP plumbing shared by the fake model servers: an ephemeral 127.0.0.1 server on its own
thread that records every request, and a handler base that sends JSON and SSE answers.

`FakeModelServer` is an abstract base in the way `socketserver`'s servers are: it runs and
records; each API (Responses, Chat, Messages) implements its routes and payloads
(`handler_class`) and where its API lives (`base_url`).
"""

from __future__ import annotations

import abc
import contextlib
import json
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

R = TypeVar("R")

ReplyFn = Callable[[dict[str, Any]], str]
"""The common reply function: request body → assistant text."""


def last_text_of(conversation: Sequence[tuple[str, str]], role: str = "user") -> str:
    """The text of the last `(role, text)` of `role` in a conversation ("" if there is none)."""
    for who, text in reversed(conversation):
        if who == role:
            return text
    return ""


def sse_frames(events: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Named SSE events as frames (`event:` and `data:` lines) for `send_stream[_live]`."""
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]


def chunks(text: str, size: int = 4) -> list[str]:
    """A reply split the way a model streams it (several deltas, never empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


INVALID_API_KEY = {
    "error": {
        "message": "Incorrect API key provided",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
}
"""The OpenAI APIs' 401 body for a missing or wrong key."""


class ModelHandler(BaseHTTPRequestHandler):
    """Quiet handler with JSON and SSE senders; a client that hung up is not an error."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # keep test output clean; the server's `.paths` is the log

    def route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def read_raw_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_json(self, status: int, obj: Any) -> None:
        self._send(status, "application/json", json.dumps(obj).encode())

    def send_stream_live(
        self,
        frames: Sequence[str],
        *,
        hold_after: int = -1,
        gate: threading.Event | None = None,
        timeout: float = 60.0,
        delay_s: float = 0.0,
    ) -> None:
        """Stream SSE frames one by one (no Content-Length; the connection closes at the end),
        holding after the first `hold_after` until `gate` is set: a client can be seen
        showing a reply while the model is still producing it."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for index, frame in enumerate(frames):
                if index == hold_after and gate is not None:
                    gate.wait(timeout)
                if delay_s and index:
                    time.sleep(delay_s)  # a model that drips its reply
                self.wfile.write(frame.encode())
                self.wfile.flush()

    def answer(
        self, server: FakeModelServer[Any], status: int, payload: Any, *, seen: str = ""
    ) -> None:
        """Answer with JSON a request that is not a model request (a probe, a refusal): it is
        recorded as `METHOD path` (and `seen`, e.g. " 401"), its body is not kept."""
        server.record(f"{self.command} {self.path}{seen}", None)
        self.send_json(status, payload)

    def no_route(self) -> dict[str, Any]:
        return {"error": {"message": f"no route {self.path}"}}

    def send_sse(self, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.send_stream(sse_frames(events))

    def send_stream(self, frames: Sequence[str]) -> None:
        """SSE frames as one answer (with its Content-Length)."""
        self._send(200, "text/event-stream", "".join(frames).encode(), cache=False)

    def _send(self, status: int, content_type: str, data: bytes, *, cache: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if not cache:
            self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)


class FakeModelServer(Generic[R], abc.ABC):
    """Context manager serving `handler_class()` on an ephemeral 127.0.0.1 port (abstract:
    an API's server says its routes and its base URL).

    `.requests` holds the recorded model request bodies in arrival order, `.paths` every
    `METHOD path` seen (probes included). `R` is what the reply function returns (text, or
    for the Messages fake also a tool call).
    """

    thread_name = "fake-model-server"

    def __init__(
        self,
        reply: Callable[[dict[str, Any]], R],
        *,
        api_key: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._reply = reply
        self.scheme = "https" if tls is not None else "http"
        """`https` when served over TLS with `tls` (a server-side context)."""
        self.api_key = api_key
        """When set, every model request must carry it (`Authorization: Bearer` or
        `x-api-key`), else the answer is 401, like the hosted APIs."""
        self.rejected = 0
        """Requests answered 401 for a missing or wrong credential."""
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._paths: list[str] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler_class())
        self._httpd.daemon_threads = True
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=self.thread_name, daemon=True
        )
        self._thread.start()
        self._closed = False

    @abc.abstractmethod
    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler of this API; its methods call back `record`, `authorized`
        and `reply_to` on this server."""

    @property
    @abc.abstractmethod
    def base_url(self) -> str:
        """Where a client of this API points (scheme, 127.0.0.1, the port, the API's path)."""

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot copy of the recorded model request bodies."""
        with self._lock:
            return list(self._requests)

    @property
    def paths(self) -> list[str]:
        """Every `METHOD path` the server saw, including probes (for diagnostics)."""
        with self._lock:
            return list(self._paths)

    def authorized(self, handler: BaseHTTPRequestHandler) -> bool:
        """Whether the request carries the required credential; counts the refusals."""
        if self.api_key is None:
            return True
        bearer = handler.headers.get("Authorization") or ""
        given = handler.headers.get("x-api-key") or (
            bearer[7:] if bearer.startswith("Bearer ") else ""
        )
        if given == self.api_key:
            return True
        with self._lock:
            self.rejected += 1
        return False

    def reply_to(self, body: dict[str, Any]) -> R:
        return self._reply(body)

    def record(self, line: str, body: dict[str, Any] | None) -> None:
        with self._lock:
            self._paths.append(line)
            if body is not None:
                self._requests.append(body)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
