"""Protocol-level tests of the fake model servers: SSE shapes, encodings and request logging.

These pin the parts of the servers that the real-provider smoke tests do not reach.
"""

from __future__ import annotations

import gzip
import json
import urllib.request
from typing import Any

import pytest

from model_fakes.messages import MessagesServer, ToolUse, tool_result, tool_result_text
from model_fakes.messages import model_input_texts as messages_input_texts
from model_fakes.responses import ResponsesServer, last_user_text


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read()


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


@pytest.mark.timeout(30)
def test_responses_stream_echoes_last_user_text_from_gzip_body() -> None:
    body = {
        "model": "mock-model",
        "stream": True,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "name": "x", "arguments": "{}", "call_id": "c"},
        ],
    }
    with ResponsesServer() as srv:
        status, ctype, raw = post(
            f"{srv.base_url}/responses",
            gzip.compress(json.dumps(body).encode()),
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert srv.requests == [body]
    assert status == 200 and ctype.startswith("text/event-stream")
    events = sse_events(raw)
    # The reply streams as text deltas ("echo", ": hi") inside its item, as a real model streams.
    assert [name for name, _ in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[4][1]["item"]
    assert item["content"][0]["text"] == "echo: hi"
    assert "".join(e["delta"] for n, e in events if n == "response.output_text.delta") == (
        "echo: hi"
    )
    assert {e["item_id"] for n, e in events if n.endswith(".delta")} == {item["id"]}
    assert events[5][1]["response"]["usage"]["total_tokens"] > 0


@pytest.mark.timeout(30)
def test_responses_custom_reply_and_unknown_encoding_is_rejected() -> None:
    with ResponsesServer(reply=lambda b: f"custom {last_user_text(b)}") as srv:
        _, _, raw = post(
            f"{srv.base_url}/responses",
            json.dumps({"input": "plain", "stream": False}).encode(),
            {"Content-Type": "application/json"},
        )
        assert json.loads(raw)["output"][0]["content"][0]["text"] == "custom plain"
        with pytest.raises(urllib.error.HTTPError) as err:
            post(f"{srv.base_url}/responses", b"xx", {"Content-Encoding": "br"})
        assert err.value.code == 400
        assert len(srv.requests) == 1


@pytest.mark.timeout(30)
def test_messages_stream_has_anthropic_event_sequence_and_ignores_reminders() -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nnoise\n</system-reminder>"},
                    {"type": "text", "text": "what now"},
                ],
            },
            {"role": "system", "content": "# Environment"},
        ],
    }
    with MessagesServer() as srv:
        status, ctype, raw = post(
            f"{srv.base_url}/v1/messages?beta=true",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        _, _, counted = post(
            f"{srv.base_url}/v1/messages/count_tokens?beta=true",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        assert len(srv.requests) == 1  # count_tokens is not a model turn
    assert status == 200 and ctype.startswith("text/event-stream")
    assert json.loads(counted)["input_tokens"] > 0
    events = sse_events(raw)
    names = [name for name, _ in events]
    # The text streams in several deltas that join to the reply.
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [e["delta"] for n, e in events if n == "content_block_delta"]
    assert len(deltas) == len(names) - 5 > 1
    assert all(d["type"] == "text_delta" for d in deltas)
    assert "".join(d["text"] for d in deltas) == "echo: what now"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert messages_input_texts(body) == [("user", "what now")]


@pytest.mark.timeout(30)
def test_messages_tool_use_reply_streams_input_json_and_stops_for_the_tool() -> None:
    call = ToolUse("Bash", {"command": "echo hi > f", "description": "d"}, id="toolu_fixed")
    body = {"model": "m", "messages": [{"role": "user", "content": "run it"}]}
    with MessagesServer(reply=lambda _: call) as srv:
        url = f"{srv.base_url}/v1/messages"
        headers = {"Content-Type": "application/json"}
        _, _, raw = post(url, json.dumps({**body, "stream": True}).encode(), headers)
        _, ctype, plain = post(url, json.dumps(body).encode(), headers)
    events = sse_events(raw)
    assert events[1][1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_fixed",
        "name": "Bash",
        "input": {},
    }
    assert events[2][1]["delta"]["type"] == "input_json_delta"
    assert json.loads(events[2][1]["delta"]["partial_json"]) == call.input
    assert events[4][1]["delta"]["stop_reason"] == "tool_use"
    assert ctype.startswith("application/json")
    message = json.loads(plain)
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "tool_use", "id": "toolu_fixed", "name": "Bash", "input": call.input}
    ]


@pytest.mark.timeout(30)
def test_tool_result_is_read_only_from_the_last_user_message() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [{"type": "text", "text": "ok"}],
    }
    answered = {
        "messages": [{"role": "user", "content": "go"}, {"role": "user", "content": [result]}]
    }
    assert tool_result(answered) == result
    assert tool_result_text(result) == "ok"
    later = {"messages": [*answered["messages"], {"role": "user", "content": "next"}]}
    assert tool_result(later) is None
