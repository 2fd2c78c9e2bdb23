"""`agenthost fork S --through T --worktree` as a person runs it: the fork prints where the
child's files are (the tree and its branch), `show` and `op` say it again, and a Turn without a
checkpoint of its files is refused in words that say what to do instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.worktree_repos import git, make_repo

pytestmark = pytest.mark.timeout(120)


def cli(home: Path, ws: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), "--workspace", ws, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def as_json(home: Path, ws: str, *args: str) -> Any:
    done = cli(home, ws, "--json", *args)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fork_worktree_prints_where_the_files_are_and_a_refusal_in_words(
    daemon: DaemonProcess, ws: str, tmp_path: Path
) -> None:
    home = daemon.home
    gone = tmp_path / "gone"
    gone.mkdir()
    lost = as_json(home, ws, "new", "--title", "Lost", "--cwd", str(gone))["session"]
    gone.rmdir()  # the folder went away: the Turn's checkpoint is unavailable
    as_json(home, ws, "say", lost["agentSessionId"], "hello")
    refused = cli(home, ws, "fork", lost["agentSessionId"], "--through", "1", "--worktree")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "agenthost: cannot fork through Turn 1 into a new worktree: Turn 1 has no checkpoint "
        f"of its files (the working directory {gone} does not exist); fork without "
        "--worktree to keep working in the same folder (workspace_checkpoint_missing)"
    )

    repo = make_repo(tmp_path / "project")
    sid = as_json(home, ws, "new", "--title", "Parser", "--cwd", str(repo))["session"][
        "agentSessionId"
    ]
    as_json(home, ws, "say", sid, "/write src/app.py print('at turn 1')")
    done = cli(home, ws, "fork", sid, "--through", "1", "--worktree")
    assert done.returncode == 0, done.stderr
    files = [line for line in done.stdout.splitlines() if line.startswith("files: ")]
    assert len(files) == 1
    where, _, branch = files[0].removeprefix("files: ").partition(" on branch ")
    tree = Path(where)
    assert tree.parent == repo.parent / "project.agenthost"
    assert branch.startswith("agenthost/parser-2-")
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD") == branch
    assert (tree / "src" / "app.py").read_text() == "print('at turn 1')"

    child = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("child "))
    shown = cli(home, ws, "show", child)
    assert f"  files: {tree}" in shown.stdout.splitlines()
    op_id = next(
        line.split()[1] for line in done.stdout.splitlines() if line.startswith("operation ")
    )
    op = cli(home, ws, "op", op_id)
    assert f"  files: {tree} on branch {branch}" in op.stdout.splitlines()
