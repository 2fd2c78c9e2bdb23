"""What a person meets using the CLI with input that is off, each a real `agenthost` subprocess
against a real daemon: the error says what to do, with the exit code of what happened (2 for a
usage mistake, caught before anything is sent; 3 for no daemon)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.test_client_cli import Cli, new_session, say
from tests.client.test_client_cli_control import session_of
from tests.support.daemon import DaemonProcess, submit, turn_of, wait_for
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cli(daemon: DaemonProcess, ws: str) -> Cli:
    return Cli(daemon.home, ws)


def session_in(cli: Cli, folder: Path, title: str) -> str:
    """A session working in `folder` (not the folder the tests run from: a restore writes it)."""
    done = cli.json("new", "--title", title, "--cwd", str(folder))
    return str(done["session"]["agentSessionId"])


def test_say_at_a_question_or_approval_names_only_the_option_that_answers_it(cli: Cli) -> None:
    sid = new_session(cli, "Asks")
    question = cli.run("say", sid, "/ask colour?", "--approve")
    assert question.returncode == 1
    assert "interaction_pending" in question.stderr
    assert "run it again with --answer TEXT" in question.stderr
    assert "--approve or --decline" not in question.stderr
    # The turn was interrupted: there is nothing left for `agenthost answer` to answer.
    assert "agenthost answer" not in question.stderr
    approval = cli.run("say", sid, "/approve ls", "--answer", "blue")
    assert approval.returncode == 1
    assert "run it again with --approve or --decline" in approval.stderr
    assert "--answer" not in approval.stderr
    assert "agenthost answer" not in approval.stderr


def test_say_an_empty_message_is_a_usage_error_and_starts_no_turn(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli, "Empty")
    for text in ("", "   "):
        done = cli.run("say", sid, text)
        assert done.returncode == 2, done.stderr
        assert "invalid_argument: the message is empty" in done.stderr
    timeline = client.call("session.timeline", {"workspaceId": ws, "agentSessionId": sid})
    assert timeline["turns"] == []


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--timeout", "0", "status"), "--timeout"),
        (("--timeout", "-1", "sessions"), "--timeout"),
        (("say", "x", "hi", "--turn-timeout", "0"), "--turn-timeout"),
        (("fork", "x", "--latest", "--fork-timeout", "nan"), "--fork-timeout"),
        (("diff", "x", "--max-bytes", "-5"), "--max-bytes"),
    ],
)
def test_a_wait_or_size_out_of_range_is_a_usage_error_not_a_hung_daemon(
    cli: Cli, args: tuple[str, ...], option: str
) -> None:
    done = cli.run(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"argument {option}: must be" in done.stderr
    assert "busy or hung" not in done.stderr and "'maxBytes'" not in done.stderr


def test_delete_force_without_worktree_remove_is_a_usage_error_and_deletes_nothing(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli, "Kept")
    done = cli.run("delete", sid, "--force", "--yes")
    assert done.returncode == 2, done.stderr
    assert "--force only goes with --worktree remove" in done.stderr
    keep = cli.run("delete", sid, "--worktree", "keep", "--force", "--yes")
    assert keep.returncode == 2, keep.stderr
    assert session_of(client, ws, sid)["title"] == "Kept"


def test_restore_names_the_undo_option_and_says_how_the_turn_left_the_folder(
    cli: Cli, tmp_path: Path
) -> None:
    sid = session_in(cli, tmp_path, "Files")
    say(cli, sid, "/write notes.txt hello")
    bad = cli.run("restore", sid, "--undo", "deadbeef")
    assert bad.returncode == 2, bad.stderr
    assert "--undo 'deadbeef': give the id a restore printed" in bad.stderr
    assert "tree must be" not in bad.stderr
    both = cli.run("restore", sid, "--undo", "0" * 40, "--before")
    assert both.returncode == 2, both.stderr
    assert "--before goes with --turn" in both.stderr
    before = cli.run("restore", sid, "--turn", "1", "--before")
    assert before.returncode == 0, before.stderr
    assert f"restored {tmp_path} as turn " in before.stdout
    assert "found it: 1 file(s) removed: notes.txt" in before.stdout
    assert not (tmp_path / "notes.txt").exists()


def test_say_on_a_busy_session_says_how_to_wait_or_stop_the_running_turn(
    cli: Cli, client: Client, ws: str
) -> None:
    sid = new_session(cli, "Busy")
    submit(client, sid, "/slow 30000 long", ws=ws)
    wait_for(lambda: session_of(client, ws, sid)["activeTurnId"])
    done = cli.run("say", sid, "another")
    assert done.returncode == 1
    assert "agent_session_busy" in done.stderr
    assert f"`agenthost interrupt {sid}`" in done.stderr
    assert cli.run("interrupt", sid).returncode == 0


def test_a_home_that_does_not_exist_or_is_a_file_is_named_as_such(cli: Cli, tmp_path: Path) -> None:
    missing = cli.run("status", home=tmp_path / "no-such-home")
    assert missing.returncode == 3
    assert "daemon_unreachable" in missing.stderr and "it does not exist" in missing.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("not a home\n")
    not_dir = cli.run("sessions", home=a_file)
    assert not_dir.returncode == 3
    assert "it is not a directory" in not_dir.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--connect", "garbage", "status"),
        ("--connect", "tcp://127.0.0.1", "status"),
        ("--connect", "tcp://127.0.0.1:99999", "status"),
        ("--events", "localhost:7778", "sessions"),
    ],
)
def test_an_endpoint_that_is_not_one_is_a_usage_error_not_a_traceback(
    cli: Cli, args: tuple[str, ...]
) -> None:
    done = cli.run(*args)
    assert done.returncode == 2, done.stderr
    assert "not an endpoint" in done.stderr and "tcp://HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr


def test_help_texts_say_what_the_program_does(cli: Cli) -> None:
    def help_of(command: str) -> str:
        done = cli.run(command, "--help")
        assert done.returncode == 0, done.stderr
        return " ".join(done.stdout.split())  # argparse wraps lines

    # --latest needs the capability the daemon names for it (docs/user-guide.md says so too).
    assert "lifecycleCapabilities.forkFullSession" in help_of("fork")
    assert "operation the fork's operation id" in help_of("resolve")
    # A message that starts with `-` is taken for an option unless `--` comes first.
    assert "put `--` before it" in help_of("say")
    # Without a terminal a delete is refused unless --yes, so --yes is what keeps by default.
    assert "keep its worktree (the default with --yes)" in help_of("delete")


def test_new_with_a_cwd_that_is_a_file_says_it_is_not_a_directory(cli: Cli, tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hi\n")
    done = cli.run("new", "--cwd", str(a_file))
    assert done.returncode == 2
    assert f"invalid_cwd: --cwd '{a_file}': not a directory" in done.stderr
    missing = cli.run("new", "--cwd", str(tmp_path / "gone"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr


@pytest.mark.parametrize(
    ("command", "choices"), [("keys", "{add,revoke,list}"), ("providers", "{install}")]
)
def test_a_missing_subcommand_names_its_choices_not_an_internal_name(
    cli: Cli, command: str, choices: str
) -> None:
    done = cli.run(command)
    assert done.returncode == 2
    assert f"the following arguments are required: {choices}" in done.stderr
    assert "_command" not in done.stderr


def test_keys_add_without_a_tcp_endpoint_says_what_to_configure(cli: Cli) -> None:
    done = cli.run("keys", "add", "laptop-ipc-only")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["api"] is None
    assert done.stderr.startswith(
        'agenthost: warning: the daemon listens on no TCP endpoint, so this file\'s "api" is null'
    )
    assert "listen = [" in done.stderr and "--listen tcp://127.0.0.1:7777" in done.stderr


@pytest.mark.parametrize(("name", "where"), [("lost-a", "missing/dir/x.json"), ("lost-b", "a-dir")])
def test_keys_add_whose_file_cannot_be_written_says_so_and_authorizes_nothing(
    cli: Cli, tmp_path: Path, name: str, where: str
) -> None:
    (tmp_path / "a-dir").mkdir()
    output = tmp_path / where
    done = cli.run("keys", "add", name, "-o", str(output))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"agenthost: bad_output: cannot write {output}: ")
    assert f"{name!r} not added" in done.stderr
    # Its secret key went nowhere: the public one is not left authorized, the name is free.
    assert name not in cli.run("keys", "list").stdout.split()
    again = cli.run("keys", "add", name, "-o", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["api"] is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("new", "--title", ""), "invalid_argument: --title is empty"),
        (("new", "--model", ""), "invalid_argument: --model is empty"),
        (("rename", "{sid}", ""), "invalid_argument: the title is empty"),
    ],
)
def test_an_empty_title_or_model_is_a_usage_error_and_changes_nothing(
    cli: Cli, client: Client, ws: str, args: tuple[str, ...], said: str
) -> None:
    sid = new_session(cli, "Named")
    done = cli.run(*(a.format(sid=sid) for a in args))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said in done.stderr
    sessions = client.call("session.list", {"workspaceId": ws})["sessions"]
    assert [s["title"] for s in sessions] == ["Named"]


def test_restore_says_written_and_removed_apart(cli: Cli, tmp_path: Path) -> None:
    sid = session_in(cli, tmp_path, "Both")
    say(cli, sid, "/write kept.txt one")
    say(cli, sid, "/write kept.txt two")
    say(cli, sid, "/write added.txt new")
    done = cli.run("restore", sid, "--turn", "2", "--before")
    assert done.returncode == 0, done.stderr
    assert "1 file(s) written: M kept.txt; 1 file(s) removed: added.txt" in done.stdout
    assert (tmp_path / "kept.txt").read_text() == "one" and not (tmp_path / "added.txt").exists()


def test_say_in_a_removed_folder_warns_on_stderr(cli: Cli, tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    sid = session_in(cli, folder, "Gone")
    folder.rmdir()
    done = cli.run("say", sid, "hello")
    assert done.returncode == 0, done.stderr
    assert "echo: hello" in done.stdout and "cwd_missing" not in done.stdout
    assert done.stderr.startswith(
        f"agenthost: warning: cwd_missing: the working directory {folder} does not exist; "
    )
    # With --json too: stdout stays one JSON object a line.
    done = cli.run("--json", "say", sid, "again")
    assert "agenthost: warning: cwd_missing" in done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["turn"]["workspace"]["reason"] == "cwd_missing"


def test_show_says_a_turn_was_never_sent_to_the_provider_not_binding_unavailable(
    tmp_path: Path, ws: str
) -> None:
    """A Turn the provider never got (its program is broken: the runtime never started) blocks
    no fork: `show` says it was never sent, not `binding unavailable` (the words of a Turn
    that does block forks), and `show --json` carries `hostOnly`."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text('[providers.tutti-agent]\ncommand = "/bin/false"\n')
    d = DaemonProcess(home).start()
    try:
        cli = Cli(home, ws)
        sid = new_session(cli, "Broken")
        c = d.client()
        try:
            turn_id = submit(c, sid, "never sent", ws)["turnId"]
            wait_for(lambda: turn_of(c, sid, turn_id, ws)["phase"] == "settled")
        finally:
            c.close()
        show = cli.run("show", sid)
        assert show.returncode == 0, show.stderr
        (line,) = [s for s in show.stdout.splitlines() if s.strip().startswith("Turn 1 ")]
        assert line.endswith("[settled/failed, never sent to the provider]"), line
        assert "binding" not in line, line
        (turn,) = cli.json("show", sid)["turns"]
        assert turn["hostOnly"] is True and turn["providerForkBindingState"] == "unavailable"
    finally:
        d.stop()


