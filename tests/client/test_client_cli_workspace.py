"""The workspace commands as a person types them, each a real `agenthost` subprocess against a
real daemon, in a real git repository: `show` lists each Turn's changed files, `diff` prints
them and the unified diff (of a Turn, or between two), `restore` puts the folder back, says
how to undo it, and refuses a folder another live session works in unless `--force`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.test_client_cli import Cli
from tests.support.daemon import DaemonProcess
from tests.support.git_repos import make_repo, turn_changing
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cli(daemon: DaemonProcess, ws: str) -> Cli:
    return Cli(daemon.home, ws)


def test_show_diff_and_restore_from_the_cli(
    cli: Cli, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    sid = cli.json("new", "--title", "Edit", "--cwd", str(repo))["session"]["agentSessionId"]

    def _edit() -> None:
        (repo / "a.txt").write_text("one\nfixed\n")
        (repo / "b.txt").unlink()
        (repo / "notes.md").write_text("notes\n")

    first = turn_changing(client, sid, _edit, ws=ws)
    second = turn_changing(client, sid, lambda: (repo / "c.txt").write_text("c\n"), ws=ws)

    shown = cli.run("show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "files (3 changed): M a.txt, D b.txt, A notes.md" in shown.stdout
    assert "files (1 changed): A c.txt" in shown.stdout

    one = cli.run("diff", sid, "--turn", "1")
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith(f"turn {first['turnId']} in ")
    assert "3 file(s) changed: M a.txt, D b.txt, A notes.md" in one.stdout
    assert "+fixed" in one.stdout and "-two" in one.stdout
    newest = cli.run("diff", sid)
    assert f"turn {second['turnId']}" in newest.stdout and "A c.txt" in newest.stdout
    between = cli.run("diff", sid, "--turn", "2", "--from", "1")
    assert "1 file(s) changed: A c.txt" in between.stdout and "+c" in between.stdout

    # Another live session in the same folder: refused in words, nothing written.
    cli.json("new", "--title", "Neighbour", "--cwd", str(repo))
    refused = cli.run("restore", sid, "--turn", "1", "--before")
    assert refused.returncode != 0
    assert "other live sessions" in refused.stderr and "--force" in refused.stderr
    assert (repo / "c.txt").exists()

    done = cli.run("restore", sid, "--turn", "1", "--before", "--force")
    assert done.returncode == 0, done.stderr
    assert "2 file(s) written: " in done.stdout and "2 file(s) removed: " in done.stdout
    assert (repo / "a.txt").read_text() == "one\n" and (repo / "b.txt").exists()
    assert not (repo / "c.txt").exists() and not (repo / "notes.md").exists()
    undo = done.stdout.strip().splitlines()[-1]
    assert undo.startswith(f"undo with: agenthost restore {sid} --undo ")
    back = cli.run(*undo.removeprefix("undo with: agenthost ").split(), "--force")
    assert back.returncode == 0, back.stderr
    assert (repo / "c.txt").read_text() == "c\n" and not (repo / "b.txt").exists()

    status = cli.run("status")
    assert status.returncode == 0 and "checkpoints: on, " in status.stdout, status.stdout
    assert "/checkpoints" in status.stdout.split("checkpoints: on, ", 1)[1]

    unknown = cli.run("diff", sid, "--turn", "9")
    assert unknown.returncode != 0 and "turn_not_found" in unknown.stderr


def test_the_diff_of_a_copied_turn_names_the_source_sessions(
    cli: Cli, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    sid = cli.json("new", "--title", "Edit", "--cwd", str(repo))["session"]["agentSessionId"]
    turn_changing(client, sid, lambda: (repo / "c.txt").write_text("c\n"), ws=ws)
    fork = cli.json("fork", sid, "--latest")
    child = fork["mutation"]["childAgentSessionId"]
    copied = cli.run("diff", child, "--turn", "1")
    assert copied.returncode == 1
    assert f"agenthost diff {sid} --turn 1" in copied.stderr, copied.stderr
    source = cli.run("diff", sid, "--turn", "1")  # what it points to answers
    assert source.returncode == 0 and "A c.txt" in source.stdout, source.stderr
    wire = cli.json("diff", child, "--turn", "1", code=1)["error"]  # --json: the daemon's error
    assert (wire["reason"], wire["params"]["workspaceReason"]) == (
        "workspace_checkpoint_missing",
        "forked",
    )
