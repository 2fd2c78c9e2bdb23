"""Tutti Agent's HTTP models: the key read from the variable named by `--api-key-env`
and sent as a Bearer token, typed failures (401 → model_auth_failed), the Chat Completions wire
API (`--wire-api chat`: turns, a tool call, a fork whose child request holds exactly the
prefix), and streamed deltas whose concatenation is the completed message."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from model_fakes.chat import ChatServer, ToolCall, conversation
from model_fakes.responses import ResponsesServer
from tests.tutti_agent.appserver import AppServerProcess, agent_texts

pytestmark = pytest.mark.timeout(60)

Start = Callable[..., AppServerProcess]
KEY = "sk-test-tutti-0123456789"


def run_collecting(
    server: AppServerProcess, thread_id: str, text: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one turn; return the completed turn and every delta notification before it."""
    turn_id = server.start_turn(thread_id, text)
    deltas: list[dict[str, Any]] = []
    while True:
        try:
            msg = server.notifications.get(timeout=30)
        except queue.Empty:
            raise TimeoutError("turn did not complete") from None
        params = msg["params"]
        if msg["method"] == "item/agentMessage/delta" and params["turnId"] == turn_id:
            deltas.append(params)
        if msg["method"] == "turn/completed" and params["turn"]["id"] == turn_id:
            return params["turn"], deltas


@pytest.mark.parametrize("wire", ["responses", "chat"])
def test_key_from_the_named_variable_is_sent_as_bearer(
    tutti_server: Start, tmp_path: Path, wire: str
) -> None:
    server_cls = ChatServer if wire == "chat" else ResponsesServer
    with server_cls(api_key=KEY) as model:
        args = [
            "--model-base-url",
            model.base_url,
            "--wire-api",
            wire,
            "--api-key-env",
            "TEST_MODEL_KEY",
        ]
        server = tutti_server(extra_args=args, env={"TEST_MODEL_KEY": KEY})
        tid = server.start_thread(str(tmp_path))
        turn, deltas = run_collecting(server, tid, "one")
        assert turn["status"] == "completed", turn
        assert agent_texts(turn) == ["echo: one"]
        # Streamed in pieces, and the pieces are the message.
        assert len(deltas) > 1
        message = next(i for i in turn["items"] if i["type"] == "agentMessage")
        assert {d["itemId"] for d in deltas} == {message["id"]}
        assert "".join(d["delta"] for d in deltas) == message["text"]
        assert model.rejected == 0


@pytest.mark.parametrize("wire", ["responses", "chat"])
def test_missing_key_fails_the_turn_as_model_auth_failed(
    tutti_server: Start, tmp_path: Path, wire: str
) -> None:
    server_cls = ChatServer if wire == "chat" else ResponsesServer
    with server_cls(api_key=KEY) as model:
        args = [
            "--model-base-url",
            model.base_url,
            "--wire-api",
            wire,
            "--api-key-env",
            "TEST_MODEL_KEY",
        ]
        server = tutti_server(extra_args=args)  # the variable is not set
        tid = server.start_thread(str(tmp_path))
        turn = server.run_turn(tid, "one")
        assert turn["status"] == "failed"
        message = turn["error"]["message"]
        assert message.startswith("model_auth_failed: tutti-agent model endpoint ")
        assert model.base_url in message and "401" in message
        assert "$TEST_MODEL_KEY, which is NOT set" in message
        assert model.rejected == 1


def test_chat_turns_tool_call_and_fork_prefix(tutti_server: Start, tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str | ToolCall:
        convo = conversation(body)
        if convo[-1] == ("user", "use the tool"):
            return ToolCall("lookup", {"q": "flights"})
        if convo[-1][0] == "tool":
            return f"tool said: {convo[-1][1]}"
        return f"echo: {convo[-1][1]}"

    with ChatServer(reply) as model:
        server = tutti_server(
            extra_args=[
                "--model-base-url",
                model.base_url,
                "--wire-api",
                "chat",
                "--instructions",
                "Be brief.",
            ]
        )
        tid = server.start_thread(str(tmp_path))
        first = server.run_turn(tid, "one")
        assert agent_texts(first) == ["echo: one"]
        tool_turn = server.run_turn(tid, "use the tool")
        assert tool_turn["status"] == "completed", tool_turn
        kinds = [i["type"] for i in tool_turn["items"]]
        assert "dynamicToolCall" in kinds
        call = next(i for i in tool_turn["items"] if i["type"] == "dynamicToolCall")
        assert call["tool"] == "lookup" and '"q": "flights"' in call["arguments"]
        assert agent_texts(tool_turn) == ["tool said: tool unavailable in tutti_agent"]
        server.run_turn(tid, "three")
        body = model.requests[-1]
        assert body["stream"] is True and body["model"] == "mock-model"
        assert body["messages"][0] == {"role": "system", "content": "Be brief."}

        # Fork through the tool turn: the child's request holds exactly that prefix.
        turns = server.call("thread/read", {"threadId": tid, "includeTurns": True})
        boundary = turns["thread"]["turns"][1]["id"]
        child = server.call("thread/fork", {"threadId": tid, "lastTurnId": boundary})["thread"]
        server.run_turn(child["id"], "four")
        convo = [
            (r, t)
            for r, t in conversation(model.requests[-1])
            if r != "system" and not t.startswith("<")
        ]
        assert convo == [
            ("user", "one"),
            ("assistant", "echo: one"),
            ("user", "use the tool"),
            ("assistant", "call:lookup"),
            ("tool", "tool unavailable in tutti_agent"),
            ("assistant", "tool said: tool unavailable in tutti_agent"),
            ("user", "four"),
        ]
