"""`agenthost` client commands run as real subprocesses against a real daemon: human output,
the documented `--json` shapes (docs/client.md) and exit codes with the error reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, wait_for
from transport.client import Client

pytestmark = pytest.mark.timeout(60)

SESSION_KEYS = {
    "workspaceId",
    "agentSessionId",
    "kind",
    "provider",
    "providerSessionId",
    "title",
    "cwd",
    "settings",
    "model",
    "pinned",
    "activeTurnId",
    "parentAgentSessionId",
    "parentTurnId",
    "createdAtUnixMs",
    "updatedAtUnixMs",
    "lifecycleCapabilities",
    "forkedFrom",
}
TURN_KEYS = {
    "turnId",
    "sequence",
    "phase",
    "outcome",
    "rootProviderTurnId",
    "providerForkBindingState",
    "finalAssistantMessageId",
    "messages",
    "interactions",
    "createdAtUnixMs",
    "settledAtUnixMs",
}
OPERATION_KEYS = {
    "operationId",
    "requestId",
    "sourceAgentSessionId",
    "targetAgentSessionId",
    "point",
    "status",
    "phase",
    "session",
    "lineage",
    "error",
    "workspace",
}
MUTATION_KEYS = {
    "sourceAgentSessionId",
    "turnId",
    "requestId",
    "targetAgentSessionId",
    "operationId",
    "status",
    "phase",
    "ack",
    "ackAttempts",
    "createAttempts",
    "error",
    "childAgentSessionId",
    "errorDetail",
    "point",
    "boundaryTurnId",
    "workspace",
}
ERROR_KEYS = {"status", "code", "reason", "message", "retryable", "params"}


class Cli:
    def __init__(self, home: Path, ws: str) -> None:
        self.home = home
        self.ws = ws

    def run(self, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "agenthost.cli",
                "--home",
                str(home or self.home),
                "--workspace",
                self.ws,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    def json(self, *args: str, code: int = 0) -> Any:
        done = self.run("--json", *args)
        assert done.returncode == code, (done.stdout, done.stderr)
        # `say --json` writes JSON Lines (one object per event): its result is the last one.
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def cli(daemon: DaemonProcess, ws: str) -> Cli:
    return Cli(daemon.home, ws)


def new_session(cli: Cli, title: str = "Trip") -> str:
    return str(cli.json("new", "--title", title)["session"]["agentSessionId"])


def say(cli: Cli, sid: str, text: str) -> dict[str, Any]:
    return dict(cli.json("say", sid, text)["turn"])


def test_status_reports_version_and_workers(cli: Cli) -> None:
    done = cli.run("status")
    assert done.returncode == 0
    assert done.stdout.startswith("agenthost ") and "workers:" in done.stdout
    # The user guide's example has the same lines, in the same order.
    guide = (Path(__file__).resolve().parents[2] / "docs" / "user-guide.md").read_text()
    example = guide.split("\nagenthost 0.1.0 (protocol 1) at ", 1)[1].split("\n```", 1)[0]

    def shape(text: str) -> list[str]:
        lines = text.strip().splitlines()[1:]
        return [line.split()[0].rstrip(":") for line in lines]

    assert shape(example) == shape(done.stdout.split(" at ", 1)[1])
    status = cli.json("status")
    assert set(status) >= {"version", "protocol", "home", "workers", "uptimeMs"}
    assert status["protocol"] == 1
    assert Path(status["home"]) == cli.home.resolve()


def test_unreachable_daemon_exits_3_with_the_reason(cli: Cli, tmp_path: Path) -> None:
    done = cli.run("status", home=tmp_path / "nobody")
    assert done.returncode == 3
    assert "daemon_unreachable" in done.stderr
    done = cli.run("--json", "sessions", home=tmp_path / "nobody")
    assert done.returncode == 3
    assert json.loads(done.stdout)["error"]["reason"] == "daemon_unreachable"


def test_new_creates_a_session_and_rejects_an_unknown_provider(cli: Cli) -> None:
    session = cli.json("new", "--provider", "tutti-agent", "--title", "Plans")["session"]
    assert set(session) >= SESSION_KEYS
    assert session["provider"] == "tutti-agent" and session["title"] == "Plans"
    human = cli.run("new", "--title", "Other")
    assert human.returncode == 0 and human.stdout.split()[0].count("-") == 4
    bad = cli.run("new", "--provider", "nope")
    assert bad.returncode == 2


def test_say_streams_the_turn_and_resolves_a_session_prefix(cli: Cli) -> None:
    sid = new_session(cli)
    done = cli.run("say", sid[:8], "/tool search LIS")
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines == [
        "user: /tool search LIS",
        "reasoning: The user asked for the search tool.",
        "tool_call: search",
        "tool_result: search ran with 'LIS'",
        "assistant: echo: search",
    ]
    turn = cli.json("say", sid, "hello")
    assert set(turn) == {"type", "turn"} and set(turn["turn"]) >= TURN_KEYS
    assert turn["turn"]["outcome"] == "completed" and turn["turn"]["sequence"] == 2


def test_say_exits_1_when_the_turn_fails(cli: Cli) -> None:
    sid = new_session(cli)
    done = cli.run("say", sid, "/fail boom")
    assert done.returncode == 1 and "turn_failed: boom" in done.stderr
    out = cli.json("say", sid, "/fail again", code=1)
    assert out["turn"]["outcome"] == "failed"
    assert out["error"] == {"reason": "turn_failed", "message": "again"}


def test_say_answers_interactions_or_interrupts_when_nobody_can(cli: Cli) -> None:
    sid = new_session(cli)
    out = cli.json("say", sid, "/ask color?", code=1)
    assert out["error"]["reason"] == "interaction_pending"
    # The unanswerable turn was interrupted, so the session is free for the next one.
    assert say_with(cli, sid, "/ask color?", "blue")["messages"][-1]["text"] == "blue"
    approved = cli.json("say", sid, "/approve ls", "--approve")["turn"]
    assert approved["messages"][-1]["text"] == "approved: ls"


def test_say_turn_timeout_is_turn_timeout_exit_1_not_unreachable(cli: Cli) -> None:
    sid = new_session(cli)
    out = cli.json("say", sid, "/slow 3000 late", "--turn-timeout", "0.5", code=1)
    # The daemon answered; only the wait ran out: not `daemon_unreachable` (exit 3).
    assert out["error"]["reason"] == "turn_timeout"
    assert "still active after 0.5 s" in out["error"]["message"]
    # The Turn goes on in the daemon and settles by itself.
    shown = wait_for(lambda: (t := cli.json("show", sid)) and _settled_last(t), timeout=30)
    assert shown["messages"][-1]["text"] == "echo: late"


def _settled_last(shown: dict[str, Any]) -> dict[str, Any] | None:
    turns = shown.get("turns") or []
    return turns[-1] if turns and turns[-1]["phase"] == "settled" else None


def say_with(cli: Cli, sid: str, text: str, answer: str) -> dict[str, Any]:
    return dict(cli.json("say", sid, text, "--answer", answer)["turn"])


def test_say_unknown_session_exits_1_with_the_reason(cli: Cli) -> None:
    done = cli.run("say", "00000000-0000-4000-8000-000000000000", "hi")
    assert done.returncode == 1
    assert "workspace_agent_session_not_found" in done.stderr
    err = cli.json("show", "zzzz", code=1)["error"]
    assert err["reason"] == "workspace_agent_session_not_found"


def test_fork_through_a_turn_by_sequence_then_show_and_sessions(cli: Cli) -> None:
    sid = new_session(cli, "Lisbon")
    turns = [say(cli, sid, t)["turnId"] for t in ("one", "two", "three")]
    out = cli.json("fork", sid, "--through", "2")
    assert set(out) == {"mutation", "operation"}
    assert set(out["mutation"]) == MUTATION_KEYS and set(out["operation"]) == OPERATION_KEYS
    mutation, op = out["mutation"], out["operation"]
    assert mutation["status"] == "succeeded" and mutation["ack"] == "observed"
    assert op["status"] == "committed" and op["point"]["turnId"] == turns[1]
    child = mutation["childAgentSessionId"]
    assert child == op["targetAgentSessionId"] == op["session"]["agentSessionId"]
    # show: turn ids, binding states, lineage and the divider right after the boundary turn.
    show = cli.run("show", child)
    assert show.returncode == 0
    text = show.stdout
    assert f"forked from Lisbon ({sid}) through turn {turns[1]}" in text
    lines = text.splitlines()
    turn_lines = [i for i, line in enumerate(lines) if line.strip().startswith("Turn ")]
    assert len(turn_lines) == 2 and all("binding bound" in lines[i] for i in turn_lines)
    divider = [i for i, line in enumerate(lines) if "continued from Lisbon" in line]
    assert divider == [len(lines) - 1]  # after Turn 2's messages, the last one
    shown = cli.json("show", child)
    assert set(shown) == {"session", "turns"}
    assert shown["session"]["forkedFrom"]["sourceTurnId"] == turns[1]
    assert [t["messages"][0]["text"] for t in shown["turns"]] == ["one", "two"]
    # sessions: the child sits under its source.
    tree = cli.run("sessions").stdout.splitlines()
    src_line = next(i for i, line in enumerate(tree) if line.startswith(sid))
    assert tree[src_line + 1].startswith(child) and "└─ Lisbon (2)" in tree[src_line + 1]
    listed = cli.json("sessions")
    assert set(listed) == {"sessions"}
    assert {s["agentSessionId"] for s in listed["sessions"]} == {sid, child}


def test_fork_human_output_and_progress_line_while_accepted(cli: Cli, client: Client) -> None:
    sid = new_session(cli, "Slow")
    turn = say(cli, sid, "one")["turnId"]
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:2500"}})
    # An all-digit reference is a Turn sequence number: keep the '-' when the 8 hex are digits.
    prefix = turn[:9] if turn[:8].isdigit() else turn[:8]
    done = cli.run("fork", sid, "--through", prefix)
    assert done.returncode == 0, done.stderr
    assert "… fork accepted (" in done.stderr
    assert "committed" in done.stdout and "child " in done.stdout


def test_fork_failures_exit_with_reasons(cli: Cli, client: Client) -> None:
    sid = new_session(cli)
    turn = say(cli, sid, "one")["turnId"]
    err = cli.json("fork", sid, "--through", "9", code=1)["error"]
    assert err["reason"] == "turn_not_found"
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "error"}})
    failed = cli.json("fork", sid, "--through", turn, code=1)
    assert failed["mutation"]["status"] == "failed"
    assert failed["operation"]["status"] == "failed"
    assert failed["error"]["reason"]
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "off"}})
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    unknown = cli.json("fork", sid, "--through", turn, code=4)
    assert unknown["mutation"]["status"] == "unknown"
    assert unknown["error"]["reason"] == "agent_session_fork_delivery_unknown"
    human = cli.run("fork", sid, "--through", turn)
    assert human.returncode == 4 and "agent_session_fork_delivery_unknown" in human.stderr


def test_op_reads_and_acknowledges(cli: Cli, client: Client, ws: str) -> None:
    sid = new_session(cli)
    turn = say(cli, sid, "one")["turnId"]
    op = client.call(
        "fork.create",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "requestId": "cli-op-1",
            "targetAgentSessionId": "11111111-2222-4333-8444-555555555555",
            "point": {"type": "throughTurn", "turnId": turn},
        },
    )["operation"]
    got = cli.json("op", op["operationId"])
    assert set(got) == {"operation"} and set(got["operation"]) == OPERATION_KEYS
    human = cli.run("op", op["operationId"])
    assert human.returncode == 0
    assert human.stdout.startswith(f"operation {op['operationId']}: ")
    # Committed but not ACKed: the boundary is held until `op --ack`.
    wait_for(
        lambda: (
            client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
                "operation"
            ]["status"]
            == "committed"
        )
    )
    acked = cli.json("op", op["operationId"], "--ack")["operation"]
    assert acked["status"] == "committed"
    missing = cli.json("op", "no-such-op", code=1)["error"]
    assert set(missing) == ERROR_KEYS
    assert missing["status"] == 404
    assert missing["reason"] == "agent_session_fork_operation_not_found"


def test_gui_without_a_daemon_exits_3(cli: Cli, tmp_path: Path) -> None:
    done = cli.run("gui", home=tmp_path / "nobody")
    assert done.returncode == 3 and "daemon_unreachable" in done.stderr
