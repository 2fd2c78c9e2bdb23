"""Smoke tests that pin the fake model servers against the REAL Codex app-server and Claude CLI.

If a provider is missing these tests fail (never skip): the fakes are only trustworthy while
the real programs accept them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from model_fakes.messages import MessagesServer
from model_fakes.messages import last_user_text as messages_last_user_text
from model_fakes.messages import model_input_texts as messages_input_texts
from model_fakes.responses import ResponsesServer
from model_fakes.responses import last_user_text as responses_last_user_text
from model_fakes.responses import model_input_texts as responses_input_texts

REPO = Path(__file__).resolve().parents[2]
CODEX_NATIVE = (
    REPO
    / "build/providers/codex/node_modules/@openai/codex-linux-x64/vendor"
    / "x86_64-unknown-linux-musl/bin/codex"
)


def codex_binary() -> str:
    if CODEX_NATIVE.exists():
        return str(CODEX_NATIVE)
    env_bin = os.environ.get("AGENTHOST_CODEX_BIN")
    if env_bin and Path(env_bin).exists():
        return env_bin
    pytest.fail(f"Codex 0.171.0 is not installed at {CODEX_NATIVE} (run `make providers`)")


def write_codex_config(codex_home: Path, base_url: str) -> None:
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f"""model = "mock-model"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "read-only"
[model_providers.mock]
name = "Mock Responses"
base_url = "{base_url}"
wire_api = "responses"
requires_openai_auth = false
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
[features]
plugins = false
shell_snapshot = false
[analytics]
enabled = false
"""
    )


class AppServer:
    """Minimal newline-JSON client for `codex app-server` (no "jsonrpc" field)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=True,
        )
        self._next = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next += 1
        rid = self._next
        self.send({"id": rid, "method": method, "params": params})
        msg = self.wait_for(lambda m: m.get("id") == rid and "method" not in m)
        assert "error" not in msg, msg
        return dict(msg["result"])

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, pred: Any) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, "codex app-server closed stdout"
            msg = json.loads(line)
            if pred(msg):
                return dict(msg)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.codex
@pytest.mark.timeout(60)
def test_real_codex_turn_completes_against_responses_server(tmp_path: Path) -> None:
    with ResponsesServer() as srv:
        home = tmp_path / "home"
        home.mkdir()
        codex_home = tmp_path / "codex-home"
        write_codex_config(codex_home, srv.base_url)
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(codex_home)}
        app = AppServer([codex_binary(), "app-server"], env, cwd)
        try:
            init = app.request(
                "initialize",
                {
                    "clientInfo": {"name": "agenthost-test", "title": "t", "version": "0"},
                    "capabilities": {"experimentalApi": True},
                },
            )
            assert init["userAgent"].split("/", 1)[1].startswith("0.171.0")
            app.send({"method": "initialized"})
            thread_id = app.request("thread/start", {"cwd": str(cwd)})["thread"]["id"]
            for text in ("first question", "second question"):
                started = app.request(
                    "turn/start",
                    {
                        "threadId": thread_id,
                        "input": [{"type": "text", "text": text, "text_elements": []}],
                    },
                )
                turn_id = started["turn"]["id"]
                done = app.wait_for(
                    lambda m, tid=turn_id: (
                        m.get("method") == "turn/completed" and m["params"]["turn"]["id"] == tid
                    )
                )
                turn = done["params"]["turn"]
                assert turn["status"] == "completed", turn
                replies = [i.get("text") for i in turn["items"] if i.get("type") == "agentMessage"]
                assert replies == [f"echo: {text}"]
        finally:
            app.close()
        bodies = srv.requests
        assert len(bodies) == 2
        assert all(b.get("stream") is True for b in bodies)
        assert responses_last_user_text(bodies[1]) == "second question"
        convo = [(r, t) for r, t in responses_input_texts(bodies[1]) if r in ("user", "assistant")]
        assert convo[-3:] == [
            ("user", "first question"),
            ("assistant", "echo: first question"),
            ("user", "second question"),
        ]


def claude_env(tmp_path: Path, base_url: str) -> dict[str, str]:
    home = tmp_path / "home"
    config = tmp_path / "claude-config"
    home.mkdir()
    config.mkdir()
    return {
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(config),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "dummy",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


@pytest.mark.claude
@pytest.mark.timeout(90)
def test_real_claude_cli_turns_complete_against_messages_server(tmp_path: Path) -> None:
    try:
        from claude_agent_sdk import (
            AssistantMessage,
            ClaudeAgentOptions,
            ResultMessage,
            TextBlock,
            query,
        )
    except ImportError as exc:  # must fail, not skip: the provider is part of the suite
        pytest.fail(f"claude-agent-sdk==0.2.189 is not installed: {exc}")

    cwd = tmp_path / "cwd"
    cwd.mkdir()

    async def run_turn(env: dict[str, str], prompt: str, resume: str | None) -> tuple[str, str]:
        texts: list[str] = []
        session_id = ""
        options = ClaudeAgentOptions(cwd=str(cwd), env=env, resume=resume, setting_sources=[])
        async for msg in query(prompt=prompt, options=options):
            if isinstance(msg, AssistantMessage):
                texts.extend(b.text for b in msg.content if isinstance(b, TextBlock))
            elif isinstance(msg, ResultMessage):
                assert not msg.is_error, msg
                session_id = msg.session_id
        return "".join(texts), session_id

    with MessagesServer() as srv:
        env = claude_env(tmp_path, srv.base_url)
        reply1, sid = asyncio.run(run_turn(env, "first question", None))
        reply2, sid2 = asyncio.run(run_turn(env, "second question", sid))
        bodies = srv.requests
    assert reply1 == "echo: first question"
    assert reply2 == "echo: second question"
    assert sid2 == sid  # a resumed session keeps its id
    assert len(bodies) == 2
    assert all(b.get("stream") is True for b in bodies)
    assert messages_last_user_text(bodies[1]) == "second question"
    assert messages_input_texts(bodies[1]) == [
        ("user", "first question"),
        ("assistant", "echo: first question"),
        ("user", "second question"),
    ]
    transcript = next((tmp_path / "claude-config" / "projects").glob(f"*/{sid}.jsonl"))
    assert transcript.exists()


@pytest.mark.timeout(30)
def test_model_servers_answer_models_probe_and_stop_listening_on_close() -> None:
    for server_cls, models_url in (
        (ResponsesServer, "{base}/models"),
        (MessagesServer, "{base}/v1/models"),
    ):
        srv = server_cls()
        with srv:
            url = models_url.format(base=srv.base_url)
            with urllib.request.urlopen(url, timeout=5) as resp:
                assert resp.status == 200
                assert json.load(resp)["data"]
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)
