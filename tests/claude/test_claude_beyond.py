"""Forks, resolves and lineage with `provider: "claude-code"` through the daemon (real SDK +
CLI, the local MessagesServer): full-Session fork (`latestSettled`) commits and a replay after
new Turns returns the original boundary; `fork.resolve` adopts an `unknown` fork's child and
abandons one without a child; `session.lineage` on a three-level tree whose middle node is
deleted (the leaf still runs a turn from its own home)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_claude_daemon import child_transcripts, claude_daemon, claude_source  # noqa: F401

from model_fakes.messages import MessagesServer, model_input_texts
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
from tests.support.homes import runtime_home
from tests.support.invariants import assert_invariants

pytestmark = [pytest.mark.claude, pytest.mark.long, pytest.mark.timeout(240)]


def test_claude_latest_settled_fork_commits_and_replays_original_boundary(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    d, server = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    op = assert_full_session_fork(c, sid, turns)
    n = len(server.requests)
    assert run_turn(c, op["targetAgentSessionId"], "four")["outcome"] == "completed"
    # The whole Session as it stood at the fork: all three Turns, then the child's own.
    assert model_input_texts(server.requests[n])[-1] == ("user", "four")
    assert ("user", "three") in model_input_texts(server.requests[n])
    assert ("user", "after the full fork") not in model_input_texts(server.requests[n])


def test_claude_unknown_fork_with_child_is_adopted_and_its_child_runs(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    d, _ = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    assert len(child_transcripts(d.home)) == 1
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    adopt_and_use(c, op, session["providerSessionId"], lambda: len(child_transcripts(d.home)))
    assert_invariants(d.home)


def test_claude_unknown_fork_without_child_is_abandoned_and_forks_again(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    d, _ = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.before_provider_call")
    abandon_and_refork(c, op, sid, turns[1]["turnId"], 0)
    assert_invariants(d.home)


def test_claude_lineage_three_levels_with_deleted_middle_node(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    d, _ = claude_daemon
    c = d.client()
    root, turns = claude_source(d, tmp_path / "cwd")
    assert_three_level_tree(c, root, turns)
    assert_invariants(d.home)


def test_claude_abandoned_child_is_quarantined_not_deleted(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    d, _ = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.after_provider_call")
    # `fork_session` writes the child next to the source; the refork's child moves to its home.
    source_home = runtime_home(d.home, WS, sid, "claude-config")
    quarantine_and_refork(
        c, op, sid, turns[0]["turnId"], source_home, lambda: child_transcripts(d.home)
    )
    assert_invariants(d.home)


def test_claude_unknown_fork_of_a_fork_is_adopted(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    d, _ = claude_daemon
    c = d.client()
    root, turns = claude_source(d, tmp_path / "cwd")
    adopt_fork_of_a_fork(c, d.home, root, turns)
    assert_invariants(d.home)
