"""A Codex Session's rollout damaged behind the daemon's back. Gone (removed by hand, or lost)
while Turns of it are bound: its next Turn fails typed, `provider_history_missing`, the model
not asked — while its app-server runs (which holds the conversation in memory only) and after
a daemon restart — rather than completing into a file nobody can read back. Torn (a last line
cut mid-JSON, an unreadable line): a fork of it is refused before `thread/fork` is sent
(`failed`, `source_rollout_corrupt`, no child made), not left `unknown` with a child."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_fakes.responses import ResponsesServer
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.homes import child_rollouts, rollouts, runtime_home

pytestmark = [pytest.mark.codex, pytest.mark.timeout(180)]


def test_a_turn_after_the_sessions_rollout_vanished_fails_typed_live_and_after_a_restart(
    codex_daemon: DaemonProcess, model: ResponsesServer, tmp_path: Path
) -> None:
    """Its rollout removed while the Session's app-server runs: the next Turn fails
    `provider_history_missing` naming the thread, the model never asked and no rollout
    written; after a restart (no app-server holds the thread) the same, typed."""
    d = codex_daemon
    c = d.client()
    (tmp_path / "cwd").mkdir()
    sid = create_session(c, provider="codex", title="x", cwd=str(tmp_path / "cwd"))[
        "agentSessionId"
    ]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    thread = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
        "providerSessionId"
    ]
    home = runtime_home(d.home, WS, sid, "codex-home")
    (rollout,) = rollouts(home)
    rollout.unlink()
    asked = len(model.requests)
    second = run_turn(c, sid, "two")
    assert second["outcome"] == "failed", second
    assert second["errorReason"] == "provider_history_missing", second
    assert thread in second["error"], second
    assert second["hostOnly"] is True, second  # nothing recorded as run at the provider
    assert len(model.requests) == asked  # the model never asked
    assert rollouts(home) == []

    d.stop()
    d.start()
    c = d.client()
    third = run_turn(c, sid, "three")
    assert third["outcome"] == "failed", third
    assert third["errorReason"] == "provider_history_missing", third
    assert thread in third["error"], third
    assert len(model.requests) == asked
    assert rollouts(home) == []


@pytest.mark.parametrize("damage", ["torn_last_line", "unreadable_line"])
def test_a_fork_of_a_torn_source_rollout_fails_before_thread_fork_with_no_child(
    codex_daemon: DaemonProcess, tmp_path: Path, damage: str
) -> None:
    """The source's rollout ends in a line cut mid-JSON (a crash mid-write), or holds a line
    that is not JSON: the fork is refused before `thread/fork` — `failed`, its error naming
    `source_rollout_corrupt` — and no child rollout is made in either home."""
    d = codex_daemon
    c = d.client()
    (tmp_path / "cwd").mkdir()
    sid = create_session(c, provider="codex", title="x", cwd=str(tmp_path / "cwd"))[
        "agentSessionId"
    ]
    turns = [run_turn(c, sid, text) for text in ("one", "two", "three")]
    assert [t["outcome"] for t in turns] == ["completed"] * 3, turns
    # A fork of the whole file first: the damage comes after a read that passed it.
    _, first = fork(c, sid, turns[0]["turnId"])
    assert until_terminal(c, first)["status"] == "committed", first
    home = runtime_home(d.home, WS, sid, "codex-home")
    (rollout,) = [p for p in rollouts(home) if p not in child_rollouts(home)]
    good = rollout.read_bytes()
    if damage == "torn_last_line":
        rollout.write_bytes(good + b'{"timestamp":"2026-12-07T01:00:00.000Z","ordinal":')
    else:
        lines = good.split(b"\n")
        lines.insert(len(lines) - 2, b"\xff not a rollout line")
        rollout.write_bytes(b"\n".join(lines))
    children = child_rollouts(home)
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "failed", op
    assert "source_rollout_corrupt" in (op["error"] or ""), op
    assert child_rollouts(home) == children  # no child made
    target = runtime_home(d.home, WS, op["targetAgentSessionId"], "codex-home")
    assert rollouts(target) == []
