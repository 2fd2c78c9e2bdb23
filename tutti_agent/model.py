"""Model backends: the built-in deterministic model (PROTOCOL.md directives) and an OpenAI
Responses-API client (`--model-base-url`).

A model drives one turn through the `TurnIO` port: it emits reasoning, tool calls and the
agent message, and may ask the client for an approval or an answer."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tutti_agent.errors import ModelError

if TYPE_CHECKING:
    import http.client


class TurnCancelled(Exception):
    """The turn was interrupted; raised out of any blocking TurnIO call."""


class TurnIO(Protocol):
    """What a model may do inside a turn; every call is persisted and streamed."""

    def model_input(self) -> list[Mapping[str, Any]]: ...

    def reasoning(self, text: str) -> None: ...

    def tool_call(self, name: str, arguments: str, output: str) -> None: ...

    def request_approval(self, command: str) -> bool: ...

    def ask(self, question: str) -> str: ...

    def agent_message(self, text: str, item_id: str | None = None) -> None: ...

    def sleep(self, ms: int) -> None: ...

    def on_cancel(self, callback: Callable[[], None]) -> None: ...

    @property
    def cancelled(self) -> threading.Event: ...


class Model(Protocol):
    name: str
    provider: str

    def run(self, text: str, io: TurnIO) -> None: ...


@dataclass(frozen=True, slots=True)
class Directive:
    name: str
    rest: str


_DIRECTIVES = ("slow", "ask", "approve", "tool", "fail", "history")


def parse_directive(text: str) -> Directive | None:
    if not text.startswith("/"):
        return None
    head, _, rest = text[1:].partition(" ")
    return Directive(head, rest) if head in _DIRECTIVES else None


class BuiltinModel:
    """Deterministic replies: `echo: <text>`, changed by a leading directive."""

    name = "tutti-builtin"
    provider = "tutti"

    def run(self, text: str, io: TurnIO) -> None:
        d = parse_directive(text)
        if d is None:
            io.agent_message(f"echo: {text}")
            return
        if d.name == "slow":
            ms_text, _, rest = d.rest.partition(" ")
            if not ms_text.isdigit():
                io.agent_message(f"echo: {text}")
                return
            io.sleep(int(ms_text))
            io.agent_message(f"echo: {rest}")
        elif d.name == "ask":
            io.agent_message(io.ask(d.rest))
        elif d.name == "approve":
            verdict = "approved" if io.request_approval(d.rest) else "declined"
            io.agent_message(f"{verdict}: {d.rest}")
        elif d.name == "history":
            # What the model would see: the real user messages of the model-visible context
            # (contextual wrappers excluded), so a fork's inherited history can be shown.
            io.agent_message("history: " + " | ".join(_user_texts(io.model_input())))
        elif d.name == "tool":
            tool, _, args = d.rest.partition(" ")
            io.reasoning(f"The user asked for the {tool} tool.")
            io.tool_call(tool, args, f"{tool} ran with {args!r}")
            io.agent_message(f"echo: {tool}")
        else:  # fail
            raise ModelError(d.rest or "failed")


def _user_texts(items: list[Mapping[str, Any]]) -> list[str]:
    texts = []
    for item in items:
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        for part in item.get("content") or []:
            text = str(part.get("text", "")) if isinstance(part, Mapping) else ""
            if text and not text.startswith("<"):
                texts.append(text)
    return texts


class ResponsesModel:
    """POST {base}/responses with `stream: true`; reads SSE until response.completed."""

    provider = "responses"

    def __init__(self, base_url: str, model: str = "mock-model", timeout_s: float = 300.0):
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.timeout_s = timeout_s

    def run(self, text: str, io: TurnIO) -> None:
        # Imported here: every app-server spawn (one per fork, to prove the child readable)
        # would otherwise pay for http.client + email (~17 ms) that only this model uses.
        import http.client

        body = {
            "model": self.name,
            "stream": True,
            "store": False,
            "input": io.model_input(),
            "tools": [],
        }
        url = urllib.parse.urlsplit(self.base_url + "/responses")
        conn_cls = (
            http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        )
        conn = conn_cls(url.hostname or "127.0.0.1", url.port, timeout=self.timeout_s)

        def abort() -> None:
            # shutdown() (unlike close()) wakes a recv blocked in the turn thread.
            sock = conn.sock
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)

        io.on_cancel(abort)
        try:
            try:
                conn.request(
                    "POST",
                    url.path,
                    body=json.dumps(body).encode(),
                    headers={"content-type": "application/json", "accept": "text/event-stream"},
                )
                resp = conn.getresponse()
                if resp.status != 200:
                    detail = resp.read(2000).decode(errors="replace")
                    raise ModelError(f"model server returned HTTP {resp.status}: {detail}")
                self._consume(resp, io)
            except (OSError, http.client.HTTPException, AttributeError) as exc:
                if io.cancelled.is_set():
                    raise TurnCancelled() from None
                raise ModelError(f"model request failed: {exc}") from None
        finally:
            conn.close()

    def _consume(self, resp: http.client.HTTPResponse, io: TurnIO) -> None:
        completed = False
        for event in _sse_events(resp):
            if io.cancelled.is_set():
                raise TurnCancelled()
            kind = event.get("type")
            if kind == "response.output_item.done":
                self._item(event.get("item") or {}, io)
            elif kind == "response.completed":
                completed = True
                break
            elif kind in ("response.failed", "error", "response.incomplete"):
                err = (event.get("response") or {}).get("error") or event.get("error") or event
                raise ModelError(f"model stream failed: {json.dumps(err)[:500]}")
        if not completed:
            if io.cancelled.is_set():
                raise TurnCancelled()
            raise ModelError("model stream ended before response.completed")

    @staticmethod
    def _item(item: Mapping[str, Any], io: TurnIO) -> None:
        kind = item.get("type")
        if kind == "message":
            text = "".join(
                str(c.get("text", ""))
                for c in item.get("content") or []
                if isinstance(c, Mapping) and c.get("type") in ("output_text", "text")
            )
            io.agent_message(text, item_id=str(item["id"]) if item.get("id") else None)
        elif kind == "reasoning":
            summary = item.get("summary") or []
            io.reasoning(
                "\n".join(str(s.get("text", "")) for s in summary if isinstance(s, Mapping))
            )
        elif kind == "function_call":
            # No tools are offered; a stray call is recorded with a refusal as its output.
            io.tool_call(
                str(item.get("name", "")),
                str(item.get("arguments", "")),
                "tool unavailable in tutti_agent",
            )


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """Yield each SSE `data:` payload as it arrives (items stream into the turn live)."""
    data: list[str] = []
    while True:
        raw = resp.readline()
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield _decode_event("\n".join(data))
                data = []
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        yield _decode_event("\n".join(data))


def _decode_event(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError:
        return {"type": "error", "error": {"message": f"bad SSE data: {text[:200]}"}}
    return obj if isinstance(obj, dict) else {"type": "error", "error": {"message": text[:200]}}
