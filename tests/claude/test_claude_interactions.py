"""Claude tool-permission requests as Interactions, through the real SDK + CLI: the fake model
calls a tool (Bash, AskUserQuestion), the CLI asks `can_use_tool`, the driver raises an
`interaction.requested` and the answer decides what the CLI does and what the model sees."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.errors import Conflict, InvalidArgument, NotFound, SessionBusy
from domain.procfs import alive_in_stat, end_all, processes_in, read_proc_stat
from drivers.claude.interactions import DECLINED_MESSAGE
from drivers.runtime_marker import RUNTIME_VAR
from model_fakes.messages import (
    MessagesServer,
    Reply,
    ToolUse,
    last_user_text,
    tool_result,
    tool_result_text,
)
from tests.claude.conftest import ClaudeSession, Harness
from tests.daemon.test_fork_saga import fork
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from transport.client import ApiError

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]

BASH = "/bash "
ASK = "/ask "


def tool_reply(body: dict[str, Any]) -> Reply:
    """`/bash <cmd>` → a Bash call, `/ask <q>` → an AskUserQuestion call; the follow-up
    request (carrying the tool result) → `tool ok|error: <result text>`; else an echo."""
    result = tool_result(body)
    if result is not None:
        status = "error" if result.get("is_error") else "ok"
        return f"tool {status}: {tool_result_text(result)}"
    text = last_user_text(body)
    if text.startswith(BASH):
        return ToolUse("Bash", {"command": text[len(BASH) :], "description": "test command"})
    if text.startswith(ASK):
        question = {
            "question": text[len(ASK) :],
            "header": "Choice",
            "options": [
                {"label": "red", "description": "the red one"},
                {"label": "blue", "description": "the blue one"},
            ],
            "multiSelect": False,
        }
        return ToolUse("AskUserQuestion", {"questions": [question]})
    return f"echo: {text}"


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with MessagesServer(reply=tool_reply) as server:
        h = Harness(tmp_path_factory.mktemp("claude-tools"), server)
        try:
            yield h
        finally:
            h.driver.close()


def begin(h: Harness, session: ClaudeSession, text: str) -> tuple[str, dict[str, Any]]:
    """Starts a turn and waits for its Interaction; returns (turnId, interaction event)."""
    turn_id = f"turn-{uuid.uuid4()}"
    h.driver.start_turn(
        {"agentSessionId": session.agent_session_id, "turnId": turn_id, "text": text},
        h.recorder,
    )

    def asked() -> dict[str, Any] | None:
        found = [e for e in h.recorder.for_turn(turn_id) if e["type"] == "interaction.requested"]
        return found[0] if found else None

    return turn_id, wait_for(asked, timeout=60)


def respond(h: Harness, session: ClaudeSession, request_id: str, response: Any) -> None:
    h.driver.respond_interaction(
        {"agentSessionId": session.agent_session_id, "requestId": request_id, "response": response}
    )


def results_sent_to_model(h: Harness) -> list[dict[str, Any]]:
    return [r for r in map(tool_result, h.server.requests) if r is not None]


def test_approved_bash_runs_and_the_model_receives_its_result(tools: Harness) -> None:
    session = tools.start("approve")
    marker = session.cwd / "approved.txt"
    command = f"echo approved-marker > {marker.name}"
    turn_id, asked = begin(tools, session, BASH + command)
    assert asked["kind"] == "approval"
    assert asked["input"]["tool"] == "Bash"
    assert asked["input"]["text"] == command
    assert asked["input"]["input"]["command"] == command
    events = tools.recorder.for_turn(turn_id)
    kinds = [e["type"] for e in events]
    # The host only binds Interactions to a Turn that started at the provider.
    assert kinds.index("turn.started") < kinds.index("interaction.requested")
    # requestId is the CLI's own tool_use id (the tool_call item carries the same one).
    calls = [e["item"] for e in events if e["type"] == "item" and e["item"]["kind"] == "tool_call"]
    assert [c["payload"]["providerToolUseId"] for c in calls] == [asked["requestId"]]
    assert not marker.exists()  # the CLI waits for the answer
    sent = len(results_sent_to_model(tools))
    respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert tools.recorder.wait_completed(turn_id)["outcome"] == "completed"
    assert marker.read_text().strip() == "approved-marker"
    [result] = results_sent_to_model(tools)[sent:]
    assert not result.get("is_error")
    assert result["tool_use_id"] == asked["requestId"]
    # Answered once: the same request is not pending any more.
    with pytest.raises(Conflict) as err:
        respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert err.value.reason == "interaction_not_pending"


def _sleeps_of(session: ClaudeSession) -> list[int]:
    """The `sleep`s running with the Session's runtime marker and a path of its home."""
    found = []
    for pid in processes_in(str(session.home), marked=RUNTIME_VAR):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                found.append(pid)
        except OSError:
            continue
    return found