@pytest.mark.parametrize("stdin_errors", ["surrogateescape", "strict"])
def test_bytes_that_are_not_utf8_are_a_usage_error_not_a_traceback(
    cli: Cli, client: Client, ws: str, stdin_errors: str
) -> None:
    sid = new_session(cli, "Bytes")
    base = [sys.executable, "-m", "agenthost.cli", "--home", str(cli.home), "--workspace", ws]
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": f"utf-8:{stdin_errors}"}
    # An argument: the locale escapes the byte as a lone surrogate, which msgpack cannot encode.
    for args in (["settings", sid, "k\udcff=1"], ["say", sid, "caf\udce9"], ["sessions"]):
        argv = [*base, *args] if args != ["sessions"] else [*base[:-1], "w\udcff", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert "invalid_argument: " in done.stderr and "is not UTF-8 text" in done.stderr
    # Standard input: escaped (as under C.UTF-8) or refused by a strict decoder.
    piped = subprocess.run(
        [*base, "say", sid, "-"], input=b"\xff\xfehello\n", capture_output=True, timeout=60, env=env
    )
    assert piped.returncode == 2, piped.stderr
    assert piped.stderr == b"agenthost: invalid_argument: say -: standard input is not UTF-8 text\n"
    timeline = client.call("session.timeline", {"workspaceId": ws, "agentSessionId": sid})
    assert timeline["turns"] == []


def test_a_terminal_that_is_not_utf8_gets_question_marks_not_a_traceback(
    daemon: DaemonProcess, ws: str
) -> None:
    # PYTHONIOENCODING stands for a terminal whose locale is Latin-1 (LANG=…ISO-8859-1): its
    # stdout cannot encode a star, an em dash or a CJK character.
    cli = Cli(daemon.home, ws)
    sid = new_session(cli, "Plain")
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "agenthost.cli", "--home", str(daemon.home)]
        return subprocess.run(
            [*argv, "--workspace", ws, *args],
            capture_output=True,
            env=env,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    runs = {
        "rename": run("rename", sid, "★ star 日本"),
        "say": run("say", sid, "hello ★ 日本"),
        "sessions": run("sessions"),
        "show": run("show", sid),
        "tree": run("tree", sid),
    }
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr.decode("latin-1"))
        assert b"Traceback" not in done.stderr, name
    assert b"? star ??" in runs["sessions"].stdout
    assert b"assistant: echo: hello ? ??" in runs["say"].stdout
    # What the terminal can show is shown as it is: Latin-1 has é.
    assert run("rename", sid, "café").stdout.endswith("caf\xe9\n".encode("latin-1"))
    # The session itself keeps its title, whatever one terminal could show of it.
    assert say(cli, sid, "again")["outcome"] == "completed"
    assert cli.json("show", sid)["session"]["title"] == "café"


