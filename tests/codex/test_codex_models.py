"""Codex with a real model's credentials, through the daemon: the key named by
`api_key_env` reaches Codex through its own `env_key` mechanism (never written to config.toml),
turns and a fork run against a fake Responses API that answers 401 without it, the reply streams
as `message.delta` events ahead of the settled Turn, a missing key fails fast as
`model_auth_failed`, and `use_user_login` uses the user's `~/.codex/auth.json` (a fake HOME)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from codex_helpers import codex_bin, conversation

from model_fakes.responses import ResponsesServer
from model_fakes.silent import SilentServer
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.models.streams import assert_streamed, key_leaks, settle_with_events
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline
from tests.support.host_status import status_with_versions
from transport.client import EventSubscriber

pytestmark = [pytest.mark.codex, pytest.mark.timeout(180)]

KEY = "sk-codex-test-4d2e8b7a61"
VAR = "AGENTHOST_TEST_CODEX_KEY"
SENT = {"one", "two", "three", "four"}


def start(home: Path, server: ResponsesServer, extra: str, env: dict[str, str]) -> DaemonProcess:
    home.mkdir(parents=True, exist_ok=True)
    (home / "agenthost.toml").write_text(
        "[providers.codex]\n"
        f'command = "{codex_bin()}"\n'
        'model = "mock-model"\n'
        f'model_base_url = "{server.base_url}"\n' + extra
    )
    return DaemonProcess(home, env=env).start()


def test_codex_turns_fork_and_stream_with_the_key_from_the_daemon_env(tmp_path: Path) -> None:
    with ResponsesServer(api_key=KEY) as model:
        d = start(tmp_path / "home", model, f'api_key_env = "{VAR}"\n', {VAR: KEY})
        replies: list[Any] = []
        try:
            c = d.client()
            cwd = tmp_path / "cwd"
            cwd.mkdir()
            sid = create_session(c, provider="codex", cwd=str(cwd))["agentSessionId"]
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
            assert conversation(model.requests[-1], SENT) == [
                ("user", "one"),
                ("assistant", "echo: one"),
                ("user", "two"),
                ("assistant", "echo: two"),
                ("user", "four"),
            ]
            replies.append(timeline(c, child))
            status = status_with_versions(c)
            replies.append(status)
            line = next(p for p in status["providers"] if p["provider"] == "codex")
            assert line["installed"] is True and line["version"] == "0.171.0"
            assert line["credential"] == {"source": "env", "variable": VAR, "set": True}
            assert model.rejected == 0
        finally:
            d.stop()
        assert key_leaks(KEY, d, replies) == []
        configs = list((d.home / "runtimes").rglob("config.toml"))
        assert configs and all(f'env_key = "{VAR}"' in p.read_text() for p in configs)


@pytest.mark.parametrize("env", [{}, {VAR: "sk-wrong"}], ids=["unset", "wrong"])
def test_codex_without_the_key_fails_fast_as_model_auth_failed(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with ResponsesServer(api_key=KEY) as model:
        d = start(tmp_path / "home", model, f'api_key_env = "{VAR}"\n', env)
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_auth_failed", turn["error"]
            assert "codex" in turn["error"] and model.base_url in turn["error"]
            # In tutti-agent's words: what happened, then where the key came from.
            what = (
                "answered HTTP 401 (credential from ${VAR}, which is set)"
                if env
                else "was not called: the provider has no key to send "
                "(credential from ${VAR}, which is NOT set)"
            ).replace("${VAR}", f"${VAR}")
            assert f"codex model endpoint {model.base_url} {what}" in turn["error"], turn["error"]
        finally:
            d.stop()


def test_codex_without_any_credential_configured_says_so(tmp_path: Path) -> None:
    with ResponsesServer(api_key=KEY) as model:
        d = start(tmp_path / "home", model, "", {})
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["errorReason"] == "model_auth_failed", turn["error"]
            assert (
                f"codex model endpoint {model.base_url} answered HTTP 401 (no credential "
                in (turn["error"])
            ), turn["error"]
            assert "set api_key_env (or use_user_login) in [providers.codex]" in turn["error"]
        finally:
            d.stop()


def test_codex_use_user_login_reads_the_users_auth_json(tmp_path: Path) -> None:
    login_key = "sk-login-from-auth-json-91c3"
    fake_home = tmp_path / "fake-user-home"
    (fake_home / ".codex").mkdir(parents=True)
    auth = fake_home / ".codex" / "auth.json"
    auth.write_text(json.dumps({"OPENAI_API_KEY": login_key, "tokens": None}))
    before = auth.read_bytes()
    with ResponsesServer(api_key=login_key) as model:
        d = start(tmp_path / "home", model, "use_user_login = true\n", {"HOME": str(fake_home)})
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "completed", turn
            status = c.call("host.status", {})
            line = next(p for p in status["providers"] if p["provider"] == "codex")
            assert line["credential"]["source"] == "login"
        finally:
            d.stop()
        assert model.rejected == 0 and model.requests
        assert auth.read_bytes() == before  # the user's file is never written
        store = (d.home / "store.sqlite3").read_bytes()
        assert login_key.encode() not in store


def test_codex_with_an_unreachable_endpoint_fails_as_model_unreachable(tmp_path: Path) -> None:
    with ResponsesServer() as closed:
        pass  # closed now: its port refuses
    d = start(tmp_path / "home", closed, "", {})
    try:
        c = d.client()
        sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
        turn = run_turn(c, sid, "one")
        assert turn["outcome"] == "failed", turn
        assert turn["errorReason"] == "model_unreachable", turn["error"]
        assert closed.base_url in turn["error"]
    finally:
        d.stop()


def test_codex_with_a_silent_endpoint_fails_as_model_timeout_within_the_first_byte_limit(
    tmp_path: Path,
) -> None:
    with SilentServer() as silent:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.codex]\n"
            f'command = "{codex_bin()}"\n'
            'model = "mock-model"\n'
            f'model_base_url = "{silent.base_url}"\n'
            "model_first_byte_seconds = 2\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            turn = run_turn(c, sid, "one")
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            assert silent.base_url in turn["error"] and "codex" in turn["error"]
            assert "2 s" in turn["error"] and "model_first_byte_seconds" in turn["error"]
            # Settled by the configured limit, not Codex's own 300 s stream timeout.
            assert turn["settledAtUnixMs"] - turn["createdAtUnixMs"] < 30_000
            assert silent.accepted >= 1
            # The Session keeps working: the next turn is accepted and settles.
            assert run_turn(c, sid, "two")["phase"] == "settled"
        finally:
            d.stop()


def test_codex_a_stream_that_stalls_is_retried_as_progress_then_fails_as_model_timeout(
    tmp_path: Path,
) -> None:
    gate = threading.Event()  # never set while the turn runs: every reply stalls mid-stream
    with ResponsesServer(gate=gate) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.codex]\n"
            f'command = "{codex_bin()}"\n'
            'model = "mock-model"\n'
            f'model_base_url = "{model.base_url}"\n'
            "model_stream_idle_seconds = 1\n"
            "model_retries = 1\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            with EventSubscriber(d.events, [WS]) as sub:
                turn = run_turn(c, sid, "one")
                progress = []
                while (event := sub.next(0.5)) is not None:
                    if event.get("type") == "message.delta" and event["kind"] == "progress":
                        progress.append(event["delta"])
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            assert "model_stream_idle_seconds" in turn["error"], turn["error"]
            assert progress and progress[0].startswith("codex retries the model request: ")
        finally:
            gate.set()
            d.stop()
