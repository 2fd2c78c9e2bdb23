"""Tutti Agent reads a model's event stream as bytes, split where an event stream's lines end
(CR LF, LF, a lone CR) and nowhere else, each event's JSON by orjson where it reads what the
standard library reads (`tutti_agent.model.reply_lines`, `_decode_event`): a delta holding a
raw U+2028, U+2029 or U+0085 (JSON allows them unescaped inside a string) streams whole, where
httpx's text lines cut it in two and lost the event; and a streamed reply's chunks pass through
no text decoder, line decoder or standard-library JSON decode."""

from __future__ import annotations

import gzip
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import tutti_agent.model as model_module
from model_fakes.responses import ResponsesServer
from tutti_agent.errors import ModelError
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


def test_a_streamed_replys_chunks_pass_no_text_layer_and_no_standard_json_decode() -> None:
    text = "twelve words make a reply of some twelve deltas or so here"
    with ResponsesServer(lambda body: text, drip_s=0.002) as server:
        model = ResponsesModel(Endpoint(server.base_url))
        model.run("warm", IO())  # type: ignore[arg-type]  # the client built, httpx imported
        io = IO()
        seen = _entered(lambda: model.run("hi", io))  # type: ignore[arg-type]
    assert "".join(io.deltas) == text and io.texts == [text]
    names = {name for _, name in seen}
    # Without `reply_lines`: httpx's iter_text, TextDecoder.decode, LineDecoder.decode per chunk.
    assert not names & {"Response.iter_text", "Response.iter_lines", "LineDecoder.decode"}
    # Without `body_chunks`' own reader: h11's event machine once per network read, where now
    # only the headers pass through it.
    assert [name for _, name in seen].count("HTTP11Connection._receive_event") == 1
    # Without orjson for the events: json.loads and JSONDecoder.decode once per event.
    assert not [name for file, name in seen if file.endswith("json/decoder.py")]


# --------------------------------------------------------------------------- the reply's body
# `body_chunks` reads a 200 reply's body itself past the headers httpx parsed; a raw server
# sends each framing in awkward pieces (a size line cut in two, a chunk across writes).


class _RawReply:
    """A 127.0.0.1 server that answers one request with `pieces`, written apart, then closes."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                body += conn.recv(65536)
            for piece in self.pieces:
                try:
                    conn.sendall(piece)
                except OSError:
                    return  # the reader had what it needed (response.completed) and closed
                time.sleep(0.01)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def _sse(*events: Mapping[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


_REPLY = _sse(
    {"type": "response.output_text.delta", "item_id": "m", "delta": "he"},
    {"type": "response.output_text.delta", "item_id": "m", "delta": "llo"},
    {
        "type": "response.output_item.done",
        "item": {
            "type": "message",
            "id": "m",
            "content": [{"type": "output_text", "text": "hello"}],
        },
    },
    {"type": "response.completed", "response": {}},
)
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def _run_raw(pieces: list[bytes], monkeypatch: pytest.MonkeyPatch) -> tuple[IO, list[int]]:
    used: list[int] = []
    real = model_module._lean_body

    def counted(*args: Any) -> Iterator[bytes]:
        used.append(1)
        return real(*args)

    monkeypatch.setattr(model_module, "_lean_body", counted)
    server = _RawReply(pieces)
    try:
        io = IO()
        ResponsesModel(Endpoint(server.base_url, read_timeout_s=5)).run("hi", io)  # type: ignore[arg-type]
        return io, used
    finally:
        server.close()


def _chunked(body: bytes, size: int) -> bytes:
    out = b""
    for at in range(0, len(body), size):
        piece = body[at : at + size]
        out += f"{len(piece):X}".encode() + b";ext=1 \r\n" + piece + b"\r\n"
    return out + b"0\r\nx-trailer: 1\r\n\r\n"


def _cut(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)]


@pytest.mark.parametrize("write", [7, 1000])
def test_a_chunked_reply_in_any_pieces_reads_whole(
    write: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    wire = _HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_REPLY, 23)
    io, used = _run_raw(_cut(wire, write), monkeypatch)
    assert io.deltas == ["he", "llo"] and io.texts == ["hello"] and used == [1]


def test_a_length_delimited_and_a_close_delimited_reply_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sized = _HEAD + f"content-length: {len(_REPLY)}\r\n\r\n".encode() + _REPLY
    io, used = _run_raw(_cut(sized, 11), monkeypatch)
    assert io.texts == ["hello"] and used == [1]
    closed = b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + _REPLY
    io, used = _run_raw(_cut(closed, 13), monkeypatch)
    assert io.texts == ["hello"] and used == [1]


def test_a_broken_chunked_reply_fails_the_turn_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    head = _HEAD + b"transfer-encoding: chunked\r\n\r\n"
    with pytest.raises(ModelError, match="model request failed: illegal chunk header"):
        _run_raw([head + b"zz\r\n"], monkeypatch)
    with pytest.raises(ModelError, match="model request failed: malformed chunk footer"):
        _run_raw([head + b"3\r\nabcXY"], monkeypatch)
    # The connection closed before `response.completed`: the body was cut.
    cut = _chunked(_REPLY, 23)[:60]
    with pytest.raises(ModelError, match="model request failed: peer closed connection"):
        _run_raw([head + cut], monkeypatch)


def test_a_reply_with_a_content_coding_is_read_by_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    packed = gzip.compress(_REPLY)
    wire = (
        _HEAD + f"content-encoding: gzip\r\ncontent-length: {len(packed)}\r\n\r\n".encode() + packed
    )
    io, used = _run_raw([wire], monkeypatch)
    assert io.texts == ["hello"] and used == []
