"""The host's model backstops with Codex, through the real daemon and the real Codex against the
fake Responses API: a reply that stalls mid-stream fails `model_timeout` (stream idle) when Codex
does not end it itself (its own `stream_idle_timeout_ms` overridden far above the host's limit,
as a provider that ignores the setting would), and a model that answers 5xx for longer than the
first-byte limit fails `model_timeout` (first byte) although Codex's retry notes stream to the
client meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from codex_helpers import codex_bin
from tool_model import ToolModel

from model_fakes.responses import ResponsesServer
from tests.models.streams import settle_with_events
from tests.support.daemon import DaemonProcess, create_session, respond, settle, submit, turn_of

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]

# Codex's own stream limit, far above the host's: only the host's backstop can end the stall.
IGNORED_IDLE = "-c model_providers.agenthost.stream_idle_timeout_ms=600000"


def _start(home: Path, base_url: str, keys: str, command: str | None = None) -> DaemonProcess:
    home.mkdir(parents=True)
    (home / "agenthost.toml").write_text(
        "[providers.codex]\n"
        f'command = "{command or codex_bin()}"\n'
        'model = "mock-model"\n'
        f'model_base_url = "{base_url}"\n' + keys
    )
    return DaemonProcess(home).start()


def test_a_reply_that_stalls_mid_stream_fails_model_timeout_by_the_host(tmp_path: Path) -> None:
    gate = threading.Event()  # never set while the turn runs: the reply stalls after a delta
    with ResponsesServer(gate=gate, hold_after=3) as model:
        d = _start(
            tmp_path / "home",
            model.base_url,
            "model_stream_idle_seconds = 1\n",
            f"{codex_bin()} {IGNORED_IDLE}",
        )
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            started = time.monotonic()
            turn, deltas = settle_with_events(d, c, sid, "one two three four five six", 60)
            took = time.monotonic() - started
            assert [e["kind"] for e in deltas if e["kind"] != "progress"], deltas  # it began
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            error = turn["error"]
            assert "codex" in error and model.base_url in error, error
            assert "1 s" in error and "model_stream_idle_seconds" in error, error
            assert "in the middle of its reply" in error, error
            assert "agenthost stopped the provider's runtime" in error, error  # the host's
            # The limit and the host's grace (2 s) after the last delta, not Codex's 600 s.
            assert took < 30, took
            gate.set()  # the Session works again once the model does
            again, _ = settle_with_events(d, c, sid, "again", 60)
            assert again["outcome"] == "completed", again
        finally:
            gate.set()
            d.stop()


def test_retries_before_the_first_byte_are_progress_not_an_answer(tmp_path: Path) -> None:
    """Every stream opens and sends nothing: Codex gives up on each after its own stream limit
    and retries on its own (`model_retries`), each retry a `progress` note on the events socket.
    None is the model answering, so the host's first-byte backstop still ends the Turn at
    `model_first_byte_seconds` × (1 + retries) + its grace, long before Codex's retries and
    their backoff run out (about 16 s here). (Codex retries an HTTP 5xx answer without a word
    to its client, so there is no note to show for those.)"""
    gate = threading.Event()  # never set while the turn runs: no stream sends an event
    with ResponsesServer(gate=gate, hold_after=0) as model:
        d = _start(
            tmp_path / "home",
            model.base_url,
            "model_first_byte_seconds = 0.5\nmodel_stream_idle_seconds = 0.5\nmodel_retries = 6\n",
        )
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            started = time.monotonic()
            turn, deltas = settle_with_events(d, c, sid, "one", 60)
            took = time.monotonic() - started
            notes = [e["delta"] for e in deltas if e["kind"] == "progress"]
            assert notes and notes[0].startswith("codex retries the model request: "), deltas
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            error = turn["error"]
            assert "codex" in error and model.base_url in error, error
            assert "3.5 s" in error and "model_first_byte_seconds" in error, error
            assert took < 14, took  # the budget and the grace, not Codex's retries
            gate.set()  # the Session works again once the model does
            again, _ = settle_with_events(d, c, sid, "again", 60)
            assert again["outcome"] == "completed", again
        finally:
            gate.set()
            d.stop()


def test_a_long_approval_and_a_long_command_are_not_a_stalled_stream(tmp_path: Path) -> None:
    """The model streams a sentence, then calls a command that needs an approval: the approval
    waits, then the command runs, each longer than the stream-idle limit and the host's grace
    (1 s + 2 s). Neither is the model stalling mid-reply: the Turn completes."""
    with ToolModel(preface="I will run the command now.") as model:
        d = _start(tmp_path / "home", model.base_url, "model_stream_idle_seconds = 1\n")
        try:
            c = d.client()
            sid = create_session(
                c, provider="codex", cwd=str(tmp_path), settings={"approvalPolicy": "on-request"}
            )["agentSessionId"]
            turn = submit(c, sid, "/run sleep 4; echo slept")["turnId"]
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


def test_codex_own_limit_on_a_stream_that_never_began_says_so(tmp_path: Path) -> None:
    """Codex's `stream_idle_timeout_ms` also covers the wait for a stream's first event: when
    it ends a stream that carried nothing, the reason says the reply never began, not that it
    stopped in the middle."""
    gate = threading.Event()  # never set while the turn runs: no stream sends an event
    with ResponsesServer(gate=gate, hold_after=0) as model:
        d = _start(tmp_path / "home", model.base_url, "model_stream_idle_seconds = 1\n")
        try:
            c = d.client()
            sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
            turn, _ = settle_with_events(d, c, sid, "one", 60)
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            error = turn["error"]
            assert "opened its reply and then sent nothing of it for 1 s" in error, error
            assert "model_stream_idle_seconds" in error and model.base_url in error, error
            assert "agenthost stopped" not in error, error  # Codex's own limit, not the host's
        finally:
            gate.set()
            d.stop()
