"""What the Codex worker keeps per Session home (`CodexProvider`'s approval policy, sandbox mode
and fork source, what `prepare_home` writes at the next app-server start) goes when the Session
stops: Codex Sessions created, run and deleted one after another through the real daemon (real
store, worker, `codex app-server` 0.171.0; only the model is faked) leave none behind, read from
the worker itself (`worker.ping`'s `providerHomes`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.daemon import Daemon
from model_fakes.responses import ResponsesServer
from tests.codex.codex_helpers import codex_bin
from tests.support.daemon import create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = [pytest.mark.codex, pytest.mark.timeout(180)]

WS = "ws-codex-homes"
SESSIONS = 4


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with ResponsesServer() as model:
        (home / "agenthost.toml").write_text(
            "[providers.codex]\n"
            f'command = "{codex_bin()}"\n'
            'model = "mock-model"\n'
            f'model_base_url = "{model.base_url}"\n'
        )
        with in_process_daemon(home, timeout=60.0) as running:
            yield running


def _homes_kept(daemon: Daemon) -> int:
    assert daemon.supervisor is not None
    ping = daemon.supervisor.request("codex", "worker.ping", {}, 15).result(20)
    return int(ping["providerHomes"])


def test_deleted_codex_sessions_leave_no_home_kept_in_the_worker(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    """Each Session's start keeps its home's settings in the worker; its delete stops the
    runtime (`session.stop`), which forgets them: the worker keeps what its live Sessions
    need, never one entry per Session it ever ran."""
    daemon, client = running
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    kept = create_session(client, WS, provider="codex", cwd=str(cwd))["agentSessionId"]
    assert run_turn(client, kept, "kept", WS)["outcome"] == "completed"
    assert _homes_kept(daemon) == 1
    for i in range(SESSIONS):
        sid = create_session(client, WS, provider="codex", cwd=str(cwd))["agentSessionId"]
        assert run_turn(client, sid, f"turn {i}", WS)["outcome"] == "completed"
        assert _homes_kept(daemon) == 2
        client.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
        wait_for(lambda: _homes_kept(daemon) == 1, timeout=30.0)
    # The live Session's settings are still there: its next Turn starts as it should.
    assert run_turn(client, kept, "again", WS)["outcome"] == "completed"
    assert _homes_kept(daemon) == 1
