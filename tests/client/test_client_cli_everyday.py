"""Everyday use of the CLI against a real daemon, each command a real `agenthost` subprocess:
a prompt that notices an answer given elsewhere, interrupts that say who and why, the session
list's marks and aligned columns, and the small things a new user trips over."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.client.test_client_cli import Cli, new_session, say
from tests.client.test_client_cli_control import (
    last_turn,
    pending_interaction,
    session_of,
    spawn_say,
)
from tests.support.daemon import DaemonProcess, submit, wait_for
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(daemon: DaemonProcess, ws: str) -> Cli:
    return Cli(daemon.home, ws)


def on_tty(cli: Cli, args: list[str], after: str, act: Callable[[], None]) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal; once `after` shows, call `act` (and type nothing)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(cli.home), "--workspace", cli.ws, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    acted = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        if not acted and after.encode() in seen:
            act()
            acted = True
    code = proc.wait(timeout=30)
    os.close(master)
    return code, seen.decode(errors="replace")


def respond(client: Client, ws: str, sid: str, response: dict[str, Any], by: str) -> None:
    waiting = wait_for(lambda: pending_interaction(client, ws, sid))
    client.call(
        "interaction.respond",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "turnId": waiting["turnId"],
            "requestId": waiting["requestId"],
            "response": response,
            "by": by,
        },
    )


# -- a prompt answered elsewhere --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "after", "response", "said", "reply"),
    [
        (
            "/approve make deploy",
            "[y/N] ",
            {"decision": "approve"},
            "answered elsewhere: approval: make deploy  → approved (by the GUI)",
            "approved: make deploy",
        ),
        (
            "/ask which colour?",
            "> ",
            {"text": "teal"},
            'answered elsewhere: question: which colour?  → "teal" (by the GUI)',
            "assistant: teal",
        ),
    ],
)
def test_a_prompt_closes_when_the_interaction_is_answered_elsewhere_and_the_reply_streams_on(
    cli: Cli,
    client: Client,
    ws: str,
    text: str,
    after: str,
    response: dict[str, Any],
    said: str,
    reply: str,
) -> None:
    sid = new_session(cli)
    code, out = on_tty(
        cli, ["say", sid, text], after, lambda: respond(client, ws, sid, response, "gui")
    )
    assert code == 0, out
    assert said in out
    assert reply in out.split(said, 1)[1]  # the reply after the prompt closed
    assert "conflict" not in out and "Traceback" not in out
    assert last_turn(client, ws, sid)["outcome"] == "completed"


def test_an_answer_records_who_gave_it(cli: Cli, client: Client, ws: str) -> None:
    sid = new_session(cli)
    submit(client, sid, "/approve ls", ws)
    wait_for(lambda: pending_interaction(client, ws, sid))
    assert cli.run("answer", sid, "--approve").returncode == 0
    turn = wait_for(lambda: (t := last_turn(client, ws, sid))["phase"] == "settled" and t)
    assert turn["interactions"][0]["output"] == {"decision": "approve", "by": "cli"}
    assert "approval: ls  → approved (by the CLI)" in cli.run("show", sid).stdout


# -- interrupts say who and why ---------------------------------------------------------------


def test_ctrl_c_in_say_records_who_interrupted(cli: Cli, client: Client, ws: str) -> None:
    import signal

    sid = new_session(cli)
    proc = spawn_say(cli, sid, "/slow 30000 never")
    wait_for(lambda: session_of(client, ws, sid)["activeTurnId"])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "turn_interrupted: by Ctrl-C in the CLI" in err
    assert last_turn(client, ws, sid)["error"] == "by Ctrl-C in the CLI"
    assert "interrupted: by Ctrl-C in the CLI" in cli.run("show", sid).stdout


def test_interrupt_command_and_other_clients_give_who_and_why(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli)
    submit(client, sid, "/slow 30000 never", ws)
    done = cli.run("interrupt", sid, "--reason", "taking too long")
    assert done.stdout.strip() == "Turn 1 interrupted by the CLI: taking too long"
    assert "interrupted: by the CLI: taking too long" in cli.run("show", sid).stdout
    turn = submit(client, sid, "/slow 30000 never", ws)
    client.call(
        "turn.interrupt",
        {"workspaceId": ws, "agentSessionId": sid, "turnId": turn["turnId"], "by": "gui"},
    )
    # The reply may come before the provider's end of the Turn: read it once settled.
    got = wait_for(lambda: (t := last_turn(client, ws, sid))["phase"] == "settled" and t)
    assert got["error"] == "by the GUI"
    turn = submit(client, sid, "/slow 30000 never", ws)
    # An old client says nothing: the Turn still says it was a client, not "no reason".
    client.call(
        "turn.interrupt", {"workspaceId": ws, "agentSessionId": sid, "turnId": turn["turnId"]}
    )
    got = wait_for(lambda: (t := last_turn(client, ws, sid))["phase"] == "settled" and t)
    assert got["error"] == "by a client"
    # Who must be a word the daemon knows; the daemon refuses anything else and keeps serving.
    from transport.client import ApiError

    turn = submit(client, sid, "/slow 30000 never", ws)
    with pytest.raises(ApiError) as refused:
        client.call(
            "turn.interrupt",
            {"workspaceId": ws, "agentSessionId": sid, "turnId": turn["turnId"], "by": "x"},
        )
    assert refused.value.reason == "invalid_argument"
    assert cli.run("interrupt", sid).returncode == 0


def test_eof_at_a_question_says_what_it_did(cli: Cli, client: Client, ws: str) -> None:
    from tests.client.test_client_cli_control import run_on_tty

    sid = new_session(cli)
    code, out = run_on_tty(cli, ["say", sid, "/ask colour?"], b"\x04", after="> ")
    assert code == 130
    assert "no answer to the question, so the turn is interrupted" in out
    assert "turn_interrupted: by the CLI: end of input (Ctrl-D) at its question" in out


# -- the small things --------------------------------------------------------------------------


def test_say_refuses_approve_with_decline_as_usage(cli: Cli) -> None:
    sid = new_session(cli)
    done = cli.run("say", sid, "/approve ls", "--approve", "--decline")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_say_dash_reads_the_message_from_stdin(cli: Cli, daemon: DaemonProcess) -> None:
    sid = new_session(cli)
    done = subprocess.run(
        [sys.executable, "-m", "agenthost", "--home", str(cli.home), "--workspace", cli.ws]
        + ["say", sid, "-"],
        input="from a pipe\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "assistant: echo: from a pipe" in done.stdout


def test_say_words_an_approval_and_prints_no_empty_tool_result(cli: Cli) -> None:
    sid = new_session(cli)
    done = cli.run("say", sid, "/approve ls")
    assert "the turn asked for an approval (ls)" in done.stderr
    ok = cli.run("say", sid, "/approve ls", "--approve")
    assert ok.returncode == 0 and "approved: ls" in ok.stdout
    assert "tool_result:" not in ok.stdout
    assert "tool_result:" not in cli.run("show", sid).stdout
    asked = cli.run("say", sid, "/ask colour?")
    assert "the turn asked a question (colour?)" in asked.stderr
    say(cli, sid, "done")


# -- sessions, show, resolve, op ---------------------------------------------------------------


def test_sessions_marks_pinned_and_orphaned_forks_and_keeps_columns_aligned(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli, "Root")
    say(cli, sid, "one")
    child = cli.json("fork", sid, "--through", "1")["mutation"]["childAgentSessionId"]
    say(cli, child, "two")
    grandchild = cli.json("fork", child, "--through", "1")["mutation"]["childAgentSessionId"]
    assert cli.run("pin", sid).returncode == 0
    rows = cli.run("sessions").stdout.splitlines()
    header, body = rows[0], rows[1:]
    title_at = header.index("TITLE")
    by_id = {line.split()[0]: line for line in body}
    assert set(by_id) == {sid, child, grandchild}
    for line in body:  # every row's columns start where the header's do
        assert line.index("can fork") == header.index("FORK")
        assert line[title_at - 2 : title_at] == "  "
    assert by_id[sid][title_at:] == "Root  (pinned)"
    assert by_id[child][title_at:] == "└─ Root (2)"
    assert by_id[grandchild][title_at:] == "   └─ Root (2) (2)"
    cli.json("delete", child, "--yes")
    orphan = next(line for line in cli.run("sessions").stdout.splitlines() if grandchild in line)
    assert orphan[title_at:] == f"Root (2) (2)  (source {child[:8]} deleted)"


def test_show_names_a_deleted_source_once_and_shows_the_live_root(cli: Cli) -> None:
    sid = new_session(cli, "Root")
    say(cli, sid, "one")
    child = cli.json("fork", sid, "--through", "1")["mutation"]["childAgentSessionId"]
    say(cli, child, "two")
    grandchild = cli.json("fork", child, "--through", "1")["mutation"]["childAgentSessionId"]
    cli.json("delete", child, "--yes")
    text = cli.run("show", grandchild).stdout
    assert text.count(child) == 0  # the short id names it; the full id is not repeated
    assert f"forked from (deleted {child[:8]}) through turn" in text
    assert f"ancestry: Root → (deleted {child[:8]}) → Root (2) (2)" in text
    assert f"live root: Root ({sid})" in text


def test_resolve_on_a_committed_fork_says_committed_and_op_ack_confirms(cli: Cli) -> None:
    sid = new_session(cli, "Ops")
    say(cli, sid, "one")
    op_id = cli.json("fork", sid, "--through", "1")["operation"]["operationId"]
    done = cli.run("resolve", op_id[:8])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"operation {op_id} is committed: nothing to resolve")
    assert "adoptable" not in done.stdout
    acked = cli.run("op", op_id, "--ack").stdout.splitlines()
    assert acked[0].startswith("acknowledged: the fork is committed and its turn ")
    assert acked[1] == f"operation {op_id}: committed"  # not "committed (committed)"


def test_references_that_match_nothing_give_a_hint(cli: Cli) -> None:
    sid = new_session(cli, "Hints")
    say(cli, sid, "one")
    missing = cli.run("show", "ffffffffff")
    assert "`agenthost sessions` lists them" in missing.stderr
    turn = cli.run("fork", sid, "--through", "7")
    assert "its turns are 1..1" in turn.stderr
    op = cli.json("op", "no-such-op", code=1)["error"]
    assert op["status"] == 404 and "give the full operation id" in op["message"]
    # Where a person finds it: `show` of a source lists none of its forks, so the hint names
    # what does (the GUI marks an unknown fork by 8 characters, its F3 gives the whole id).
    assert "`agenthost show CHILD` a committed fork's" in op["message"]
    assert "the GUI's details (F3) an unknown fork's" in op["message"]
    new_session(cli, "Second")
    new_session(cli, "Third")
    ambiguous = cli.run("show", "")
    assert "type more of the id" in ambiguous.stderr and "'Hints'" in ambiguous.stderr


def test_the_demo_prints_words_not_raw_json() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "client.demo", "--provider", "tutti-agent"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.lstrip().startswith("{")]
    assert "committed (committed)" not in done.stdout
    assert any(line.startswith("operation ") and line.endswith(": committed") for line in lines)
    assert any(line.startswith("lineage: forked from ") for line in lines)


def test_a_turn_the_host_stopped_says_the_host_interrupted_it(tmp_path: Any) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = str(
            c.call("session.create", {"workspaceId": "default", "provider": "tutti-agent"})[
                "session"
            ]["agentSessionId"]
        )
        submit(c, sid, "/slow 30000 never", "default")
    finally:
        d.stop()
    d = DaemonProcess(home).start()
    try:
        shown = Cli(home, "default").run("show", sid).stdout
        assert "interrupted: by the host: it stopped while this turn ran" in shown
    finally:
        d.stop()


def test_control_characters_from_the_model_or_a_title_are_shown_not_obeyed(
    cli: Cli, client: Client, ws: str
) -> None:
    # What the model, a tool or another client wrote reaches a person's terminal: an escape
    # sequence would be obeyed (clear the screen, recolour, write the clipboard) and a carriage
    # return would hide what came before it, here the real command of an approval.
    from tests.client.test_client_cli_control import run_on_tty

    sid = new_session(cli, "Plain")
    hidden = "rm -rf ~/work\r" + "ls" + " " * 20
    code, out = run_on_tty(cli, ["say", sid, f"/approve {hidden}"], b"n\n", after="? [y/N]")
    assert code == 0, out
    # The prompt's own line (the terminal adds a \r only before each newline).
    prompt = out.split("? [y/N]", 1)[0].rsplit("\n", 1)[1]
    assert "\r" not in prompt and prompt.startswith("approve rm -rf ~/work\\rls"), prompt
    assert cli.run("rename", sid, "evil\x1b[2J\x1b]52;c;aGk=\x07title").returncode == 0
    say(cli, sid, "colour \x1b[31mred\x9b2J")
    for args in (["show", sid], ["sessions"], ["say", sid, "again \x1b[8m"]):
        code, out = run_on_tty(cli, args, b"", after="(never shown)")
        assert code == 0, out
        out = out.replace("\r\n", "\n")  # the terminal's own line ends
        for raw in ("\x1b", "\x07", "\x9b", "\r"):
            assert raw not in out, (args, out)
        if args[0] == "show":
            assert "evil\\x1b[2J\\x1b]52;c;aGk=\\x07title" in out, out
            assert "colour \\x1b[31mred\\x9b2J" in out, out
    # A pipe or a file gets the text as it is (`agenthost diff S > x.patch` must apply).
    assert "colour \x1b[31mred\x9b2J" in cli.run("show", sid).stdout
    # The session keeps its text: --json carries it as it is.
    assert cli.json("show", sid)["session"]["title"] == "evil\x1b[2J\x1b]52;c;aGk=\x07title"


# Every bidirectional formatting character (embeddings, overrides, isolates and the three marks).
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def test_bidi_overrides_in_a_title_or_a_reply_are_shown_not_obeyed(
    cli: Cli, client: Client, ws: str
) -> None:
    # A right-to-left override makes a terminal draw what follows it reversed: a title stored
    # as "report\u202efdp.exe" reads "reportexe.pdf", and an id-like title can pass for
    # another session's. Each such character is shown as its escape, as a control is.
    from tests.client.test_client_cli_control import run_on_tty

    sid = new_session(cli, "Plain")
    title = "report\u202efdp.exe " + BIDI
    assert cli.run("rename", sid, title).returncode == 0
    say(cli, sid, "reply \u2067olleh\u2069 done")
    for args in (["show", sid], ["sessions"], ["say", sid, "again \u202d!"]):
        code, out = run_on_tty(cli, args, b"", after="(never shown)")
        assert code == 0, out
        for raw in BIDI:
            assert raw not in out, (args, hex(ord(raw)), out)
        if args[0] == "say":
            assert "again \\u202d!" in out, out
        else:
            assert "report\\u202efdp.exe" in out, (args, out)
        if args[0] == "show":
            assert "reply \\u2067olleh\\u2069 done" in out, out
    # The session keeps its text: --json carries it as it is, a pipe gets it as it is.
    assert cli.json("show", sid)["session"]["title"] == title
    assert "reply \u2067olleh\u2069 done" in cli.run("show", sid).stdout
