"""Model backends: the built-in deterministic model (PROTOCOL.md directives) and the HTTP models
behind one interface (`--model-base-url`): OpenAI Responses here, Chat Completions in
`tutti_agent.chat` (`--wire-api chat`).

A model drives one turn through the `TurnIO` port: it emits reasoning, tool calls and the
agent message, and may ask the client for an approval or an answer."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from tutti_agent.errors import ModelError
from tutti_agent.ids import uuid7
from tutti_agent.rollout import orjson_agrees

if TYPE_CHECKING:
    import socket

    import httpx


class TurnCancelled(Exception):
    """The turn was interrupted; raised out of any blocking TurnIO call."""


class TurnIO(Protocol):
    """What a model may do inside a turn; every call is persisted and streamed."""

    def model_input(self) -> list[Mapping[str, Any]]: ...

    def reasoning(self, text: str, item_id: str | None = None) -> None: ...

    def tool_call(self, name: str, arguments: str, output: str) -> None: ...

    def request_approval(self, command: str) -> bool: ...

    def ask(self, question: str) -> str: ...

    def agent_message(self, text: str, item_id: str | None = None) -> None: ...

    def sleep(self, ms: int) -> None: ...

    def on_cancel(self, callback: Callable[[], None]) -> None: ...

    @property
    def cancelled(self) -> threading.Event: ...

    @property
    def cwd(self) -> str:
        """The thread's working directory (the Session's `cwd`)."""
        ...


class Model(Protocol):
    name: str
    provider: str

    def run(self, text: str, io: TurnIO) -> None: ...

    def warm(self) -> None:
        """Get ready for a first turn soon, without blocking the caller."""


@dataclass(frozen=True, slots=True)
class Directive:
    name: str
    rest: str


_DIRECTIVES = ("slow", "ask", "approve", "tool", "fail", "history", "write", "read", "stream")


def parse_directive(text: str) -> Directive | None:
    if not text.startswith("/"):
        return None
    head, _, rest = text[1:].partition(" ")
    return Directive(head, rest) if head in _DIRECTIVES else None


class BuiltinModel:
    """Deterministic replies: `echo: <text>`, changed by a leading directive."""

    name = "tutti-builtin"
    provider = "tutti"

    def warm(self) -> None:
        pass  # nothing to ready: no network

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
        elif d.name in ("write", "read"):
            _file_tool(d, io)
        elif d.name == "stream":
            # The echo streamed as message deltas of 4 characters, then the item they made.
            reply, item_id = f"echo: {d.rest}", f"msg_{uuid7()}"
            for at in range(0, len(reply), 4):
                _delta(io, item_id, "assistant", reply[at : at + 4])
            io.agent_message(reply, item_id)
        elif d.name == "tool":
            tool, _, args = d.rest.partition(" ")
            io.reasoning(f"The user asked for the {tool} tool.")
            io.tool_call(tool, args, f"{tool} ran with {args!r}")
            io.agent_message(f"echo: {tool}")
        else:  # fail
            raise ModelError(d.rest or "failed")


def _file_tool(d: Directive, io: TurnIO) -> None:
    """`/write <path> <text>` writes `<text>` to `<path>` under the Turn's cwd, `/read <path>`
    replies with its content: the agent itself editing and reading the workspace (a path
    leaving the cwd is refused)."""
    rel, _, body = d.rest.partition(" ")
    root = os.path.realpath(io.cwd)
    target = os.path.realpath(os.path.join(root, rel))
    if not rel or os.path.isabs(rel) or not target.startswith(root + os.sep):
        io.agent_message(f"{d.name}: refused {rel!r}")
        return
    if d.name == "write":
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(body)
        io.tool_call("write_file", rel, f"wrote {len(body)} characters to {rel}")
        io.agent_message(f"wrote: {rel}")
        return
    try:
        with open(target, encoding="utf-8") as f:
            content = f.read()
    except OSError:
        io.agent_message(f"read: {rel} is missing")
        return
    io.tool_call("read_file", rel, content)
    io.agent_message(f"read: {content}")


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


# Why a connect gets its own short deadline: an endpoint that refuses or does not route must fail
# the turn within seconds (model_unreachable), while a slow model may stream for minutes. One
# that accepts and then says nothing fails after the first-byte limit (model_timeout), one that
# stops mid-reply after the stream-idle limit.
CONNECT_TIMEOUT_S = 10.0
FIRST_BYTE_TIMEOUT_S = 30.0
STREAM_IDLE_TIMEOUT_S = 120.0
READ_TIMEOUT_S = STREAM_IDLE_TIMEOUT_S
AUTH_FAILED = "model_auth_failed"
UNREACHABLE = "model_unreachable"
TIMEOUT = "model_timeout"
# The daemon's config keys, named in the timeout sentence so a user knows what to raise.
FIRST_BYTE_KEY = "model_first_byte_seconds"
STREAM_IDLE_KEY = "model_stream_idle_seconds"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how an HTTP model is reached. The key is never held here: `api_key_env` names
    the environment variable read at each request (turn time), so it is never persisted."""

    base_url: str
    model: str = "mock-model"
    api_key_env: str | None = None
    instructions: str | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S
    """The stream-idle limit: the longest pause between two reads of a reply."""
    retries: int = 0
    """Retries of a request that got no answer at all (a first-byte timeout)."""

    def api_key(self) -> str | None:
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    def credential_note(self) -> str:
        if not self.api_key_env:
            return "no credential configured (set api_key_env)"
        state = "set" if self.api_key() else "NOT set"
        return f"credential from ${self.api_key_env}, which is {state}"


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#@\"'<>]+@")


