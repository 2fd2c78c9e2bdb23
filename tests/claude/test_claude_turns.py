"""Claude sessions and turns through the real SDK + CLI: observed provider Turn identity,
checkpoint bindings (including a trailing system message), one turn at a time, interrupt."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from domain.enums import DeliveryDisposition
from domain.errors import NotFound, ProviderNotCalled, SessionBusy
from domain.worker_messages import ForkRequest
from drivers.claude.driver import ClaudeDriver
from drivers.claude.env import ClaudeDriverConfig
from drivers.claude_transcript import decode_binding, parse_entries
from drivers.failpoints import Failpoints
from tests.claude.conftest import SLOW_PREFIX, Harness

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]

STOP_HOOK_SETTINGS = {
    "hooks": {
        "Stop": [
            {
                "hooks": [
                    {
                        "type": "command",
                        "command": 'echo \'{"systemMessage": "stop hook notice"}\'',
                    }
                ]
            }
        ]
    }
}


def test_provider_turn_id_is_the_observed_root_user_uuid_of_the_transcript(
    harness: Harness,
) -> None:
    session = harness.start("identity")
    provider_turn_id, completed = harness.turn(session, "hello identity")
    assert completed["outcome"] == "completed"
    events = harness.recorder.for_turn(completed["turnId"])
    kinds = [e["type"] for e in events]
    assert kinds[0] == "turn.started" and kinds[-1] == "turn.completed"
    assert events[0]["providerTurnId"] == provider_turn_id
    raw = [json.loads(line) for line in harness.transcript(session).read_text().splitlines()]
    [root] = [e for e in raw if e.get("uuid") == provider_turn_id]
    assert root["type"] == "user" and root["message"]["content"] == "hello identity"
    items = [e["item"] for e in events if e["type"] == "item"]
    assert [(i["kind"], i["text"]) for i in items] == [("assistant", "echo: hello identity")]
    # The binding's checkpoint is the last main-chain message streamed: the assistant reply.
    last_binding = [e for e in events if e["type"] == "turn.binding"][-1]
    assert decode_binding(last_binding["bindingJson"]) == items[0]["payload"]["providerMessageUuid"]
    attestation = harness.driver.attest({"home": str(session.home), "cwd": str(session.cwd)})
    assert attestation["userAgent"].startswith("claude-agent-sdk/0.2.189 ")
    assert {k: v for k, v in attestation.items() if k != "userAgent"} == {
        "driverKind": "claude-code",
        "driverVersion": "0.2.189",
        "bindingMode": "provider_owned",
        "forkThroughTurn": True,
        "binderAvailable": True,
        "forkFullSession": True,
    }


def test_new_session_claims_its_id_and_later_turns_resume_it(harness: Harness) -> None:
    session = harness.start("resume")
    harness.turn(session, "first")
    harness.turn(session, "second")
    files = list(harness.transcript(session).parent.glob("*.jsonl"))
    assert [f.stem for f in files] == [session.provider_session_id]
    roots = [e for e in parse_entries(harness.transcript(session).read_text()) if e.is_root_user]
    assert [r.uuid for r in roots] == [t for t, _ in session.turns]


def test_trailing_system_message_moves_the_checkpoint_past_the_reply(harness: Harness) -> None:
    session = harness.start("trailing", settings={"claudeSettings": STOP_HOOK_SETTINGS})
    provider_turn_id, completed = harness.turn(session, "with a stop hook")
    events = harness.recorder.for_turn(completed["turnId"])
    reply_uuid = next(
        e["item"]["payload"]["providerMessageUuid"] for e in events if e["type"] == "item"
    )
    bindings = [decode_binding(e["bindingJson"]) for e in events if e["type"] == "turn.binding"]
    assert reply_uuid in bindings
    checkpoint = bindings[-1]
    assert checkpoint != reply_uuid
    order = [e.uuid for e in parse_entries(harness.transcript(session).read_text())]
    assert order.index(checkpoint) > order.index(reply_uuid)
    # A fork through that turn ends at the moved checkpoint.
    params = harness.fork_params(session, "trailing-child", 1)
    result = harness.driver.fork(ForkRequest.from_wire(params))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None
    assert result.binding.receipt["sourceCheckpointMessageId"] == checkpoint


def test_second_turn_while_one_is_active_is_busy_and_interrupt_settles_it(
    harness: Harness,
) -> None:
    session = harness.start("busy")
    turn_id = f"turn-{uuid.uuid4()}"
    started = harness.driver.start_turn(
        {
            "agentSessionId": session.agent_session_id,
            "turnId": turn_id,
            "text": f"{SLOW_PREFIX}wait for me",
        },
        harness.recorder,
    )
    assert started["providerTurnId"]
    with pytest.raises(SessionBusy):
        harness.driver.start_turn(
            {"agentSessionId": session.agent_session_id, "turnId": "t2", "text": "no"},
            harness.recorder,
        )
    harness.driver.interrupt_turn(
        {"agentSessionId": session.agent_session_id, "providerTurnId": started["providerTurnId"]}
    )
    # The model is still holding its reply: only the interrupt can end this turn now.
    completed = harness.recorder.wait_completed(turn_id, timeout=30)
    assert completed["outcome"] == "interrupted"
    assert not [e for e in harness.recorder.for_turn(turn_id) if e["type"] == "item"]
    assert completed["providerTurnId"] == started["providerTurnId"]
    # The session is usable again after the interrupt.
    _, after = harness.turn(session, "after interrupt")
    assert after["outcome"] == "completed"


def test_turn_on_a_session_the_worker_never_started_is_not_found(harness: Harness) -> None:
    with pytest.raises(NotFound):
        harness.driver.start_turn(
            {"agentSessionId": "agent-nobody", "turnId": "t", "text": "x"}, harness.recorder
        )


def test_a_cli_that_ended_before_the_prompt_is_named_with_its_exit_code_either_way() -> None:
    """Which error the SDK raises for a CLI that exits before it is handed the prompt is a
    race of the exit and the prompt's write: a `ProcessError` with the exit code, or a failed
    write whose text carries it. Both read as the CLI's exit, the code named."""
    from claude_agent_sdk import CLIConnectionError, ProcessError

    from drivers.claude.turns import not_started_text

    want = "the Claude Code CLI (/bin/false) exited with code 1 before it read the prompt"
    exited = ProcessError("Command failed with exit code 1", exit_code=1)
    assert not_started_text("/bin/false", exited) == want
    write = CLIConnectionError("Cannot write to terminated process (exit code: 1)")
    assert not_started_text("/bin/false", write) == want
    # A write that met the closed pipe before the exit was reaped carries no code: the
    # process's own is given.
    broken_pipe = CLIConnectionError("Failed to write to process stdin: ")
    assert not_started_text("/bin/false", broken_pipe, 1) == want
    unrunnable = OSError("[Errno 8] Exec format error")
    assert not_started_text("/x", unrunnable).startswith(
        "the Claude Code CLI (/x) could not be started: "
    )


