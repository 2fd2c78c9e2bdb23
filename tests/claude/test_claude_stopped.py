"""A stopped Claude Code CLI through the real daemon: the real Claude worker, SDK and bundled
CLI, the local MessagesServer holding the Turn's reply. The CLI (and every process under it) is
SIGSTOPped mid-Turn: past `provider_stopped_seconds` the Turn fails `provider_stopped` in
words, and the daemon keeps serving (the next Turn runs on a new CLI)."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from model_fakes.messages import MessagesServer, last_user_text
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    timeline,
    wait_for,
)
from tests.support.homes import runtime_home

pytestmark = [pytest.mark.claude, pytest.mark.timeout(180)]


def cli_pids(config_dir: Path) -> list[int]:
    """Live processes whose `CLAUDE_CONFIG_DIR` is `config_dir` (the Session's turn CLI and
    what runs under it)."""
    wanted = str(config_dir)
    pids = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("CLAUDE_CONFIG_DIR") == wanted:
                pids.append(proc.pid)
    return pids


def test_a_stopped_claude_cli_fails_its_turn_provider_stopped(tmp_path: Path) -> None:
    gate = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if last_user_text(body) == "held":
            gate.wait(120)
        return f"echo: {last_user_text(body)}"

    with MessagesServer(reply) as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
            "[daemon]\nprovider_stopped_seconds = 1\n"
        )
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        d = DaemonProcess(home).start()
        pids: list[int] = []
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
            assert run_turn(c, sid, "warm")["outcome"] == "completed"
            turn = submit(c, sid, "held")
            wait_for(lambda: timeline(c, sid)[-1]["rootProviderTurnId"], 60)
            config_dir = runtime_home(d.home, WS, sid, "claude-config")
            pids = wait_for(lambda: cli_pids(config_dir), 30)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    psutil.Process(pid).send_signal(signal.SIGSTOP)
            done = settle(c, sid, turn["turnId"], timeout=60)
            assert done["outcome"] == "failed", done
            assert done["errorReason"] == "provider_stopped", done
            assert "provider_stopped: the claude-code CLI (pid " in done["error"], done
            assert "was stopped" in done["error"], done
            gate.set()
            after = run_turn(c, sid, "after")
            assert after["outcome"] == "completed", str(after.get("error"))
        finally:
            gate.set()
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
            d.stop()
