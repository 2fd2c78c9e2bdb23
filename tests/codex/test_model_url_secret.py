"""A `model_base_url` holding a user and password (`https://user:secret@host/v1`): the password
is told to nobody but the model endpoint — in no event, Turn error, reply, log line or file the
daemon writes (the provider's own config file in its private home aside), and on no process's
command line (`/proc/<pid>/cmdline` is readable by every user) — for each app-server provider,
while its Turns run and when the endpoint cannot be reached (the error still names it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from codex_helpers import codex_bin

from model_fakes.responses import ResponsesServer
from tests.models.streams import _subscribed, key_leaks
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline

pytestmark = [pytest.mark.codex, pytest.mark.timeout(180)]

SECRET = "hunter2-S3cr3t-7d1e"


def command_lines_holding(needle: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        if needle.encode() in argv:
            found.append(argv.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.mark.parametrize("provider", ["tutti-agent", "codex"])
def test_a_model_urls_password_is_in_no_event_error_log_file_or_command_line(
    tmp_path: Path, provider: str
) -> None:
    model = ResponsesServer().__enter__()
    url = model.base_url.replace("://", f"://agent:{SECRET}@", 1)
    home = tmp_path / "home"
    home.mkdir()
    command = f'command = "{codex_bin()}"\n' if provider == "codex" else ""
    (home / "agenthost.toml").write_text(
        f'[providers.{provider}]\n{command}model = "mock-model"\nmodel_base_url = "{url}"\n'
    )
    (tmp_path / "cwd").mkdir()
    d = DaemonProcess(home).start()
    replies: list[Any] = []
    events: list[dict[str, Any]] = []
    try:
        c = d.client()
        sid = create_session(c, provider=provider, cwd=str(tmp_path / "cwd"))["agentSessionId"]
        with _subscribed(d, c, sid) as sub:
            first = run_turn(c, sid, "one")
            assert first["outcome"] == "completed", first
            assert model.requests  # the endpoint was reached through the URL
            assert command_lines_holding(SECRET) == []
            model.__exit__(None, None, None)  # its port refuses now
            second = run_turn(c, sid, "two")
            assert second["outcome"] == "failed", second
            assert second["errorReason"] == "model_unreachable", second
            end = time.monotonic() + 1
            while time.monotonic() < end:
                event = sub.next(0.1)
                if event is not None:
                    events.append(event)
        assert events
        replies += [first, second, timeline(c, sid), c.call("host.status", {})]
        replies.append(c.call("session.get", {"workspaceId": WS, "agentSessionId": sid}))
        assert command_lines_holding(SECRET) == []
    finally:
        d.stop()
        model.__exit__(None, None, None)
    assert SECRET not in second["error"], second["error"]
    assert "127.0.0.1" in second["error"]  # the endpoint is still named
    assert [e for e in events if SECRET in json.dumps(e)] == []
    # Codex reads its endpoint from the config.toml in the Session's private home.
    private = list(home.glob("runtimes/*/*/codex-home/config.toml"))
    assert key_leaks(SECRET, d, replies, skip=[home / "agenthost.toml", *private]) == []