def test_a_cli_that_closes_its_stdin_and_then_exits_is_named_with_its_exit_code(
    harness: Harness, tmp_path: Path
) -> None:
    """A CLI that closes its stdin at once and exits a moment later: the SDK's first write
    meets the closed pipe (its error carries no exit code) or lands before the close (the
    CLI's exit then ends the stream with its code), a race; either way the Turn's start fails
    `ProviderNotCalled` naming the CLI's own exit code, read from its reaped process."""
    script = tmp_path / "claude-closes-stdin"
    script.write_text("#!/bin/sh\nexec 0<&-\nsleep 0.3\nexit 3\n")
    script.chmod(0o755)
    config = ClaudeDriverConfig(model_base_url=harness.server.base_url, cli_path=str(script))
    driver = ClaudeDriver(config, Failpoints())
    try:
        session = harness.start("closes-stdin", driver=driver)
        for n in range(5):
            with pytest.raises(ProviderNotCalled) as raised:
                driver.start_turn(
                    {"agentSessionId": session.agent_session_id, "turnId": f"t{n}", "text": "x"},
                    harness.recorder,
                )
            assert str(raised.value) == (
                f"the Claude Code CLI ({script}) exited with code 3 before it read the prompt"
            )
    finally:
        driver.close()


def test_a_cli_that_continues_in_another_session_fails_the_turn_in_words(
    harness: Harness, tmp_path: Path
) -> None:
    """A Claude Code CLI that, resumed, writes the Turn under a new session id (the real CLI
    with `--fork-session`, as a CLI whose session id moves at each resume would): the Turn is
    not in the Session's own transcript, so the host must not record it `completed` there (its
    next Turn would resume without it, a fork through it would find no such Turn). It fails,
    typed, naming the session the CLI wrote to."""
    import claude_agent_sdk

    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    program = tmp_path / "claude-moving"
    program.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" --resume="*) exec {bundled} "$@" --fork-session ;; esac\n'
        f'exec {bundled} "$@"\n'
    )
    program.chmod(0o755)
    driver = ClaudeDriver(
        ClaudeDriverConfig(model_base_url=harness.server.base_url, cli_path=str(program)),
        Failpoints(),
    )
    try:
        session = harness.start("moving", driver=driver)
        _, first = harness.turn(session, "first", driver=driver)
        assert first["outcome"] == "completed"
        _, second = harness.turn(session, "second", driver=driver)
    finally:
        driver.close()
    others = [
        p.stem
        for p in harness.transcript(session).parent.glob("*.jsonl")
        if p.stem != session.provider_session_id
    ]
    assert len(others) == 1  # the CLI really wrote the second Turn elsewhere
    assert second["outcome"] == "failed", second
    assert second["error"].startswith("provider_protocol_error: "), second
    assert others[0] in second["error"]
