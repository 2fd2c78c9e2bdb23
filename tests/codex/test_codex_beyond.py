"""Forks, resolves and lineage with `provider: "codex"` through the daemon (real codex app-server,
the local ResponsesServer): full-Session fork (`latestSettled`) commits and a replay after new Turns
returns the original boundary; `fork.resolve` adopts an `unknown` fork's child and abandons
one without a child; `session.lineage` on a three-level tree whose middle node is deleted (the
leaf still runs a turn from its own home)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from codex_helpers import write_config
from test_codex_daemon import codex_home, codex_source

from model_fakes.responses import ResponsesServer
from tests.daemon.test_fork_full_session import assert_full_session_fork
from tests.daemon.test_fork_resolve import (
    abandon_and_refork,
    adopt_and_use,
    adopt_fork_of_a_fork,
    quarantine_and_refork,
    unknown_fork,
)
from tests.daemon.test_lineage_tree import assert_three_level_tree
from tests.support.daemon import WS, DaemonProcess, run_turn
from tests.support.homes import child_rollouts
from tests.support.invariants import assert_invariants

pytestmark = [pytest.mark.codex, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def codex_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon (and model server) for the file: every test makes its own source Session."""
    with ResponsesServer() as server:
        home = tmp_path_factory.mktemp("codex-beyond") / "home"
        write_config(home, server)
        d = DaemonProcess(home).start()
        try:
            yield d
        finally:
            d.stop()


def test_codex_latest_settled_fork_commits_and_replays_original_boundary(
    codex_daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    op = assert_full_session_fork(c, sid, turns)
    assert len(child_rollouts(codex_home(d, sid))) == 2
    assert run_turn(c, op["targetAgentSessionId"], "four")["outcome"] == "completed"


def test_codex_unknown_fork_with_child_is_adopted_and_its_child_runs(
    codex_daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    assert len(child_rollouts(codex_home(d, sid))) == 1
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    adopt_and_use(
        c, op, session["providerSessionId"], lambda: len(child_rollouts(codex_home(d, sid)))
    )
    assert_invariants(d.home)


def test_codex_unknown_fork_without_child_is_abandoned_and_forks_again(
    codex_daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.before_provider_call")
    abandon_and_refork(c, op, sid, turns[1]["turnId"], 0)
    assert_invariants(d.home)


def test_codex_lineage_three_levels_with_deleted_middle_node(
    codex_daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    d = codex_daemon
    c = d.client()
    root, turns = codex_source(c, tmp_path / "cwd")
    assert_three_level_tree(c, root, turns)
    assert_invariants(d.home)


def test_codex_abandoned_child_is_quarantined_not_deleted(
    codex_daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.after_provider_call")
    home = codex_home(d, sid)
    quarantine_and_refork(c, op, sid, turns[0]["turnId"], home, lambda: child_rollouts(home))
    assert_invariants(d.home)


def test_codex_unknown_fork_of_a_fork_is_adopted(
    codex_daemon: DaemonProcess, tmp_path: Path
) -> None:
    d = codex_daemon
    c = d.client()
    root, turns = codex_source(c, tmp_path / "cwd")
    adopt_fork_of_a_fork(c, d.home, root, turns)
    assert_invariants(d.home)
