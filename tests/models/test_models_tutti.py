"""Real models through the daemon with tutti-agent: fake model servers on 127.0.0.1
that require the key (401 without), the key taken from the daemon's environment by name, the
Responses and Chat Completions wire APIs, a fork whose child request holds exactly the prefix,
typed fail-fast errors, `message.delta` events ahead of the settled Turn, the per-Session model,
`provider_not_installed`, the provider lines of `host.status`, the 0600 rule for an in-file key,
and the key's bytes absent from the store, the provider homes, the daemon log and every reply."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_fakes.chat import ChatServer, ToolCall, conversation
from model_fakes.http import FakeModelServer
from model_fakes.responses import ResponsesServer
from model_fakes.silent import SilentServer
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.models.streams import assert_streamed, key_leaks, settle_with_events
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline
from tests.support.host_status import status_with_versions
from tests.tutti_agent.scenario import normalized_input
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)

KEY = "sk-agenthost-test-7f3a9c1e5b"
VAR = "AGENTHOST_TEST_MODEL_KEY"


def start_daemon(
    home: Path, table: str, *, key: str | None = KEY, extra_env: dict[str, str] | None = None
) -> DaemonProcess:
    home.mkdir(parents=True, exist_ok=True)
    (home / "agenthost.toml").write_text(table)
    env = {VAR: key} if key is not None else {}
    env.update(extra_env or {})
    # A key the test does not mean to give must not leak in from the developer's shell.
    return DaemonProcess(home, env=env).start()


def tutti_table(server: FakeModelServer[Any], base_url: str, wire: str) -> str:
    return (
        "[providers.tutti-agent]\n"
        f'model_base_url = "{base_url}"\n'
        f'wire_api = "{wire}"\n'
        f'api_key_env = "{VAR}"\n'
    )


@pytest.fixture(params=["responses", "chat"])
def wire(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def model(wire: str) -> Iterator[FakeModelServer[Any]]:
    cls = ChatServer if wire == "chat" else ResponsesServer
    with cls(api_key=KEY) as server:
        yield server


def user_and_assistant(body: dict[str, Any], wire: str) -> list[str]:
    if wire == "responses":
        return normalized_input(body)
    return [
        f"{r}: {t}"
        for r, t in conversation(body)
        if r in ("user", "assistant") and not t.startswith("<")
    ]


def test_turns_fork_and_stream_with_the_key_from_the_daemon_env(
    tmp_path: Path, model: FakeModelServer[Any], wire: str
) -> None:
    d = start_daemon(tmp_path / "home", tutti_table(model, model.base_url, wire))  # type: ignore[attr-defined]
    replies: list[Any] = []
    try:
        c = d.client()
        created = create_session(c, title="real", model="session-model")
        replies.append(created)
        sid = created["agentSessionId"]
        assert created["model"] == "session-model"
        turns = []
        for text in ("one", "two", "three"):
            turn, deltas = settle_with_events(d, c, sid, text)
            assert turn["outcome"] == "completed", turn
            assert_streamed(turn, deltas)
            turns.append(turn)
            replies.append(turn)
        # The per-Session model is the one the endpoint was asked for.
        assert model.requests[-1]["model"] == "session-model"

        _, op = fork(c, sid, turns[1]["turnId"])
        op = until_terminal(c, op)
        assert op["status"] == "committed", op
        replies.append(op)
        child = op["session"]["agentSessionId"]
        replies.append(run_turn(c, child, "four"))
        assert user_and_assistant(model.requests[-1], wire) == [
            "user: one",
            "assistant: echo: one",
            "user: two",
            "assistant: echo: two",
            "user: four",
        ]
        assert model.requests[-1]["model"] == "session-model"  # the child keeps it
        replies.append(timeline(c, sid))
        replies.append(timeline(c, child))
        status = status_with_versions(c)
        replies.append(status)
        line = next(p for p in status["providers"] if p["provider"] == "tutti-agent")
        assert line["installed"] is True and line["version"]
        assert line["endpoint"] == model.base_url  # type: ignore[attr-defined]
        assert line["wireApi"] == wire
        assert line["credential"] == {"source": "env", "variable": VAR, "set": True}
        assert model.rejected == 0
    finally:
        d.stop()
    assert key_leaks(KEY, d, replies) == []


def test_without_the_key_a_turn_fails_fast_as_model_auth_failed(
    tmp_path: Path, model: FakeModelServer[Any], wire: str
) -> None:
    d = start_daemon(tmp_path / "home", tutti_table(model, model.base_url, wire), key=None)  # type: ignore[attr-defined]
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, "one")
        assert turn["outcome"] == "failed"
        assert turn["errorReason"] == "model_auth_failed"
        assert "tutti-agent" in turn["error"] and model.base_url in turn["error"]  # type: ignore[attr-defined]
        assert "401" in turn["error"] and VAR in turn["error"]
        status = c.call("host.status", {})
        line = next(p for p in status["providers"] if p["provider"] == "tutti-agent")
        assert line["credential"] == {"source": "env", "variable": VAR, "set": False}
        # The daemon keeps serving.
        assert c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    finally:
        d.stop()


def test_an_unreachable_endpoint_fails_as_model_unreachable(tmp_path: Path) -> None:
    with ResponsesServer() as closed:
        url = closed.base_url
    d = start_daemon(tmp_path / "home", f'[providers.tutti-agent]\nmodel_base_url = "{url}"\n')
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, "one")
        assert turn["outcome"] == "failed"
        assert turn["errorReason"] == "model_unreachable"
        assert url in turn["error"] and "tutti-agent" in turn["error"]
    finally:
        d.stop()


@pytest.mark.parametrize("wire_api", ["responses", "chat"])
def test_a_silent_endpoint_fails_the_turn_as_model_timeout_within_the_first_byte_limit(
    tmp_path: Path, wire_api: str
) -> None:
    with SilentServer() as silent:
        d = start_daemon(
            tmp_path / "home",
            "[providers.tutti-agent]\n"
            f'model_base_url = "{silent.base_url}"\n'
            f'wire_api = "{wire_api}"\n'
            "model_first_byte_seconds = 1.5\n",
        )
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            assert silent.base_url in turn["error"] and "tutti-agent" in turn["error"]
            assert "1.5 s" in turn["error"] and "model_first_byte_seconds" in turn["error"]
            # Settled by the configured limit, not by a generic 300 s read timeout.
            assert turn["settledAtUnixMs"] - turn["createdAtUnixMs"] < 30_000
            assert silent.accepted == 1
            # The daemon keeps serving.
            assert c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        finally:
            d.stop()


def test_a_retry_of_a_silent_endpoint_is_shown_as_progress(tmp_path: Path) -> None:
    with SilentServer() as silent:
        d = start_daemon(
            tmp_path / "home",
            "[providers.tutti-agent]\n"
            f'model_base_url = "{silent.base_url}"\n'
            "model_first_byte_seconds = 1\n"
            "model_retries = 1\n",
        )
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            turn, deltas = settle_with_events(d, c, sid, "one")
            assert turn["errorReason"] == "model_timeout", turn["error"]
            assert (
                "sent nothing within 1 s of the request (model_first_byte_seconds, 2 attempts)"
                in (turn["error"])
            )
            notes = [e["delta"] for e in deltas if e["kind"] == "progress"]
            assert notes == [
                "tutti-agent retries the model request: "
                f"{silent.base_url}/responses sent nothing within 1 s (attempt 1 of 2)"
            ], deltas
            assert silent.accepted == 2
        finally:
            d.stop()


def test_a_provider_that_is_not_installed_fails_session_create(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-tutti-agent"
    d = start_daemon(tmp_path / "home", f'[providers.tutti-agent]\ncommand = "{missing}"\n')
    try:
        c = d.client()
        with pytest.raises(ApiError) as err:
            c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})
        assert err.value.status == 409
        assert err.value.reason == "provider_not_installed"
        assert str(missing) in err.value.message
        status = c.call("host.status", {})
        line = next(p for p in status["providers"] if p["provider"] == "tutti-agent")
        assert line["installed"] is False and line["version"] is None
    finally:
        d.stop()


def test_a_key_in_the_file_needs_mode_0600(tmp_path: Path) -> None:
    with ResponsesServer(api_key=KEY) as model:
        home = tmp_path / "home"
        table = f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\napi_key = "{KEY}"\n'
        home.mkdir()
        (home / "agenthost.toml").write_text(table)
        os.chmod(home / "agenthost.toml", 0o644)
        with pytest.raises(RuntimeError) as err:
            DaemonProcess(home).start()
        assert "must be 0600" in str(err.value)
        assert KEY not in str(err.value)

        os.chmod(home / "agenthost.toml", 0o600)
        d = DaemonProcess(home).start()
        replies: list[Any] = []
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            turn = run_turn(c, sid, "one")
            replies.append(turn)
            assert turn["outcome"] == "completed", turn
            status = c.call("host.status", {})
            replies.append(status)
            line = next(p for p in status["providers"] if p["provider"] == "tutti-agent")
            assert line["credential"] == {"source": "file", "variable": None, "set": True}
        finally:
            d.stop()
        assert key_leaks(KEY, d, replies, skip=[home / "agenthost.toml"]) == []


def test_session_create_rejects_a_bad_model(tmp_path: Path) -> None:
    d = start_daemon(tmp_path / "home", "")
    try:
        c: Client = d.client()
        with pytest.raises(ApiError) as err:
            c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent", "model": 7})
        assert err.value.status == 400
    finally:
        d.stop()


def test_chat_tool_call_and_fork_through_it_via_the_daemon(tmp_path: Path) -> None:
    """wire_api = "chat" through the daemon: a tool call is a Turn's tool messages, and a fork
    through that Turn sends the child's model exactly the prefix, tool call included."""

    def reply(body: dict[str, Any]) -> str | ToolCall:
        convo = conversation(body)
        if convo[-1] == ("user", "use the tool"):
            return ToolCall("lookup", {"q": "flights"})
        if convo[-1][0] == "tool":
            return f"tool said: {convo[-1][1]}"
        return f"echo: {convo[-1][1]}"

    with ChatServer(reply, api_key=KEY) as model:
        d = start_daemon(tmp_path / "home", tutti_table(model, model.base_url, "chat"))
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            assert run_turn(c, sid, "one")["outcome"] == "completed"
            tool_turn = run_turn(c, sid, "use the tool")
            assert tool_turn["outcome"] == "completed", tool_turn
            kinds = [m["kind"] for m in tool_turn["messages"]]
            assert "tool_call" in kinds and "tool_result" in kinds
            assert tool_turn["messages"][-1]["text"] == (
                "tool said: tool unavailable in tutti_agent"
            )
            assert run_turn(c, sid, "three")["outcome"] == "completed"
            _, op = fork(c, sid, tool_turn["turnId"])
            op = until_terminal(c, op)
            assert op["status"] == "committed", op
            assert run_turn(c, op["session"]["agentSessionId"], "four")["outcome"] == "completed"
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
        finally:
            d.stop()


def test_a_long_streaming_reply_is_not_taken_for_a_hung_provider(tmp_path: Path) -> None:
    """The inactivity watchdog counts streamed deltas as activity: a reply that
    drips for longer than `turn_inactivity_seconds` completes."""
    # 30 deltas, 0.3 s apart: about 9 s of streaming, no item until the end — more than twice
    # the limit, while the limit is generous for the app-server's start on a loaded machine.
    text = "x" * 120
    with ResponsesServer(lambda body: text, drip_s=0.3) as model:
        d = start_daemon(
            tmp_path / "home",
            f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\n'
            "[daemon]\nturn_inactivity_seconds = 4\n",
        )
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "completed", turn
            assert turn["messages"][-1]["text"] == text
        finally:
            d.stop()