def shown_url(url: str) -> str:
    """A URL as a message may name it: its user and password (`https://user:secret@host`)
    replaced by `***`, the rest kept."""
    return _USERINFO.sub(r"\g<1>***@", url) if "@" in url else url


class ModelClient:
    """One model endpoint's path over HTTP+SSE: the connection, the credential and the typed
    failures. A model interface (`ResponsesModel`, `ChatModel`) owns one and gives it the
    request body and the stream reader."""

    def __init__(self, endpoint: Endpoint, path: str) -> None:
        self.endpoint = endpoint
        self.base_url = endpoint.base_url.rstrip("/")
        self.path = path
        self.shown = shown_url(self.base_url + path)
        """The endpoint as messages name it (never its user and password)."""
        self.name = endpoint.model
        self._client_lock = threading.Lock()
        self._http: httpx.Client | None = None
        self._warming = False

    def model_for(self, io: TurnIO) -> str:
        """The Session's own model (thread settings) wins over the provider's default."""
        override = getattr(io, "model_name", None)
        return str(override) if override else self.name

    def warm(self) -> None:
        """Build the client on a thread of its own, once. A Session's runtime starts (thread
        start or resume) before its first turn, so that turn does not pay for importing httpx
        and loading the CA bundle (a quarter of a second quiet, seconds on a loaded machine:
        enough to lose a short first-byte limit to the host's backstop)."""
        with self._client_lock:
            if self._http is not None or self._warming:
                return
            self._warming = True
        threading.Thread(target=self._client, name="model-client", daemon=True).start()

    def _client(self) -> httpx.Client:
        """One client per model for the process: building one loads the CA bundle (a quarter
        of a second), which no turn should pay again. No connection is kept alive between
        requests, so every request's socket is a new one an interrupt can find and shut."""
        import httpx

        with self._client_lock:
            if self._http is None:
                # trust_env: HTTP(S)_PROXY / ALL_PROXY / NO_PROXY and SSL_CERT_FILE /
                # SSL_CERT_DIR are honoured as curl and the other providers honour them, so a
                # model behind a corporate proxy or a private CA is reached with no setting
                # of ours.
                self._http = httpx.Client(
                    timeout=httpx.Timeout(
                        self.endpoint.first_byte_timeout_s,
                        connect=self.endpoint.connect_timeout_s,
                    ),
                    limits=httpx.Limits(max_keepalive_connections=0),
                    trust_env=True,
                )
            return self._http

    def _fail(self, reason: str, cause: str) -> ModelError:
        return ModelError(f"{reason}: tutti-agent model endpoint {self.shown} {shown_url(cause)}")

    def post(self, body: Mapping[str, Any], io: TurnIO, consume: Callable[[Lines], None]) -> None:
        """POST `body`, then hand the 200 response to `consume`; every failure is typed. A
        request that gets no answer at all is sent again, `endpoint.retries` times."""
        for attempt in range(self.endpoint.retries + 1):
            try:
                self._post_once(body, io, consume)
                return
            except _NoFirstByte:
                if attempt < self.endpoint.retries:
                    limit = self.endpoint.first_byte_timeout_s
                    _retrying(
                        io,
                        f"{self.shown} sent nothing within {limit:g} s "
                        f"(attempt {attempt + 1} of {self.endpoint.retries + 1})",
                    )
                    continue
                limit = self.endpoint.first_byte_timeout_s
                tries = f", {attempt + 1} attempts" if attempt else ""
                raise self._fail(
                    TIMEOUT,
                    f"sent nothing within {limit:g} s of the request ({FIRST_BYTE_KEY}{tries})",
                ) from None

    def _post_once(
        self, body: Mapping[str, Any], io: TurnIO, consume: Callable[[Lines], None]
    ) -> None:
        # Imported here: every app-server spawn (one per fork, to prove the child readable)
        # would otherwise pay for httpx that only this model uses.
        import httpx

        limits = self.endpoint
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        key = limits.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        sockets = _Sockets(io)
        answered = False
        client = self._client()
        request = client.build_request(
            "POST",
            self.base_url + self.path,
            content=request_body(body),
            headers=headers,
            extensions={"trace": sockets.trace},
        )
        try:
            resp = client.send(request, stream=True)
            answered = True
            try:
                # From the first byte on, the limit is the pause between two reads of the
                # reply; httpcore reads it from the request when the body is first read.
                request.extensions["timeout"] = {
                    **request.extensions.get("timeout", {}),
                    "read": limits.read_timeout_s,
                }
                if resp.status_code in (401, 403):
                    raise self._fail(
                        AUTH_FAILED,
                        f"answered HTTP {resp.status_code} "
                        f"({limits.credential_note()}): {_head(resp, 500)}",
                    )
                if resp.status_code != 200:
                    raise ModelError(
                        f"model server returned HTTP {resp.status_code}: {_head(resp, 2000)}"
                    )
                consume(reply_lines(resp.iter_bytes()))
            finally:
                resp.close()
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            if io.cancelled.is_set():
                raise TurnCancelled() from None
            raise self._fail(UNREACHABLE, f"is unreachable: {_cause(exc)}") from None
        except httpx.TimeoutException:
            if io.cancelled.is_set():
                raise TurnCancelled() from None
            if not answered:
                raise _NoFirstByte() from None
            raise self._fail(
                TIMEOUT,
                f"stopped answering for {limits.read_timeout_s:g} s in the middle of its "
                f"reply ({STREAM_IDLE_KEY})",
            ) from None
        except (httpx.HTTPError, OSError) as exc:
            if io.cancelled.is_set():
                raise TurnCancelled() from None
            raise ModelError(f"model request failed: {_cause(exc)}") from None


