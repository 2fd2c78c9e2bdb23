"""Tutti Agent with `--model-base-url`: the Responses-API client against the local fake
Responses server (the only fake), including the model-visible input after a fork."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from model_fakes.responses import ResponsesServer, last_user_text
from tests.tutti_agent.appserver import AppServerProcess, agent_texts
from tests.tutti_agent.scenario import normalized_input

pytestmark = pytest.mark.timeout(60)

Start = Callable[..., AppServerProcess]


def test_turn_sends_history_as_responses_input_and_streams_reply(
    tutti_server: Start, tmp_path: Path
) -> None:
    with ResponsesServer() as model:
        server = tutti_server(extra_args=["--model-base-url", model.base_url])
        tid = server.start_thread(str(tmp_path))
        assert agent_texts(server.run_turn(tid, "one")) == ["echo: one"]
        assert agent_texts(server.run_turn(tid, "two")) == ["echo: two"]
        body = model.requests[-1]
        assert body["stream"] is True and body["model"] == "mock-model"
        assert normalized_input(body) == ["user: one", "assistant: echo: one", "user: two"]
        # The environment context rides along, model-visible but not a user turn.
        assert body["input"][0]["content"][0]["text"].startswith("<environment_context>")


def test_child_next_turn_sees_only_history_through_the_fork_turn(
    tutti_server: Start, tmp_path: Path
) -> None:
    with ResponsesServer() as model:
        server = tutti_server(extra_args=["--model-base-url", model.base_url])
        src = server.start_thread(str(tmp_path))
        ids = [server.run_turn(src, t)["id"] for t in ("one", "two", "three")]
        for persistence in ("copied", "referenced"):
            child = server.call(
                "thread/fork",
                {"threadId": src, "lastTurnId": ids[1], "persistence": persistence},
            )["thread"]
            server.run_turn(child["id"], "four")
            assert normalized_input(model.requests[-1]) == [
                "user: one",
                "assistant: echo: one",
                "user: two",
                "assistant: echo: two",
                "user: four",
            ]


def test_env_var_selects_the_responses_client(tmp_path: Path, tutti_server: Start) -> None:
    with ResponsesServer(lambda body: f"from env: {last_user_text(body)}") as model:
        server = tutti_server(env={"TUTTI_AGENT_MODEL_BASE_URL": model.base_url})
        tid = server.start_thread(str(tmp_path))
        assert agent_texts(server.run_turn(tid, "x")) == ["from env: x"]


def test_unreachable_model_server_fails_the_turn(tutti_server: Start, tmp_path: Path) -> None:
    with ResponsesServer() as model:
        url = model.base_url
    server = tutti_server(extra_args=["--model-base-url", url])  # the server is closed now
    tid = server.start_thread(str(tmp_path))
    turn = server.run_turn(tid, "hello")
    assert turn["status"] == "failed"
    # Fails fast, typed, naming the endpoint and the cause.
    assert turn["error"]["message"].startswith("model_unreachable: tutti-agent model endpoint ")
    assert url in turn["error"]["message"]
    assert server.run_turn(tid, "again")["status"] == "failed"


def test_interrupt_during_model_response_interrupts_the_turn(
    tutti_server: Start, tmp_path: Path
) -> None:
    arrived, release = threading.Event(), threading.Event()

    def reply(body: dict[str, Any]) -> str:
        arrived.set()
        release.wait(30)
        return "late"

    with ResponsesServer(reply) as model:
        server = tutti_server(extra_args=["--model-base-url", model.base_url])
        tid = server.start_thread(str(tmp_path))
        turn_id = server.start_turn(tid, "hold")
        assert arrived.wait(30)
        server.call("turn/interrupt", {"threadId": tid, "turnId": turn_id})
        turn = server.wait_turn_completed(turn_id)
        release.set()
        assert turn["status"] == "interrupted" and agent_texts(turn) == []
