"""Everyday control from the CLI against a real daemon, each command a real
`agenthost` subprocess: interrupt, answer, delete, rename, pin/unpin, settings, `new` options,
Ctrl-C during `say`, EOF at a prompt, `say --json` lines, fork refusals in words, `show`."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from client.session_client import BOUNDARY_REASONS, fork_refusal
from tests.client.test_client_cli import Cli, new_session, say
from tests.support.daemon import DaemonProcess, submit, wait_for
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(daemon: DaemonProcess, ws: str) -> Cli:
    return Cli(daemon.home, ws)


def session_of(client: Client, ws: str, sid: str) -> dict[str, Any]:
    return dict(client.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"])


def last_turn(client: Client, ws: str, sid: str) -> dict[str, Any]:
    turns = client.call(
        "session.timeline", {"workspaceId": ws, "agentSessionId": sid, "limit": 200}
    )["turns"]
    return dict(turns[-1])


def pending_interaction(client: Client, ws: str, sid: str) -> dict[str, Any] | None:
    turn = last_turn(client, ws, sid)
    waiting = [i for i in turn["interactions"] if i["status"] == "pending"]
    return waiting[0] if waiting else None


def spawn_say(cli: Cli, *args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agenthost",
            "--home",
            str(cli.home),
            "--workspace",
            cli.ws,
            "say",
            *args,
        ],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- small commands -------------------------------------------------------------------------


def test_version_and_python_dash_m(cli: Cli) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agenthost", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("agenthost ")
    assert cli.run("status").returncode == 0


def test_every_option_has_help_text() -> None:
    from agenthost.cli import _parser

    parser = _parser()
    missing = []
    subparsers = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001
    for name, sub in [("", parser), *subparsers.choices.items()]:  # type: ignore[union-attr]
        for action in sub._actions:  # noqa: SLF001
            if action.option_strings and not action.help:
                missing.append(f"{name} {action.option_strings}")
    assert missing == []


def test_sessions_has_a_header_row(cli: Cli) -> None:
    new_session(cli, "Header")
    first = cli.run("sessions").stdout.splitlines()[0].split()
    assert first == ["SESSION", "PROVIDER", "FORK", "TITLE"]


def test_output_to_a_closed_pipe_exits_quietly(cli: Cli) -> None:
    sid = new_session(cli, "Long")
    for i in range(3):
        say(cli, sid, f"line {i} " + "x" * 2000)
    cmd = (
        f"{sys.executable} -m agenthost --home {cli.home} --workspace {cli.ws} show {sid}"
        " | head -c 10"
    )
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stderr == ""


def test_new_sends_an_absolute_cwd_settings_and_rejects_a_missing_dir(
    cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "proj").mkdir()
    done = subprocess.run(
        [
            sys.executable, "-m", "agenthost", "--home", str(cli.home), "--workspace", cli.ws,
            "--json", "new", "--cwd", "proj", "--settings", "effort=high", "--settings", "n=3",
        ],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    assert session["cwd"] == str((tmp_path / "proj").resolve())
    assert session["settings"] == {"effort": "high", "n": 3}
    plain = subprocess.run(
        [sys.executable, "-m", "agenthost", "--home", str(cli.home), "--workspace", cli.ws,
         "--json", "new"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert json.loads(plain.stdout)["session"]["cwd"] == str(tmp_path.resolve())
    # --model goes out as session.create's `model` (kept once the daemon stores a per-Session
    # model; a daemon without that keeps its default).
    modelled = cli.json("new", "--model", "mock-model")["session"]
    assert modelled["model"] in ("mock-model", None)
    missing = cli.run("--json", "new", "--cwd", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert json.loads(missing.stdout)["error"]["reason"] == "invalid_cwd"


def test_rename_pin_unpin_and_settings(cli: Cli) -> None:
    sid = new_session(cli, "Old")
    assert cli.json("rename", sid[:8], "New title")["session"]["title"] == "New title"
    assert cli.run("rename", sid, "Human").stdout.strip().endswith("Human")
    assert cli.json("pin", sid)["session"]["pinned"] is True
    assert cli.json("unpin", sid)["session"]["pinned"] is False
    assert cli.json("settings", sid, "a=1", "b=x")["session"]["settings"] == {"a": 1, "b": "x"}
    # Merged, not replaced; null removes a key.
    assert cli.json("settings", sid, "b=null", "c=true")["session"]["settings"] == {
        "a": 1,
        "c": True,
    }
    assert cli.run("settings", sid).stdout.splitlines() == ["a=1", "c=true"]
    bad = cli.run("settings", sid, "novalue")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


def test_delete_asks_unless_yes(cli: Cli, client: Client, ws: str) -> None:
    sid = new_session(cli, "Doomed")
    refused = cli.run("delete", sid)  # stdin is not a terminal: no silent delete
    assert refused.returncode == 1 and "confirmation_required" in refused.stderr
    assert session_of(client, ws, sid)["title"] == "Doomed"
    # On a terminal, "n" keeps it and "y" deletes it.
    assert run_on_tty(cli, ["delete", sid], b"n\n")[0] == 1
    assert session_of(client, ws, sid)["title"] == "Doomed"
    code, out = run_on_tty(cli, ["delete", sid], b"y\n")
    assert code == 0 and "deleted" in out
    assert sid not in {s["agentSessionId"] for s in cli.json("sessions")["sessions"]}
    other = new_session(cli, "Gone too")
    assert cli.json("delete", other, "--yes")["deleted"] is True


def run_on_tty(
    cli: Cli, args: list[str], keys: bytes | None, *, after: str = "? "
) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin/stdout; type `keys` once `after` shows
    (`None`: press Ctrl-C, i.e. SIGINT — the pty is not the child's controlling terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(cli.home), "--workspace", cli.ws, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    typed = False
    prompted_at: float | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # Never block on the terminal: the helper's own deadline must hold.
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break  # the child closed the terminal
            if not chunk:
                break
            seen += chunk
        if prompted_at is None and after.encode() in seen:
            prompted_at = time.monotonic()
        # A person answers a prompt after it is shown, not within the microseconds between
        # the prompt's write and input()'s read (a signal there is lost in the C read).
        if not typed and prompted_at is not None and time.monotonic() - prompted_at > 0.5:
            if keys is None:
                proc.send_signal(signal.SIGINT)
            else:
                os.write(master, keys)
            typed = True
    code = proc.wait(timeout=30)
    os.close(master)
    return code, seen.decode(errors="replace")


# -- interrupt and answer -------------------------------------------------------------------


def test_interrupt_stops_the_running_turn(cli: Cli, client: Client, ws: str) -> None:
    sid = new_session(cli)
    assert cli.run("interrupt", sid).stdout.strip() == "nothing to interrupt: no turn is running"
    turn = submit(client, sid, "/slow 20000 late", ws)
    out = cli.json("interrupt", sid[:8])["turn"]
    assert out["turnId"] == turn["turnId"] and out["outcome"] == "interrupted"
    assert session_of(client, ws, sid)["activeTurnId"] is None


def test_answer_approves_declines_or_replies_to_any_pending_interaction(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli)
    assert cli.json("answer", sid, "--approve", code=1)["error"]["reason"] == (
        "no_pending_interaction"
    )
    # A turn another client started: answer it from here.
    submit(client, sid, "/approve rm -rf build", ws)
    wait_for(lambda: pending_interaction(client, ws, sid))
    wrong = cli.json("answer", sid, "--text", "hi", code=1)["error"]
    assert wrong["reason"] == "wrong_answer_kind"
    done = cli.run("answer", sid, "--approve")
    assert done.returncode == 0 and done.stdout.strip() == "approval: rm -rf build → approved"
    settled = wait_for(lambda: (t := last_turn(client, ws, sid))["phase"] == "settled" and t)
    assert settled["messages"][-1]["text"] == "approved: rm -rf build"
    submit(client, sid, "/approve deploy", ws)
    wait_for(lambda: pending_interaction(client, ws, sid))
    cli.json("answer", sid, "--decline")
    settled = wait_for(lambda: (t := last_turn(client, ws, sid))["phase"] == "settled" and t)
    assert settled["messages"][-1]["text"] == "declined: deploy"
    submit(client, sid, "/ask which colour?", ws)
    wait_for(lambda: pending_interaction(client, ws, sid))
    assert cli.json("answer", sid, "--decline", code=1)["error"]["reason"] == "wrong_answer_kind"
    cli.json("answer", sid, "--text", "teal")
    settled = wait_for(lambda: (t := last_turn(client, ws, sid))["phase"] == "settled" and t)
    assert settled["messages"][-1]["text"] == "teal"
    # The three options are mutually exclusive (and one is required).
    assert cli.run("answer", sid, "--approve", "--text", "x").returncode == 2
    assert cli.run("answer", sid).returncode == 2


# -- say: Ctrl-C, EOF, --json ---------------------------------------------------------------


def test_sigint_during_say_interrupts_the_turn_and_leaves_none_active(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli)
    proc = spawn_say(cli, sid, "/slow 30000 never")
    wait_for(lambda: session_of(client, ws, sid)["activeTurnId"])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert "interrupting the turn" in err and "turn_interrupted" in err
    assert "Traceback" not in err
    assert session_of(client, ws, sid)["activeTurnId"] is None
    assert last_turn(client, ws, sid)["outcome"] == "interrupted"


@pytest.mark.parametrize("parent", ["blocked", "ignored"])
def test_sigint_interrupts_say_even_when_its_parent_blocked_or_ignored_it(
    cli: Cli, client: Client, ws: str, parent: str
) -> None:
    """A signal mask and an ignored SIGINT survive exec: a launcher that had SIGINT blocked
    (or ignored) must not leave `say` deaf to Ctrl-C while its turn runs on."""
    sid = new_session(cli)
    arm = (
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})"
        if parent == "blocked"
        else "signal.signal(signal.SIGINT, signal.SIG_IGN)"
    )
    launcher = f"import os, signal, sys; {arm}; os.execv(sys.executable, sys.argv[1:])"
    command = [sys.executable, "-m", "agenthost", "--home", str(cli.home), "--workspace", ws]
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, *command, "say", sid, "/slow 30000 never"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: session_of(client, ws, sid)["activeTurnId"])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert "interrupting the turn" in err
    assert session_of(client, ws, sid)["activeTurnId"] is None


def test_second_sigint_stops_waiting_and_says_how_to_stop_the_turn(
    cli: Cli, client: Client, ws: str, daemon: DaemonProcess
) -> None:
    sid = new_session(cli)
    proc = spawn_say(cli, sid, "/slow 30000 never")
    wait_for(lambda: session_of(client, ws, sid)["activeTurnId"])
    assert daemon.proc is not None
    # Hold the daemon still so `say` is surely waiting on its interrupt when Ctrl-C comes again.
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        said: list[str] = []
        while not said or "interrupting the turn" not in said[-1]:
            said.append(proc.stderr.readline())
            assert said[-1], f"say ended before announcing the interrupt: {said}"
        proc.send_signal(signal.SIGINT)
        err = proc.stderr.read()
        assert proc.wait(timeout=30) == 130
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    assert "Traceback" not in err, err
    assert "stopped waiting; the turn may still be running" in err
    assert f"`agenthost interrupt {sid}` stops it" in err
    cli.run("interrupt", sid)
    assert session_of(client, ws, sid)["activeTurnId"] is None


@pytest.mark.parametrize(
    ("text", "outcome", "said"),
    [
        ("/approve ls", "completed", "end of input (Ctrl-D): declined the approval"),
        ("/ask colour?", "interrupted", "no answer to the question, so the turn is interrupted"),
    ],
)
def test_eof_at_a_prompt_leaves_no_pending_interaction(
    cli: Cli, client: Client, ws: str, text: str, outcome: str, said: str
) -> None:
    sid = new_session(cli)
    prompt = "[y/N] " if text.startswith("/approve") else "> "
    code, out = run_on_tty(cli, ["say", sid, text], b"\x04", after=prompt)
    assert "Traceback" not in out and "EOFError" not in out, out
    assert said in out
    turn = last_turn(client, ws, sid)
    assert turn["phase"] == "settled" and turn["outcome"] == outcome
    assert pending_interaction(client, ws, sid) is None
    assert session_of(client, ws, sid)["activeTurnId"] is None
    if outcome == "completed":
        assert code == 0 and turn["messages"][-1]["text"] == "declined: ls"
    else:
        assert code == 130


def test_ctrl_c_at_a_prompt_interrupts_the_turn(cli: Cli, client: Client, ws: str) -> None:
    sid = new_session(cli)
    code, out = run_on_tty(cli, ["say", sid, "/approve ls"], None, after="[y/N] ")
    assert code == 130 and "Traceback" not in out, out
    assert last_turn(client, ws, sid)["outcome"] == "interrupted"
    assert pending_interaction(client, ws, sid) is None


def test_say_json_writes_one_object_per_event(cli: Cli) -> None:
    sid = new_session(cli)
    done = cli.run("--json", "say", sid, "/approve ls", "--approve")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    types = [line["type"] for line in lines]
    assert types[-1] == "turn" and lines[-1]["turn"]["outcome"] == "completed"
    messages = [line["message"]["text"] for line in lines if line["type"] == "message"]
    assert messages[0] == "/approve ls" and messages[-1] == "approved: ls"
    assert len(set(messages)) == len(messages)  # each message once
    statuses = [line["interaction"]["status"] for line in lines if line["type"] == "interaction"]
    assert statuses[0] == "pending" and statuses[-1] != "pending"


# -- fork refusals, show ---------------------------------------------------------------------


def test_fork_refusal_in_words_with_the_wire_error(cli: Cli, client: Client, ws: str) -> None:
    sid = new_session(cli, "Busy")
    say(cli, sid, "one")
    say(cli, sid, "two")
    submit(client, sid, "/slow 20000 three", ws)
    done = cli.run("fork", sid, "--through", "2")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "agenthost: cannot fork through Turn 2: Turn 3 is still running (source_turn_active)"
    )
    err = cli.json("fork", sid, "--through", "2", code=1)["error"]
    assert {"status", "code", "reason", "message", "params"} <= set(err)
    assert err["status"] == 409 and err["code"] == "conflict"
    assert err["reason"] == "agent_session_fork_conflict"
    assert err["params"] == {"forkBoundaryReason": "source_turn_active"}
    assert err["message"].startswith("cannot fork through Turn 2: Turn 3 is still running")
    cli.run("interrupt", sid)
    submit(client, sid, "/ask why?", ws)
    wait_for(lambda: pending_interaction(client, ws, sid))
    waiting = cli.run("fork", sid, "--through", "2")
    assert "Turn 4 is waiting for an answer" in waiting.stderr
    assert "(source_interaction_pending)" in waiting.stderr
    cli.run("interrupt", sid)


def test_every_fork_boundary_reason_has_its_sentence() -> None:
    from domain.errors import ForkBoundaryReason

    assert set(BOUNDARY_REASONS) == {r.value for r in ForkBoundaryReason}
    turns = [{"turnId": "t2", "sequence": 2}, {"turnId": "t3", "sequence": 3}]
    sentences = set()
    for reason in ForkBoundaryReason:
        text = fork_refusal(
            "agent_session_fork_conflict",
            {"forkBoundaryReason": reason.value},
            turn_id="t2",
            turns=turns,
            session={"activeTurnId": "t3"},
            message=f"fork boundary rejected: {reason.value}",
        )
        assert text.startswith("cannot fork through Turn 2: ")
        assert text.endswith(f" ({reason.value})")
        assert "fork boundary rejected" not in text  # words, not the machine message
        sentences.add(text)
    assert len(sentences) == len(ForkBoundaryReason)


def test_show_renders_interactions_errors_and_the_whole_ancestry(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli, "A")
    cli.json("say", sid, "/approve ls -la", "--approve")
    cli.json("say", sid, "/ask colour?", "--answer", "blue")
    cli.json("say", sid, "/fail the model broke", code=1)
    text = cli.run("show", sid).stdout
    assert "approval: ls -la  → approved" in text
    assert 'question: colour?  → "blue"' in text
    assert "failed: the model broke" in text
    # A → A (2) → A (2) (2): a child's title numbers the valid forks of its own source.
    child = cli.json("fork", sid, "--through", "1")["mutation"]["childAgentSessionId"]
    grandchild = cli.json("fork", child, "--through", "1")["mutation"]["childAgentSessionId"]
    assert session_of(client, ws, child)["title"] == "A (2)"
    assert session_of(client, ws, grandchild)["title"] == "A (2) (2)"
    assert "ancestry: A → A (2) → A (2) (2)" in cli.run("show", grandchild).stdout
    cli.json("delete", child, "--yes")
    assert f"ancestry: A → (deleted {child[:8]}) → A (2) (2)" in cli.run("show", grandchild).stdout


def test_op_accepts_an_id_prefix(cli: Cli) -> None:
    sid = new_session(cli, "Ops")
    say(cli, sid, "one")
    op_id = cli.json("fork", sid, "--through", "1")["operation"]["operationId"]
    got = cli.json("op", op_id[:8])["operation"]
    assert got["operationId"] == op_id