Lines = Iterator[bytes]
"""A reply's lines as they arrive, as bytes (no line ends): `reply_lines`."""


def reply_lines(chunks: Iterable[bytes]) -> Lines:
    """The lines of a reply's body (its content decoded: `httpx.Response.iter_bytes`) as bytes,
    split where an event stream's lines end — CR LF, LF or a lone CR — with the ends left out;
    a last line without an end is a line too.

    Not httpx's `iter_lines`: that decodes every chunk to text, then splits it as
    `str.splitlines` does, which also ends a line at U+0085, U+2028 and U+2029 (and the
    control characters JSON escapes anyway); JSON allows the first three raw inside a string,
    so a delta holding one was cut in two and its event lost (`_decode_event`: bad SSE data).
    And the text layers (a decoder, a chunker, a line decoder, each a generator per chunk) were
    a tenth of a streamed Turn's Python in the app-server."""
    rest = b""
    for chunk in chunks:
        if rest:
            chunk, rest = rest + chunk, b""
        if b"\r" in chunk:
            held = chunk.endswith(b"\r")  # may be the first half of a CR LF: the next chunk says
            body = chunk[:-1] if held else chunk
            lines = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            rest = lines.pop() + b"\r" if held else lines.pop()
        else:
            lines = chunk.split(b"\n")
            rest = lines.pop()
        yield from lines
    if rest:
        yield rest[:-1] if rest.endswith(b"\r") else rest


def request_body(body: Mapping[str, Any]) -> bytes:
    """A request's JSON, by orjson: the body carries the whole model context, which grows with
    the thread (the standard library's encoder took 0.7 ms for a 600-item context, orjson 0.06).
    The same JSON value either way (compact, UTF-8 unescaped); what orjson refuses (a lone
    surrogate, an integer beyond 64 bits, a key that is no string) is encoded by the standard
    library as before."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(body).encode()


class _Sockets:
    """The sockets a request opens, found through httpcore's documented `trace` extension, so
    an interrupt can shut them down: shutdown() (unlike close()) wakes a read blocked in the
    turn thread, whether on the model's socket or on a proxy's."""

    def __init__(self, io: TurnIO) -> None:
        self.io = io
        self.open: list[socket.socket] = []
        io.on_cancel(self.abort)

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        import socket  # loaded by httpx already: no part of an app-server's start

        if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                self.open.append(sock)
                if self.io.cancelled.is_set():
                    self.abort()

    def abort(self) -> None:
        import socket

        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _head(resp: Any, limit: int) -> str:
    """The first `limit` bytes of an error reply's body, as text."""
    data = b""
    for chunk in resp.iter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return data[:limit].decode(errors="replace").strip()


def _cause(exc: BaseException) -> str:
    """httpx's words for a failure, or the OS error under it when httpx has none."""
    text = str(exc)
    if text:
        return text
    inner = exc.__cause__ or exc.__context__
    return str(inner) if inner is not None else type(exc).__name__


class _NoFirstByte(Exception):
    """One attempt got no answer within the first-byte limit (retried, then `model_timeout`)."""


