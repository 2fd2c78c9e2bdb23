"""Claude Code with a real model's credentials, through the daemon: the key taken from
the daemon's own `ANTHROPIC_API_KEY` passes through untouched (no "dummy" over it) to a fake
Messages API that answers 401 without it; turns and a fork run; the reply streams as
`message.delta` events (include_partial_messages) ahead of the settled Turn; a missing key fails
fast as `model_auth_failed`; `use_user_login` uses the user's `~/.claude/.credentials.json` (a
fake HOME); the key's bytes appear nowhere the daemon writes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from model_fakes.messages import MessagesServer, model_input_texts
from model_fakes.silent import SilentServer
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.models.streams import assert_streamed, key_leaks, settle_with_events
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline
from tests.support.host_status import status_with_versions

pytestmark = [pytest.mark.claude, pytest.mark.timeout(180)]

KEY = "sk-ant-test-0c9b8a7d6e5f"


def start(home: Path, server: MessagesServer, extra: str, env: dict[str, str]) -> DaemonProcess:
    home.mkdir(parents=True, exist_ok=True)
    (home / "agenthost.toml").write_text(
        f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n' + extra
    )
    # Whatever the developer's shell exports, the test decides whether the daemon has a key.
    env.setdefault("ANTHROPIC_API_KEY", "")
    return DaemonProcess(home, env=env).start()


def test_claude_turns_fork_and_stream_with_the_key_from_the_daemon_env(tmp_path: Path) -> None:
    with MessagesServer(api_key=KEY) as model:
        d = start(tmp_path / "home", model, "", {"ANTHROPIC_API_KEY": KEY})
        replies: list[Any] = []
        try:
            c = d.client()
            cwd = tmp_path / "cwd"
            cwd.mkdir()
            sid = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
            turns = []
            for text in ("one", "two", "three"):
                turn, deltas = settle_with_events(d, c, sid, text)
                assert turn["outcome"] == "completed", turn
                assert_streamed(turn, deltas)
                turns.append(turn)
            replies.extend(turns)
            _, op = fork(c, sid, turns[1]["turnId"])
            op = until_terminal(c, op)
            assert op["status"] == "committed", op
            replies.append(op)
            child = op["session"]["agentSessionId"]
            replies.append(run_turn(c, child, "four"))
            assert model_input_texts(model.requests[-1]) == [
                ("user", "one"),
                ("assistant", "echo: one"),
                ("user", "two"),
                ("assistant", "echo: two"),
                ("user", "four"),
            ]
            replies.append(timeline(c, child))
            status = status_with_versions(c)
            replies.append(status)
            line = next(p for p in status["providers"] if p["provider"] == "claude-code")
            assert line["installed"] is True and line["version"]
            assert line["credential"] == {
                "source": "env",
                "variable": "ANTHROPIC_API_KEY",
                "set": True,
            }
            assert model.rejected == 0
        finally:
            d.stop()
        assert key_leaks(KEY, d, replies) == []


def test_claude_without_the_key_fails_fast_as_model_auth_failed(tmp_path: Path) -> None:
    with MessagesServer(api_key=KEY) as model:
        d = start(tmp_path / "home", model, "", {})
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_auth_failed", turn["error"]
            assert "claude-code" in turn["error"] and model.base_url in turn["error"]
            # In tutti-agent's words, never the SDK's raw JSON.
            assert (
                f"claude-code model endpoint {model.base_url} refused the key "
                "(credential from $ANTHROPIC_API_KEY, which is NOT set)"
            ) in turn["error"], turn["error"]
            assert "{" not in turn["error"], turn["error"]
        finally:
            d.stop()


def test_claude_use_user_login_reads_the_users_credentials(tmp_path: Path) -> None:
    token = "sk-ant-oat01-login-token-5e4d"
    fake_home = tmp_path / "fake-user-home"
    (fake_home / ".claude").mkdir(parents=True)
    creds = fake_home / ".claude" / ".credentials.json"
    creds.write_text(
        json.dumps(
            {
                "claudeAiOauth": {
                    "accessToken": token,
                    "refreshToken": "rt-unused",
                    "expiresAt": int((time.time() + 86400) * 1000),
                    "scopes": ["user:inference", "user:profile"],
                    "subscriptionType": "pro",
                }
            }
        )
    )
    before = creds.read_bytes()
    with MessagesServer(api_key=token) as model:
        d = start(tmp_path / "home", model, "use_user_login = true\n", {"HOME": str(fake_home)})
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "completed", (turn, model.paths)
        finally:
            d.stop()
        assert model.rejected == 0 and model.requests
        assert creds.read_bytes() == before  # the user's file is never written
        assert token.encode() not in (d.home / "store.sqlite3").read_bytes()


def test_claude_with_an_unreachable_endpoint_fails_as_model_unreachable(tmp_path: Path) -> None:
    with MessagesServer() as closed:
        pass  # closed now: its port refuses
    d = start(tmp_path / "home", closed, "", {"ANTHROPIC_API_KEY": KEY})
    try:
        c = d.client()
        sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
        turn = run_turn(c, sid, "one")
        assert turn["outcome"] == "failed", turn
        assert turn["errorReason"] == "model_unreachable", turn["error"]
        assert f"claude-code model endpoint {closed.base_url} is unreachable: " in turn["error"]
        assert "{" not in turn["error"], turn["error"]  # words, not the SDK's retry JSON
    finally:
        d.stop()
    assert key_leaks(KEY, d, []) == []


def test_claude_with_a_silent_endpoint_fails_as_model_timeout_within_the_first_byte_limit(
    tmp_path: Path,
) -> None:
    # The CLI's API_TIMEOUT_MS ends the wait at the configured limit (its first-byte watchdog
    # alone would not go below 10 s); the driver names the cause in our words.
    first_byte = 2
    with SilentServer(path="") as silent:
        d = start(
            tmp_path / "home",
            silent,  # type: ignore[arg-type]
            f"model_first_byte_seconds = {first_byte}\n",
            {"ANTHROPIC_API_KEY": KEY},
        )
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            assert silent.base_url in turn["error"] and "claude-code" in turn["error"]
            assert f"{first_byte} s" in turn["error"], turn["error"]
            assert "model_first_byte_seconds" in turn["error"]
            assert turn["settledAtUnixMs"] - turn["createdAtUnixMs"] < (first_byte + 20) * 1000
            assert silent.accepted >= 1
            # The CLI's own "Request timed out… set API_TIMEOUT_MS" is no assistant reply.
            assert [m["kind"] for m in turn["messages"]] == ["user"], turn["messages"]
        finally:
            d.stop()
        assert key_leaks(KEY, d, []) == []


def test_claude_retries_of_a_silent_endpoint_show_as_progress_in_say(tmp_path: Path) -> None:
    # One retry of its own (`model_retries = 1`): `say` prints it as it happens, then the
    # Turn fails model_timeout after both attempts.
    with SilentServer(path="") as silent:
        d = start(
            tmp_path / "home",
            silent,  # type: ignore[arg-type]
            "model_first_byte_seconds = 2\nmodel_retries = 1\n",
            {"ANTHROPIC_API_KEY": KEY},
        )
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            argv = [sys.executable, "-m", "agenthost.cli", "--home", str(d.home)]
            say = subprocess.run(
                [*argv, "--workspace", WS, "say", sid, "one"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert say.returncode == 1, (say.stdout, say.stderr)
            assert "progress: claude-code retries the model request (attempt 1 of 1)" in (
                say.stdout
            ), say.stdout
            assert "turn_failed: model_timeout: claude-code model endpoint" in say.stderr
            assert "sent nothing within 4 s of the request" in say.stderr, say.stderr
            assert silent.accepted >= 2
        finally:
            d.stop()