def test_a_stop_ends_the_background_process_its_bash_tool_left(tools: Harness) -> None:
    """A tool's process in a session of its own (`setsid`: the CLI's own end does not reach
    it) carries the runtime's marker and is gone when the Session's stop is answered."""
    session = tools.start("left")
    turn_id, asked = begin(tools, session, f"{BASH}setsid sleep 300 > /dev/null 2>&1 &")
    respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert tools.recorder.wait_completed(turn_id)["outcome"] == "completed"
    left = wait_for(lambda: _sleeps_of(session), 30)
    try:
        tools.driver.stop_session({"agentSessionId": session.agent_session_id})
        running = []
        for pid in left:
            try:
                if alive_in_stat(read_proc_stat(pid)):
                    running.append(pid)
            except OSError:
                continue
        assert not running, f"the tool's {running} outlived its Session's stop"
    finally:
        end_all(lambda: _sleeps_of(session), 2.0)  # a failed run's


def test_declined_bash_does_not_run_and_the_model_sees_the_denial(tools: Harness) -> None:
    session = tools.start("decline")
    marker = session.cwd / "declined.txt"
    turn_id, asked = begin(tools, session, f"{BASH}echo no > {marker.name}")
    sent = len(results_sent_to_model(tools))
    respond(tools, session, asked["requestId"], {"decision": "decline"})
    assert tools.recorder.wait_completed(turn_id)["outcome"] == "completed"
    assert not marker.exists()
    [result] = results_sent_to_model(tools)[sent:]
    assert result["is_error"] is True
    assert tool_result_text(result) == DECLINED_MESSAGE
    replies = [
        e["item"]["text"]
        for e in tools.recorder.for_turn(turn_id)
        if e["type"] == "item" and e["item"]["kind"] == "assistant"
    ]
    assert replies == [f"tool error: {DECLINED_MESSAGE}"]


def test_read_only_bash_runs_without_an_interaction(tools: Harness) -> None:
    # Default permission mode, setting_sources=[]: the CLI itself allows read-only commands
    # (observed: `echo hi` runs; `touch`, `>` redirects and reads outside cwd ask).
    session = tools.start("readonly")
    _, completed = tools.turn(session, f"{BASH}echo read-only-output")
    assert completed["outcome"] == "completed"
    events = tools.recorder.for_turn(completed["turnId"])
    assert not [e for e in events if e["type"] == "interaction.requested"]
    results = [e["item"]["text"] for e in events if e["type"] == "item"]
    assert "read-only-output" in results


def test_question_answer_text_reaches_the_model(tools: Harness) -> None:
    session = tools.start("question")
    turn_id, asked = begin(tools, session, f"{ASK}Which colour do you want?")
    assert asked["kind"] == "question"
    assert asked["input"]["tool"] == "AskUserQuestion"
    assert asked["input"]["text"] == "Which colour do you want?"
    assert asked["input"]["questions"] == ["Which colour do you want?"]
    # A question takes a text, not a decision; the wrong shape leaves it pending.
    with pytest.raises(InvalidArgument) as err:
        respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert err.value.params == {"field": "response.text"}
    sent = len(results_sent_to_model(tools))
    respond(tools, session, asked["requestId"], {"text": "green, actually"})
    assert tools.recorder.wait_completed(turn_id)["outcome"] == "completed"
    [result] = results_sent_to_model(tools)[sent:]
    assert not result.get("is_error")
    assert '"Which colour do you want?"="green, actually"' in tool_result_text(result)


