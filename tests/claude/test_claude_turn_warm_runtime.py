"""A new claude-code Session's second Turn starts warm, as the app-server drivers' does: the
Claude driver's `session.start` names the generation (the Claude Code CLI's identity) its
verdict came from (`SERVED_BY`), the worker stamps the start with it while it is still the live
one, and the next Turn is sent with `turn.start` alone. A Turn whose parked CLI was SIGKILLed
still completes on a CLI of its own; a Turn after its worker's kill takes the cold path.

An in-process daemon (real store, real Claude worker, real SDK + bundled CLI) on the local
MessagesServer; the worker port is wrapped to count the requests the daemon sent."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.daemon import Daemon
from model_fakes.messages import MessagesServer, model_input_texts
from tests.claude.test_claude_warm import exited
from tests.support.daemon import create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from tests.support.worker_requests import SentRequests, turn_after_worker_kill
from transport.client import Client

pytestmark = [pytest.mark.claude, pytest.mark.timeout(180)]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client, MessagesServer]]:
    with MessagesServer() as server:
        home = tmp_path / "home"
        home.mkdir(mode=0o700)
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        with in_process_daemon(home, timeout=60.0) as (daemon, client):
            yield daemon, client, server


def _session(c: Client, tmp_path: Path) -> str:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return str(
        create_session(c, provider="claude-code", title="claude warm", cwd=str(cwd))[
            "agentSessionId"
        ]
    )


def _parked_cli_pids(sid: str) -> list[int]:
    """The pids of the Claude Code CLIs parked for the Session (`--resume` of its transcript
    under its own runtime home), found through /proc: the worker is another process."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if sid.encode() in environ and b"--resume" in cmdline:
            out.append(int(entry))
    return out


def test_a_new_claude_sessions_second_turn_starts_warm(
    running: tuple[Daemon, Client, MessagesServer], tmp_path: Path
) -> None:
    """The first Turn's `session.start` registered the Session in the Claude worker: its
    answer names the CLI generation that gave the verdict, still the live one after the call,
    so it is stamped and the second Turn needs no `session.start` of its own (before, that
    start carried no generation and every new Session's second Turn started it again)."""
    daemon, c, server = running
    sent = SentRequests(daemon)
    sid = _session(c, tmp_path)
    first = run_turn(c, sid, "one")
    assert sent.take()["session.start"] == 1
    second = run_turn(c, sid, "two")
    assert [first["outcome"], second["outcome"]] == ["completed", "completed"], second
    requests = sent.take()
    assert requests["session.start"] == 0, requests
    assert requests["turn.start"] == 1, requests
    assert model_input_texts(server.requests[-1]) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
    ]


def test_a_turn_whose_parked_cli_was_killed_completes_on_a_cli_of_its_own(
    running: tuple[Daemon, Client, MessagesServer], tmp_path: Path
) -> None:
    """The CLI parked for the second Turn is SIGKILLed just before it: the Turn still
    completes (the driver starts a CLI of its own, cold) and continues the conversation."""
    daemon, c, server = running
    sid = _session(c, tmp_path)
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    pids = wait_for(lambda: _parked_cli_pids(sid), timeout=30)
    sent = SentRequests(daemon)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    second = run_turn(c, sid, "after the kill")
    assert second["outcome"] == "completed", (second.get("error"), second)
    assert all(exited(pid) for pid in pids)
    assert sent.take()["turn.start"] == 1
    assert model_input_texts(server.requests[-1]) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "after the kill"),
    ]


def test_a_claude_turn_right_after_its_workers_kill_takes_the_cold_path(
    running: tuple[Daemon, Client, MessagesServer], tmp_path: Path
) -> None:
    """The stamped runtime lives in its worker: a worker SIGKILLed a moment ago is gone to the
    host at once (the stamp's `workerPid`), so the next Turn starts the Session again in the
    new worker and is sent once."""
    daemon, c, _ = running
    sid = _session(c, tmp_path)
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    after, requests = turn_after_worker_kill(daemon, c, sid, "claude-code")
    assert after["outcome"] == "completed", after
    assert requests["session.start"] == 1, requests
    assert requests["turn.start"] == 1, requests
