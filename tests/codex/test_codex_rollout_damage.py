"""A Codex Session's rollout damaged behind the daemon's back. Gone (removed by hand, or lost)
while Turns of it are bound: its next Turn fails typed, `provider_history_missing`, the model
not asked — while its app-server runs (which holds the conversation in memory only) and after
a daemon restart — rather than completing into a file nobody can read back. Torn (a last line
cut mid-JSON, an unreadable line): a fork of it is refused before `thread/fork` is sent
(`failed`, `source_rollout_corrupt`, no child made), not left `unknown` with a child."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_fakes.responses import ResponsesServer
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.homes import child_rollouts, rollouts, runtime_home
from transport.client import ApiError, Client

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


def cut_last_turn(rollout: Path) -> str:
    """Cut the rollout back to the line before its last Turn's `task_started`: a valid JSONL
    prefix (every line whole), that Turn's lines and all after them gone. Its id returned."""
    lines = rollout.read_bytes().split(b"\n")
    start = max(i for i, line in enumerate(lines) if b'"task_started"' in line)
    turn_id = str(json.loads(lines[start])["payload"]["turn_id"])
    rollout.write_bytes(b"\n".join(lines[:start]) + b"\n")
    return turn_id


def fork_refused(
    d: DaemonProcess, c: Client, sid: str, turn_id: str, home_name: str = "codex-home"
) -> str:
    """A fork of the Session through `turn_id`, refused `provider_history_missing` (before
    any operation, or as a `failed` one with no target history in its provider home
    `home_name`): the refusal's words."""
    try:
        _, op = fork(c, sid, turn_id)
    except ApiError as exc:
        assert "provider_history_missing" in str(exc), exc
        return str(exc)
    op = until_terminal(c, op)
    assert op["status"] == "failed", op
    assert "provider_history_missing" in (op["error"] or ""), op
    target = runtime_home(d.home, WS, op["targetAgentSessionId"], home_name)
    assert rollouts(target) == []
    return str(op["error"])


def test_a_turn_after_the_last_bound_turn_was_cut_from_the_rollout_fails_typed(
    codex_daemon: DaemonProcess, model: ResponsesServer, tmp_path: Path
) -> None:
    """The rollout cut back by hand to before the Session's last bound Turn (whole lines
    left, so not torn), its app-server still running: a fork through that Turn fails before
    `thread/fork` with no child made; the next Turn fails `provider_history_missing` naming
    that Turn, the model not asked; a fork of the Session then is refused as its runtime is
    prepared; after a restart its Turn fails the same."""
    d = codex_daemon
    c = d.client()
    (tmp_path / "cwd").mkdir()
    sid = create_session(c, provider="codex", title="x", cwd=str(tmp_path / "cwd"))[
        "agentSessionId"
    ]
    turns = [run_turn(c, sid, text) for text in ("one", "two")]
    assert [t["outcome"] for t in turns] == ["completed"] * 2, turns
    home = runtime_home(d.home, WS, sid, "codex-home")
    (rollout,) = rollouts(home)
    last = cut_last_turn(rollout)
    cut = rollout.read_bytes()

    # The live app-server still shows the Turn: the fork is refused by the worker's check,
    # as the source's runtime is prepared or (a warm one reused) before `thread/fork`.
    assert last in fork_refused(d, c, sid, turns[1]["turnId"])
    assert child_rollouts(home) == []

    asked = len(model.requests)
    third = run_turn(c, sid, "three")
    assert third["outcome"] == "failed", third
    assert third["errorReason"] == "provider_history_missing", third
    assert last in third["error"], third
    assert len(model.requests) == asked  # the model never asked
    assert rollout.read_bytes() == cut

    fork_refused(d, c, sid, turns[0]["turnId"])
    assert child_rollouts(home) == []

    d.stop()
    d.start()
    c = d.client()
    fourth = run_turn(c, sid, "four")
    assert fourth["outcome"] == "failed", fourth
    assert fourth["errorReason"] == "provider_history_missing", fourth
    assert last in fourth["error"], fourth
    assert len(model.requests) == asked
    assert rollout.read_bytes() == cut
