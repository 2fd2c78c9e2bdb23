"""Claude Code CLIs started ahead of a Session's next Turn, through the real SDK + bundled CLI:
the next Turn runs on the CLI started when the last one ended (and continues the conversation),
a permission request of that Turn is still an Interaction, a transcript changed meanwhile or a
stopped Session ends the parked CLI, and `warm_clis = 0` or the idle limit leave none."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.claude.driver import ClaudeDriver
from drivers.claude.env import ClaudeDriverConfig
from drivers.claude.warm import Cli
from drivers.failpoints import Failpoints
from model_fakes.messages import MessagesServer, model_input_texts, tool_result
from tests.claude.conftest import ClaudeSession, Harness
from tests.claude.test_claude_interactions import BASH, begin, respond, tool_reply
from tests.support.daemon import wait_for

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with MessagesServer(reply=tool_reply) as server:
        h = Harness(tmp_path_factory.mktemp("claude-warm"), server)
        try:
            yield h
        finally:
            h.driver.close()


def parked(driver: ClaudeDriver, session: ClaudeSession) -> Cli:
    """The CLI parked for the Session's next Turn, once it has been started."""
    return wait_for(lambda: driver.turns.warm.parked(session.agent_session_id), timeout=30)


def pid_of(cli: Cli) -> int:
    return int(wait_for(lambda: getattr(getattr(cli.transport, "_process", None), "pid", None)))