def test_an_empty_workspace_is_a_usage_error_caught_before_anything_is_sent(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # `--workspace "$WS"` with WS unset: a usage mistake (exit 2), as `--home ""` is; not the
    # daemon's refusal (exit 1), and said the same whether a daemon runs or not (exit 3).
    for home in (daemon.home, tmp_path / "no-daemon-here"):
        cli = Cli(home, "")
        for args in (["sessions"], ["new", "--title", "T"], ["show", "abc"]):
            done = cli.run(*args)
            assert done.returncode == 2, (home, args, done.stderr)
            assert "--workspace" in done.stderr and "empty" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
    assert Cli(daemon.home, "default").run("sessions").returncode == 0


def test_a_message_past_the_request_limit_is_refused_in_words_with_both_sizes(
    cli: Cli, client: Client, ws: str
) -> None:
    """A message too large for one request (`say SID -` from a file of 3 MiB): the daemon's 413
    `payload_too_large` reads as the message's size and the limit in MiB, and what to do — not
    the frame's byte counts — and no Turn starts."""
    sid = new_session(cli, "Big")
    done = subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(cli.home), "--workspace", ws]
        + ["say", sid, "-"],
        input="x" * (3 << 20),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    words = "payload_too_large: the request is too large (3.0 MiB; a request holds at most 1 MiB)"
    assert words in done.stderr, done.stderr
    assert "bytes exceeds" not in done.stderr
    timeline = client.call("session.timeline", {"workspaceId": ws, "agentSessionId": sid})
    assert timeline["turns"] == []