def test_interrupt_while_pending_interrupts_the_turn_and_clears_the_interaction(
    tools: Harness,
) -> None:
    session = tools.start("interrupt")
    marker = session.cwd / "interrupted.txt"
    turn_id, asked = begin(tools, session, f"{BASH}echo late > {marker.name}")
    started = next(e for e in tools.recorder.for_turn(turn_id) if e["type"] == "turn.started")
    tools.driver.interrupt_turn(
        {"agentSessionId": session.agent_session_id, "providerTurnId": started["providerTurnId"]}
    )
    # Only the interrupt can end this turn: the CLI is blocked on the unanswered request.
    assert tools.recorder.wait_completed(turn_id, timeout=30)["outcome"] == "interrupted"
    with pytest.raises(Conflict) as err:
        respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert err.value.reason == "interaction_not_pending"
    assert not marker.exists()
    _, after = tools.turn(session, "after the interrupt")
    assert after["outcome"] == "completed"


def kill_cli_while_pending(
    h: Harness, name: str, command: str
) -> tuple[ClaudeSession, dict[str, Any], dict[str, Any]]:
    """Starts a Bash turn, waits for its approval Interaction, then SIGKILLs the turn's own CLI
    process (it dies on its own, not through an interrupt). Returns (session, interaction
    event, `turn.completed` event)."""
    session = h.start(name)
    turn_id, asked = begin(h, session, BASH + command)
    active = h.driver._session(session.agent_session_id).active
    assert active is not None
    os.kill(active.transport._process.pid, signal.SIGKILL)
    return session, asked, h.recorder.wait_completed(turn_id, timeout=30)


def test_cli_death_while_pending_fails_the_turn_and_clears_the_interaction(
    tools: Harness,
) -> None:
    session, asked, completed = kill_cli_while_pending(tools, "crash", "echo never > crash.txt")
    assert completed["outcome"] == "failed"
    assert completed.get("error")
    with pytest.raises(Conflict) as err:
        respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert err.value.reason == "interaction_not_pending"
    assert not (session.cwd / "crash.txt").exists()
    _, after = tools.turn(session, "after the crash")
    assert after["outcome"] == "completed"


def test_a_transcript_left_without_messages_by_a_cli_death_is_not_resumed(
    tools: Harness,
) -> None:
    # SIGKILLed before it flushed the turn's messages, the CLI can leave its transcript holding
    # only queue bookkeeping (the driver saw the prompt through the SDK's echo). Resuming such a
    # file fails ("No conversation found"): the next turn must start the session afresh.
    session, _, completed = kill_cli_while_pending(tools, "bookkeeping", "echo never > gone.txt")
    assert completed["outcome"] == "failed"
    # Whatever the kill left (nothing, or more), make it exactly that state: the two queue lines
    # the CLI writes first (observed), no message.
    transcript = tools.driver._session(session.agent_session_id).transcript
    transcript.parent.mkdir(parents=True, exist_ok=True)
    sid = session.provider_session_id
    transcript.write_text(
        json.dumps({"type": "queue-operation", "operation": "enqueue", "sessionId": sid})
        + "\n"
        + json.dumps({"type": "queue-operation", "operation": "dequeue", "sessionId": sid})
        + "\n"
    )
    _, after = tools.turn(session, "after the crash")
    assert after["outcome"] == "completed"
    assert last_user_text(tools.server.requests[-1]) == "after the crash"


def test_respond_to_unknown_request_or_with_a_bad_shape_is_a_typed_error(
    tools: Harness,
) -> None:
    session = tools.start("errors")
    with pytest.raises(Conflict) as err:  # no turn at all
        respond(tools, session, "toolu_nothing", {"decision": "approve"})
    assert err.value.reason == "interaction_not_pending"
    turn_id, asked = begin(tools, session, f"{BASH}echo x > errors.txt")
    with pytest.raises(Conflict) as err:
        respond(tools, session, "toolu_unknown", {"decision": "approve"})
    assert err.value.reason == "interaction_not_pending"
    with pytest.raises(InvalidArgument) as bad:
        respond(tools, session, asked["requestId"], "approve")
    assert bad.value.params == {"field": "response"}
    with pytest.raises(InvalidArgument) as bad:
        respond(tools, session, asked["requestId"], {"decision": "maybe"})
    assert bad.value.params == {"field": "response.decision"}
    with pytest.raises(InvalidArgument) as bad:
        respond(tools, session, asked["requestId"], {"text": "yes"})
    assert bad.value.params == {"field": "response.decision"}
    # None of those consumed the request: a valid answer still settles the turn.
    respond(tools, session, asked["requestId"], {"decision": "decline"})
    assert tools.recorder.wait_completed(turn_id)["outcome"] == "completed"