def exited(pid: int) -> bool:
    """The process is gone (reaped by the SDK, or a zombie nobody waits on any more). A
    process reaped between the open and the read answers the read with ESRCH."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def turn_pid(driver: ClaudeDriver, session: ClaudeSession, text: str, h: Harness) -> int:
    """Starts a Turn, notes the pid of the CLI it runs on, and waits for it to complete."""
    turn_id = f"turn-{uuid.uuid4()}"
    driver.start_turn(
        {"agentSessionId": session.agent_session_id, "turnId": turn_id, "text": text},
        h.recorder,
    )
    state = driver._session(session.agent_session_id).active
    pid = pid_of_transport(state.transport) if state is not None else -1
    assert h.recorder.wait_completed(turn_id)["outcome"] == "completed"
    return pid


def pid_of_transport(transport: Any) -> int:
    return int(getattr(getattr(transport, "_process", None), "pid", -1) or -1)


def test_the_next_turn_runs_on_the_cli_started_when_the_last_one_ended(warm: Harness) -> None:
    session = warm.start("next")
    _, first = warm.turn(session, "first words")
    assert first["outcome"] == "completed"
    cli = parked(warm.driver, session)
    pid = pid_of(cli)
    assert not exited(pid)  # waiting on its stdin for the next prompt
    used = turn_pid(warm.driver, session, "second words", warm)
    assert used == pid
    assert exited(pid)  # the Turn's CLI ends with the Turn, as a cold one does
    # It resumed the Session: the model saw the first Turn in the second one's request.
    seen = model_input_texts(warm.server.requests[-1])
    assert seen == [
        ("user", "first words"),
        ("assistant", "echo: first words"),
        ("user", "second words"),
    ]
    # And a new one is parked for the Turn after.
    assert pid_of(parked(warm.driver, session)) != pid


def test_a_permission_request_on_a_parked_cli_is_an_interaction_of_its_turn(
    warm: Harness,
) -> None:
    session = warm.start("asks")
    warm.turn(session, "hello")
    pid = pid_of(parked(warm.driver, session))
    marker = session.cwd / "warm-approved.txt"
    turn_id, asked = begin(warm, session, f"{BASH}echo warm > {marker.name}")
    active = warm.driver._session(session.agent_session_id).active
    assert active is not None and pid_of_transport(active.transport) == pid
    assert asked["kind"] == "approval" and asked["turnId"] == turn_id
    respond(warm, session, asked["requestId"], {"decision": "approve"})
    assert warm.recorder.wait_completed(turn_id)["outcome"] == "completed"
    assert marker.read_text().strip() == "warm"
    result = tool_result(warm.server.requests[-1])
    assert result is not None and not result.get("is_error")


def test_a_transcript_changed_after_the_cli_was_parked_gets_a_new_cli(warm: Harness) -> None:
    session = warm.start("changed")
    warm.turn(session, "before the change")
    pid = pid_of(parked(warm.driver, session))
    transcript = warm.transcript(session)
    # Something other than this Session's CLI appended to its history while it waited.
    with open(transcript, "a", encoding="utf-8") as fh:
        fh.write('{"type":"summary","summary":"written elsewhere"}\n')
    used = turn_pid(warm.driver, session, "after the change", warm)
    assert used not in (pid, -1)
    wait_for(lambda: exited(pid), timeout=30)


def test_a_parked_cli_killed_a_moment_ago_is_not_handed_the_turn(warm: Harness) -> None:
    """A parked CLI SIGKILLed just before its Turn counts as exited at once (its SIGKILL
    pending, or exiting, or a zombie: before the loop has reaped it and set its return code),
    so the Turn starts a CLI of its own and completes, instead of writing its prompt to the
    dying one and failing with its exit."""
    session = warm.start("killed")
    _, first = warm.turn(session, "first words")
    assert first["outcome"] == "completed"
    cli = parked(warm.driver, session)
    pid = pid_of(cli)
    os.kill(pid, signal.SIGKILL)
    assert cli.process_exited()
    used = turn_pid(warm.driver, session, "second words", warm)
    assert used != pid


def test_stopping_a_session_ends_its_parked_cli(warm: Harness) -> None:
    session = warm.start("stopped")
    warm.turn(session, "one turn")
    pid = pid_of(parked(warm.driver, session))
    warm.driver.stop_session({"agentSessionId": session.agent_session_id})
    wait_for(lambda: exited(pid), timeout=30)
    assert warm.driver.turns.warm.parked(session.agent_session_id) is None


def driver_with(h: Harness, **config: Any) -> ClaudeDriver:
    return ClaudeDriver(
        ClaudeDriverConfig(model_base_url=h.server.base_url, **config), Failpoints()
    )


def test_no_cli_is_parked_with_warm_clis_zero(warm: Harness) -> None:
    driver = driver_with(warm, warm_clis=0)
    try:
        session = warm.start("cold", driver=driver)
        warm.turn(session, "one", driver=driver)
        first = turn_pid(driver, session, "two", warm)
        assert driver.turns.warm.parked(session.agent_session_id) is None
        assert first != -1
    finally:
        driver.close()


def test_a_parked_cli_ends_after_the_idle_limit_and_the_next_turn_starts_its_own(
    warm: Harness,
) -> None:
    driver = driver_with(warm, warm_idle_s=0.5)
    try:
        session = warm.start("idle", driver=driver)
        warm.turn(session, "one", driver=driver)
        pid = pid_of(parked(driver, session))
        wait_for(lambda: exited(pid), timeout=30)
        assert driver.turns.warm.parked(session.agent_session_id) is None
        _, completed = warm.turn(session, "two", driver=driver)
        assert completed["outcome"] == "completed"
    finally:
        driver.close()


def test_closing_the_driver_ends_every_parked_cli(warm: Harness) -> None:
    driver = driver_with(warm)
    session = warm.start("closing", driver=driver)
    warm.turn(session, "one", driver=driver)
    pid = pid_of(parked(driver, session))
    driver.close()
    wait_for(lambda: exited(pid), timeout=30)
    assert driver.turns.warm.parked(session.agent_session_id) is None


def test_a_parked_cli_that_ended_unseen_before_its_prompt_gives_way_to_one_of_its_own(
    warm: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parked CLI that ended after the driver's liveness check passed it but before its
    Turn's prompt was handed to it (a SIGKILL inside the kernel's instant `/proc` does not show:
    taken from the pending set, the task not yet marked exiting — stood in for here by passing
    the check of one already ended, the only part not real): the Turn starts a CLI of its own
    and completes, and the model is asked for it once, continuing the conversation."""
    session = warm.start("unseen")
    _, first = warm.turn(session, "first words")
    assert first["outcome"] == "completed"
    cli = parked(warm.driver, session)
    pid = pid_of(cli)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cli.first.done() and exited(pid), timeout=30)
    usable = Cli.usable
    monkeypatch.setattr(Cli, "usable", lambda self: self is cli or usable(self))
    asked = len(warm.server.requests)
    used = turn_pid(warm.driver, session, "second words", warm)
    assert used not in (pid, -1)
    assert [model_input_texts(r)[-1] for r in warm.server.requests[asked:]] == [
        ("user", "second words")
    ]
    assert model_input_texts(warm.server.requests[-1])[0] == ("user", "first words")


def test_a_cli_program_replaced_while_a_cli_is_parked_gets_a_new_cli(
    warm: Harness, tmp_path: Path
) -> None:
    """The configured Claude Code program replaced on disk (an upgrade) while a CLI of the old
    one is parked: the next Turn starts the new program (the host re-attests a new program by
    its identity), and the parked one ends."""
    import claude_agent_sdk

    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    program = tmp_path / "claude"

    def install(marker: Path | None) -> None:
        touch = f"touch {marker}\n" if marker is not None else ""
        staged = tmp_path / "claude.new"
        staged.write_text(f'#!/bin/sh\n{touch}exec {bundled} "$@"\n')
        staged.chmod(0o755)
        os.replace(staged, program)  # a new file at the same path, as an upgrade writes

    install(None)
    driver = driver_with(warm, cli_path=str(program))
    try:
        session = warm.start("upgraded", driver=driver)
        warm.turn(session, "before the upgrade", driver=driver)
        pid = pid_of(parked(driver, session))
        marker = tmp_path / "new-program-ran"
        install(marker)
        used = turn_pid(driver, session, "after the upgrade", warm)
        assert used not in (pid, -1)
        assert marker.exists()  # the Turn ran the new program
        wait_for(lambda: exited(pid), timeout=30)
    finally:
        driver.close()
