"""Tutti Agent reads a model's event stream as bytes, split where an event stream's lines end
(CR LF, LF, a lone CR) and nowhere else, each event's JSON by orjson where it reads what the
standard library reads (`tutti_agent.model.reply_lines`, `_decode_event`): a delta holding a
raw U+2028, U+2029 or U+0085 (JSON allows them unescaped inside a string) streams whole, where
httpx's text lines cut it in two and lost the event; and a streamed reply's chunks pass through
no text decoder, line decoder or standard-library JSON decode."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from model_fakes.responses import ResponsesServer
from tutti_agent.model import Endpoint, ResponsesModel, _sse_events, reply_lines

pytestmark = pytest.mark.timeout(60)


class IO:
    """The TurnIO a model drives, recording what it was given."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.texts: list[str] = []
        self.deltas: list[str] = []

    def model_input(self) -> list[Mapping[str, Any]]:
        return [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ]

    def on_cancel(self, callback: Callable[[], None]) -> None:
        pass

    def agent_message(self, text: str, item_id: str | None = None) -> None:
        self.texts.append(text)

    def delta(self, item_id: str, kind: str, text: str) -> None:
        self.deltas.append(text)

    def reasoning(self, text: str, item_id: str | None = None) -> None:
        pass

    def tool_call(self, name: str, arguments: str, output: str) -> None:
        pass


def _event(data: Mapping[str, Any]) -> bytes:
    # ensure_ascii=False: U+2028, U+2029 and U+0085 stay raw inside the JSON strings.
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\r\n\r\n"


class _RawSSE(BaseHTTPRequestHandler):
    """One streamed reply whose text holds the three characters raw, CR LF line ends, each
    event its own write."""

    protocol_version = "HTTP/1.0"
    text = "a\u2028b\u2029c\u0085d"

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        item = {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": self.text}],
        }
        for piece in (self.text[:3], self.text[3:]):
            self.wfile.write(
                _event({"type": "response.output_text.delta", "item_id": "msg_1", "delta": piece})
            )
            self.wfile.flush()
        self.wfile.write(_event({"type": "response.output_item.done", "item": item}))
        self.wfile.write(_event({"type": "response.completed", "response": {"usage": None}}))
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def test_a_delta_holding_unicode_line_separators_streams_whole() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RawSSE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        io = IO()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        ResponsesModel(Endpoint(base)).run("hi", io)  # type: ignore[arg-type]
    finally:
        server.shutdown()
        server.server_close()
    # Without `reply_lines` (httpx's `iter_lines`): the events were cut at U+2028 and the turn
    # failed "bad SSE data".
    assert io.deltas == ["a\u2028b", "\u2029c\u0085d"]
    assert io.texts == [_RawSSE.text]


def _lines(chunks: list[bytes]) -> list[bytes]:
    return list(reply_lines(iter(chunks)))


def test_reply_lines_split_at_cr_lf_lf_and_a_lone_cr_across_chunks() -> None:
    assert _lines([b"a\nb\r\nc\rd"]) == [b"a", b"b", b"c", b"d"]
    # A CR LF cut between two chunks is one line end, not two.
    assert _lines([b"a\r", b"\nb\n"]) == [b"a", b"b"]
    assert _lines([b"a\r", b"b\r", b"\r\n"]) == [b"a", b"b", b""]
    assert _lines([b"a\r\r\n\n"]) == [b"a", b"", b""]
    # A line cut anywhere, and a last line with no end (or a lone CR as its end).
    assert _lines([b"da", b"ta: 1", b"2\n", b"", b"tail"]) == [b"data: 12", b"tail"]
    assert _lines([b"x\r"]) == [b"x"]
    assert _lines([b"\r"]) == [b""]
    # Not line ends in an event stream: U+2028, U+2029, U+0085 (their UTF-8), VT, FF, FS.
    odd = "\u2028\u2029\u0085\x0b\x0c\x1c".encode()
    assert _lines([b"a" + odd + b"b\n"]) == [b"a" + odd + b"b"]


def test_an_events_json_reads_as_the_standard_library_reads_its_text() -> None:
    def events(raw: bytes, *, done: bool = False) -> list[dict[str, Any]]:
        return list(_sse_events(reply_lines(iter([raw])), done_marker=done))

    assert events(b'event: x\ndata: {"a": 1}\n\n') == [{"a": 1}]
    # Data over two lines, each stripped of its leading whitespace, joined by a newline.
    assert events(b'data: {"a":\ndata:    [1, 2]}\n\n') == [{"a": [1, 2]}]
    # An integer beyond 64 bits stays an int (orjson would read it as a float).
    assert events(b'data: {"n": 123456789012345678901234}\n\n') == [{"n": 123456789012345678901234}]
    # NaN, as the standard library reads it.
    nan = events(b'data: {"x": NaN}\n\n')[0]["x"]
    assert nan != nan
    # Invalid UTF-8 reads as U+FFFD, as httpx's text decoder made it.
    assert events(b'data: {"t": "a\xffb"}\n\n') == [{"t": "a\ufffdb"}]
    assert events(b"data: [1]\n\n") == [{"type": "error", "error": {"message": "[1]"}}]
    assert events(b"data: {oops\n\n") == [
        {"type": "error", "error": {"message": "bad SSE data: {oops"}}
    ]
    assert events(b'data: {"a": 1}') == [{"a": 1}]  # the stream ended without its blank line
    assert events(b"data: [DONE]\n\ndata: {}\n\n", done=True) == [{"type": "done"}]


_AS_LETTERS = str.maketrans("0123456789", "abcdefabcd")


def _entered(fn: Callable[[], Any]) -> list[tuple[str, str]]:
    """(file, qualified name) of each Python function `fn()` entered on this thread."""
    seen: list[tuple[str, str]] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.append((frame.f_code.co_filename, frame.f_code.co_qualname))

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_a_streamed_replys_chunks_pass_no_text_layer_and_no_standard_json_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fake's ids are random hex: one in ~300 holds a run of 19 decimal digits, which the
    # model rightly decodes with the standard library (`orjson_agrees`) — ids with no digit.
    import model_fakes.responses as fake

    letters = iter(range(1 << 30))
    monkeypatch.setattr(
        fake.uuid, "uuid4", lambda: uuid.UUID(hex=f"{next(letters):08x}".translate(_AS_LETTERS) * 4)
    )
    text = "twelve words make a reply of some twelve deltas or so here"
    with ResponsesServer(lambda body: text) as server:
        model = ResponsesModel(Endpoint(server.base_url))
        model.run("warm", IO())  # type: ignore[arg-type]  # the client built, httpx imported
        io = IO()
        seen = _entered(lambda: model.run("hi", io))  # type: ignore[arg-type]
    assert "".join(io.deltas) == text and io.texts == [text]
    names = {name for _, name in seen}
    # Without `reply_lines`: httpx's iter_text, TextDecoder.decode, LineDecoder.decode per chunk.
    assert not names & {"Response.iter_text", "Response.iter_lines", "LineDecoder.decode"}
    # Without orjson for the events: json.loads and JSONDecoder.decode once per event.
    assert not [name for file, name in seen if file.endswith("json/decoder.py")]
