"""The host's model backstops with Claude Code, through the real daemon and the real CLI against
the fake Messages API: a reply that stalls mid-stream fails `model_timeout` (stream idle) when
the CLI does not end it itself (a CLI whose own stream-idle limit is far above the host's, as a
provider that ignores the setting would be), and a model that answers 503 for longer than the
first-byte limit fails `model_timeout` (first byte) although the CLI's retry notes stream to
the client meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from model_fakes.messages import (
    MessagesServer,
    Reply,
    ToolUse,
    last_user_text,
    tool_result,
    tool_result_text,
)
from tests.models.streams import settle_with_events
from tests.support.daemon import DaemonProcess, create_session, respond, settle, submit, turn_of

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]

KEY = "sk-ant-test-backstops-1a2b"


def _cli_ignoring_its_stream_limit(tmp_path: Path) -> Path:
    """The bundled CLI, started with its own stream-idle limit at ten minutes whatever the
    driver sets."""
    import claude_agent_sdk

    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    wrapper = tmp_path / "claude-ignoring-stream-idle"
    wrapper.write_text(
        f'#!/bin/sh\nexport CLAUDE_STREAM_IDLE_TIMEOUT_MS=600000\nexec "{bundled}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _start(home: Path, base_url: str, keys: str) -> DaemonProcess:
    home.mkdir(parents=True)
    (home / "agenthost.toml").write_text(
        f'[providers.claude-code]\nmodel_base_url = "{base_url}"\n' + keys
    )
    return DaemonProcess(home, env={"ANTHROPIC_API_KEY": KEY}).start()


def test_a_reply_that_stalls_mid_stream_fails_model_timeout_by_the_host(tmp_path: Path) -> None:
    gate = threading.Event()  # never set while the turn runs: the reply stalls after a delta
    with MessagesServer(gate=gate) as model:
        cli = _cli_ignoring_its_stream_limit(tmp_path)
        d = _start(
            tmp_path / "home",
            model.base_url,
            f'cli_path = "{cli}"\nmodel_stream_idle_seconds = 1\n',
        )
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            started = time.monotonic()
            turn, deltas = settle_with_events(d, c, sid, "one two three four five six", 60)
            took = time.monotonic() - started
            assert [e for e in deltas if e["kind"] == "assistant"], deltas  # it began
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            error = turn["error"]
            assert "claude-code" in error and model.base_url in error, error
            assert "1 s" in error and "model_stream_idle_seconds" in error, error
            assert "in the middle of its reply" in error, error
            assert "agenthost stopped the provider's runtime" in error, error  # the host's
            assert took < 40, took  # the limit and the host's grace, not the CLI's 600 s
            gate.set()  # the Session works again once the model does
            again, _ = settle_with_events(d, c, sid, "again", 60)
            assert again["outcome"] == "completed", again
        finally:
            gate.set()
            d.stop()


def test_retries_of_a_503_are_progress_not_the_first_byte(tmp_path: Path) -> None:
    """The CLI retries the 503s on its own (`model_retries`), each retry an `api_retry` shown
    as a `progress` note; none is the model answering, so the host's first-byte backstop still
    ends the Turn at `model_first_byte_seconds` × (1 + retries) + its grace, long before the
    CLI's backoff (0.5 s doubling, 31 s for six retries) gives up."""
    with MessagesServer(fail_status=503) as model:
        d = _start(
            tmp_path / "home",
            model.base_url,
            "model_first_byte_seconds = 0.5\nmodel_retries = 6\n",
        )
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            started = time.monotonic()
            turn, deltas = settle_with_events(d, c, sid, "one", 60)
            took = time.monotonic() - started
            attempts = sum(1 for p in model.paths if p.endswith(" 503"))
            notes = [e["delta"] for e in deltas if e["kind"] == "progress"]
            assert notes and notes[0].startswith("claude-code retries the model request"), deltas
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            error = turn["error"]
            assert "claude-code" in error and model.base_url in error, error
            assert "3.5 s" in error and "model_first_byte_seconds" in error, error
            # The budget and the grace ended it, not the CLI's 31 s of retries: the CLI had not
            # made all its 1 + 6 attempts (counted, not timed: a loaded machine stretches both).
            assert attempts < 7, (attempts, took, model.paths)
            model.fail_status = None  # the Session works again once the model does
            again, _ = settle_with_events(d, c, sid, "again", 60)
            assert again["outcome"] == "completed", again
        finally:
            d.stop()


def _says_then_runs(body: dict[str, Any]) -> Reply:
    """A sentence streamed, then a Bash call that sleeps 4 s and writes a file (which needs an
    approval); its result → `ran: …`."""
    result = tool_result(body)
    if result is not None:
        return f"ran: {tool_result_text(result)}"
    if last_user_text(body) != "run it":
        return "echo"  # the CLI's requests of its own
    command = {"command": "sleep 4; echo slept > slept.txt; cat slept.txt", "description": "wait"}
    return ToolUse("Bash", command, preface="I will run the command now.")


def test_a_long_approval_and_a_long_command_are_not_a_stalled_stream(tmp_path: Path) -> None:
    """The model streams a sentence, then calls Bash, which needs an approval: the approval
    waits, then the command runs, each longer than the stream-idle limit and the host's grace
    (1 s + 2 s). Neither is the model stalling mid-reply: the Turn completes."""
    with MessagesServer(reply=_says_then_runs) as model:
        d = _start(tmp_path / "home", model.base_url, "model_stream_idle_seconds = 1\n")
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(tmp_path))["agentSessionId"]
            turn = submit(c, sid, "run it")["turnId"]
            deadline = time.monotonic() + 60
            while not (asked := turn_of(c, sid, turn)["interactions"]):
                assert time.monotonic() < deadline, turn_of(c, sid, turn)
                time.sleep(0.1)
            time.sleep(4)  # the user takes a while to answer
            assert turn_of(c, sid, turn)["phase"] == "active"
            respond(c, sid, turn, asked[0]["requestId"], {"decision": "approve"})
            done = settle(c, sid, turn, timeout=60)
            assert done["outcome"] == "completed", done
            texts = [m["text"] for m in done["messages"] if m["kind"] == "assistant"]
            assert texts[0] == "I will run the command now.", texts
            assert "slept" in texts[-1], texts
        finally:
            d.stop()
