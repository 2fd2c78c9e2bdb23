"""Issue 21 with `provider: "codex"` through the daemon (real codex app-server, the local
ResponsesServer): full-Session fork (`latestSettled`) commits and a replay after new Turns
returns the original boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_codex_daemon import codex_daemon, codex_home, codex_source, model  # noqa: F401

from tests.daemon.test_fork_full_session import assert_full_session_fork
from tests.support.daemon import DaemonProcess, run_turn
from tests.support.homes import child_rollouts

pytestmark = [pytest.mark.codex, pytest.mark.timeout(240)]


def test_codex_latest_settled_fork_commits_and_replays_original_boundary(
    codex_daemon: DaemonProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    op = assert_full_session_fork(c, sid, turns)
    assert len(child_rollouts(codex_home(d, sid))) == 2
    assert run_turn(c, op["targetAgentSessionId"], "four")["outcome"] == "completed"
