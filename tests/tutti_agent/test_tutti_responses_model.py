"""Tutti Agent with `--model-base-url`: the Responses-API client against the local fake
Responses server (the only fake), including the model-visible input after a fork."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from model_fakes.responses import FunctionCall, Reply, ResponsesServer, last_user_text
from tests.tutti_agent.appserver import AppServerProcess, agent_texts
from tests.tutti_agent.scenario import normalized_input
from tutti_agent.rollout import iter_rollout_paths

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


def _calls_and_outputs(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    items = [i for i in body["input"] if isinstance(i, dict)]
    calls = [str(i["call_id"]) for i in items if i.get("type") == "function_call"]
    outputs = [str(i["call_id"]) for i in items if i.get("type") == "function_call_output"]
    return calls, outputs


def test_a_tool_call_a_crash_left_without_its_output_is_answered_aborted(
    tutti_server: Start, tmp_path: Path
) -> None:
    """A rollout cut right after a `function_call` line (the app-server killed before the
    call's output line): the thread's next request gives that call an `aborted` output, right
    after it, as Codex does — the Responses API refuses an input holding a call without its
    output (`No tool output found for function call`), so every later Turn would fail."""

    def reply(body: dict[str, Any]) -> Reply:
        return FunctionCall("shell", '{"cmd": "ls"}') if last_user_text(body) == "one" else "ok"

    with ResponsesServer(reply) as model:
        server = tutti_server(extra_args=["--model-base-url", model.base_url])
        tid = server.start_thread(str(tmp_path))
        assert server.run_turn(tid, "one")["status"] == "completed"
        assert server.close() == 0
        [path] = list(iter_rollout_paths(tmp_path / "tutti-home"))
        lines = path.read_bytes().split(b"\n")
        call = next(i for i, raw in enumerate(lines) if b'"type":"function_call"' in raw)
        path.write_bytes(b"\n".join(lines[: call + 1]) + b"\n")  # the crash's cut
        server = tutti_server(extra_args=["--model-base-url", model.base_url])
        server.call("thread/resume", {"threadId": tid, "excludeTurns": True})
        assert agent_texts(server.run_turn(tid, "two")) == ["ok"]
        for body in model.requests[-1:]:
            calls, outputs = _calls_and_outputs(body)
            assert calls and outputs == calls
            items = body["input"]
            at = next(i for i, it in enumerate(items) if it.get("type") == "function_call")
            assert items[at + 1] == {
                "type": "function_call_output",
                "call_id": calls[0],
                "output": "aborted",
            }
        assert server.run_turn(tid, "three")["status"] == "completed"
        assert _calls_and_outputs(model.requests[-1])[1] == calls  # still answered, once