class ResponsesModel:
    """POST {base}/responses with `stream: true`; reads SSE until response.completed, streaming
    `response.output_text.delta` as message deltas."""

    provider = "responses"

    def __init__(
        self,
        base_url: str | Endpoint,
        model: str = "mock-model",
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        endpoint = (
            base_url
            if isinstance(base_url, Endpoint)
            else Endpoint(base_url, model, read_timeout_s=timeout_s)
        )
        self.endpoint = endpoint
        self.name = endpoint.model
        self.client = ModelClient(endpoint, "/responses")

    def warm(self) -> None:
        self.client.warm()

    def run(self, text: str, io: TurnIO) -> None:
        body: dict[str, Any] = {
            "model": self.client.model_for(io),
            "stream": True,
            "store": False,
            "input": io.model_input(),
            "tools": [],
        }
        if self.endpoint.instructions:
            body["instructions"] = self.endpoint.instructions
        self.client.post(body, io, lambda resp: self._consume(resp, io))

    def _consume(self, lines: Lines, io: TurnIO) -> None:
        completed = False
        for event in _sse_events(lines):
            if io.cancelled.is_set():
                raise TurnCancelled()
            kind = event.get("type")
            if kind == "response.output_text.delta":
                _delta(io, str(event.get("item_id") or ""), "assistant", event.get("delta"))
            elif kind == "response.reasoning_summary_text.delta":
                _delta(io, str(event.get("item_id") or ""), "reasoning", event.get("delta"))
            elif kind == "response.output_item.done":
                self._item(event.get("item") or {}, io)
            elif kind == "response.completed":
                usage = (event.get("response") or {}).get("usage")
                if isinstance(usage, Mapping):
                    _usage(io, usage.get("input_tokens"), usage.get("output_tokens"))
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


def _delta(io: TurnIO, item_id: str, kind: str, delta: Any) -> None:
    """Stream a text delta when the TurnIO can (a test double may not)."""
    fn = getattr(io, "delta", None)
    if fn is not None and isinstance(delta, str) and delta and item_id:
        fn(item_id, kind, delta)


def _retrying(io: TurnIO, message: str) -> None:
    """Tell the client a model request is being sent again (when the TurnIO can)."""
    fn = getattr(io, "retrying", None)
    if fn is not None:
        fn(message)


def _usage(io: TurnIO, input_tokens: Any, output_tokens: Any) -> None:
    fn = getattr(io, "usage", None)
    if fn is not None and isinstance(input_tokens, int) and isinstance(output_tokens, int):
        fn(input_tokens, output_tokens)


def _sse_events(lines: Lines, *, done_marker: bool = False) -> Iterator[dict[str, Any]]:
    """Yield each SSE `data:` payload as it arrives (items stream into the turn live); with
    `done_marker`, Chat Completions' final `data: [DONE]` is yielded as `{"type": "done"}`."""
    data: list[bytes] = []
    for line in lines:
        if not line:
            if data:
                parts, data = data, []
                if done_marker and _is_done(parts):
                    yield {"type": "done"}
                    return
                yield _decode_event(parts)
            continue
        if line.startswith(b"data:"):
            data.append(line[5:])
    if data:
        yield _decode_event(data)


def _event_text(parts: list[bytes]) -> str:
    """An event's `data:` parts as the text they always made: each decoded as UTF-8 (an invalid
    byte read as U+FFFD), its leading whitespace stripped, joined by newlines."""
    return "\n".join(part.decode("utf-8", "replace").lstrip() for part in parts)


def _is_done(parts: list[bytes]) -> bool:
    return b"[DONE]" in parts[-1] and _event_text(parts).strip() == "[DONE]"


def _decode_event(parts: list[bytes]) -> dict[str, Any]:
    """An event's JSON, by orjson from the bytes where it reads what the standard library
    reads from `_event_text` (an event with no run of 19 digits: `rollout.orjson_agrees`);
    anything orjson refuses — invalid UTF-8, NaN, a value whose leading whitespace is not
    ASCII — is decoded from the text by the standard library as before, with its errors."""
    raw = parts[0].lstrip() if len(parts) == 1 else b"\n".join(p.lstrip() for p in parts)
    obj: Any
    try:
        if not orjson_agrees(raw):
            raise _Refused
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, _Refused):
        text = _event_text(parts)
        try:
            obj = json.loads(text)
        except ValueError:
            return {"type": "error", "error": {"message": f"bad SSE data: {text[:200]}"}}
        return obj if isinstance(obj, dict) else {"type": "error", "error": {"message": text[:200]}}
    if isinstance(obj, dict):
        return obj
    return {"type": "error", "error": {"message": _event_text(parts)[:200]}}


class _Refused(Exception):
    """An event orjson may read otherwise than the standard library: decode it as text."""
