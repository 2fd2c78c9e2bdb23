"""The host's stream-idle backstop with tutti-agent on a model endpoint, through the real daemon
and the fake Responses and Chat Completions APIs: a reply that stalls mid-stream fails
`model_timeout` when the app-server does not end it itself (its own limit overridden far above
the host's by the command, as a provider that ignores the setting would); a reply that drips
for longer than the limit is no stall."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from model_fakes.chat import ChatServer
from model_fakes.http import FakeModelServer
from model_fakes.responses import ResponsesServer
from tests.models.streams import settle_with_events
from tests.support.daemon import DaemonProcess, create_session

pytestmark = pytest.mark.timeout(120)


def _app_server_ignoring_its_stream_limit(tmp_path: Path) -> Path:
    """tutti-agent with `--stream-idle-seconds 600` after whatever the driver passes (the last
    one counts)."""
    tutti = Path(sys.executable).parent / "tutti-agent"
    wrapper = tmp_path / "tutti-agent-ignoring-stream-idle"
    wrapper.write_text(f'#!/bin/sh\nexec "{tutti}" "$@" --stream-idle-seconds 600\n')
    wrapper.chmod(0o755)
    return wrapper


def _stalling(wire_api: str, gate: threading.Event) -> FakeModelServer[Any]:
    """A model of `wire_api` whose every reply stops after its first piece of text."""
    if wire_api == "chat":
        return ChatServer(gate=gate)
    return ResponsesServer(gate=gate, hold_after=3)


@pytest.mark.parametrize("wire_api", ["responses", "chat"])
def test_a_reply_that_stalls_mid_stream_fails_model_timeout_by_the_host(
    tmp_path: Path, wire_api: str
) -> None:
    gate = threading.Event()  # never set while the turn runs: the reply stalls after a delta
    with _stalling(wire_api, gate) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.tutti-agent]\n"
            f'command = "{_app_server_ignoring_its_stream_limit(tmp_path)}"\n'
            f'model_base_url = "{model.base_url}"\n'
            f'wire_api = "{wire_api}"\n'
            'model = "mock-model"\n'
            "model_stream_idle_seconds = 1\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, cwd=str(tmp_path))["agentSessionId"]
            started = time.monotonic()
            turn, deltas = settle_with_events(d, c, sid, "one two three four five six", 60)
            took = time.monotonic() - started
            assert [e for e in deltas if e["kind"] == "assistant"], deltas  # it began
            assert turn["outcome"] == "failed", turn
            assert turn["errorReason"] == "model_timeout", turn["error"]
            error = turn["error"]
            assert "tutti-agent" in error and model.base_url in error, error
            assert "1 s" in error and "model_stream_idle_seconds" in error, error
            assert "in the middle of its reply" in error, error
            assert "agenthost stopped the provider's runtime" in error, error  # the host's
            assert took < 30, took  # the limit and the host's grace, not the app-server's 600 s
            gate.set()  # the Session works again once the model does
            again, _ = settle_with_events(d, c, sid, "again", 60)
            assert again["outcome"] == "completed", again
        finally:
            gate.set()
            d.stop()


def test_a_reply_that_drips_for_longer_than_the_limit_is_not_a_stall(tmp_path: Path) -> None:
    """Pieces 0.4 s apart for about 5 s, with `model_stream_idle_seconds = 1`: the backstop's
    timer (first due 3 s after the first piece) moves on with the stream; the Turn completes."""
    with ResponsesServer(drip_s=0.4) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.tutti-agent]\n"
            f'model_base_url = "{model.base_url}"\n'
            'model = "mock-model"\n'
            "model_stream_idle_seconds = 1\n"
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, cwd=str(tmp_path))["agentSessionId"]
            text = "a reply that takes its time"
            started = time.monotonic()
            turn, deltas = settle_with_events(d, c, sid, text, 60)
            assert time.monotonic() - started > 4, deltas  # longer than the limit + grace
            assert turn["outcome"] == "completed", turn
            assert len([e for e in deltas if e["kind"] == "assistant"]) > 6, deltas
        finally:
            d.stop()