def test_re_preparing_a_session_keeps_its_pending_interaction_and_stop_ends_the_turn(
    tools: Harness,
) -> None:
    session = tools.start("reprepare")
    turn_id, asked = begin(tools, session, f"{BASH}echo x > reprepare.txt")
    # fork.create re-prepares the runtime while the turn waits: same identity, nothing replaced.
    again = tools.start("reprepare", provider_session_id=session.provider_session_id)
    assert again.provider_session_id == session.provider_session_id
    with pytest.raises(InvalidArgument) as bad:  # still pending: the shape is checked
        respond(tools, session, asked["requestId"], {"decision": "maybe"})
    assert bad.value.params == {"field": "response.decision"}
    other_cwd = tools.root / "elsewhere"
    other_cwd.mkdir()
    with pytest.raises(SessionBusy):  # a different runtime while a turn runs is refused
        tools.driver.start_session(
            {
                "agentSessionId": session.agent_session_id,
                "home": str(session.home),
                "cwd": str(other_cwd),
                "providerSessionId": session.provider_session_id,
            }
        )
    tools.driver.stop_session({"agentSessionId": session.agent_session_id})
    assert tools.recorder.wait_completed(turn_id, timeout=30)["outcome"] == "interrupted"
    with pytest.raises(NotFound):
        respond(tools, session, asked["requestId"], {"decision": "approve"})
    assert not (session.cwd / "reprepare.txt").exists()


# ------------------------------------------------------------------------------ daemon


@pytest.fixture
def tool_daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, MessagesServer]]:
    with MessagesServer(reply=tool_reply) as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            yield d, server
        finally:
            d.stop()


def test_approval_through_the_socket_fences_fork_and_resolves_in_the_timeline(
    tool_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    d, server = tool_daemon
    c = d.client()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    sid = create_session(c, provider="claude-code", title="tools", cwd=str(cwd))["agentSessionId"]
    first = run_turn(c, sid, "one")
    assert first["outcome"] == "completed", first
    turn = submit(c, sid, f"{BASH}echo socket-marker > socket.txt")
    [pending] = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"], timeout=60)
    assert pending["kind"] == "approval" and pending["status"] == "pending"
    assert pending["turnId"] == turn["turnId"]
    assert pending["input"]["tool"] == "Bash"
    assert pending["input"]["text"] == "echo socket-marker > socket.txt"
    # A pending Interaction holds the source: no fork, even through an earlier settled turn.
    with pytest.raises(ApiError) as err:
        fork(c, sid, first["turnId"])
    assert err.value.reason == "agent_session_fork_conflict"
    assert err.value.params["forkBoundaryReason"] == "source_interaction_pending"
    params = {
        "workspaceId": WS,
        "agentSessionId": sid,
        "turnId": turn["turnId"],
        "requestId": pending["requestId"],
    }
    with pytest.raises(ApiError) as bad:
        c.call("interaction.respond", {**params, "response": {"decision": "maybe"}})
    assert (bad.value.status, bad.value.reason) == (400, "invalid_argument")
    assert bad.value.params == {"field": "response"}
    resolved = c.call("interaction.respond", {**params, "response": {"decision": "approve"}})[
        "interaction"
    ]
    assert resolved["status"] == "resolved"
    assert resolved["output"] == {"decision": "approve"}
    done = settle(c, sid, turn["turnId"])
    assert done["outcome"] == "completed", done
    assert (cwd / "socket.txt").read_text().strip() == "socket-marker"
    assert [i["status"] for i in done["interactions"]] == ["resolved"]
    results = [r for r in map(tool_result, server.requests) if r is not None]
    assert [r["tool_use_id"] for r in results] == [pending["requestId"]]
    assert not results[0].get("is_error")
    # Answered once; a second answer is a typed conflict.
    with pytest.raises(ApiError) as again:
        c.call("interaction.respond", {**params, "response": {"decision": "approve"}})
    assert again.value.status == 409
