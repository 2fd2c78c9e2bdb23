"""Real git repositories made by tests (an isolated git: no global or system config), and a
wait for a Turn's pending question (a Turn held open while the test changes files)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.daemon import WS, respond, settle, submit, turn_of, wait_for

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_repo(path: Path) -> Path:
    """A small committed repository with an ignored directory and an untracked file."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / ".gitignore").write_text("ignored/\n")
    (path / "a.txt").write_text("one\n")
    (path / "b.txt").write_text("two\n")
    (path / "ignored").mkdir()
    (path / "ignored" / "x.log").write_text("noise\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "first")
    (path / "untracked.txt").write_text("mine\n")
    return path


def pending_request(client: Any, sid: str, turn_id: str, ws: str = WS) -> str:
    def _find() -> str | None:
        for interaction in turn_of(client, sid, turn_id, ws)["interactions"]:
            if interaction["status"] == "pending":
                return str(interaction["requestId"])
        return None

    return str(wait_for(_find, 60))


def turn_changing(
    client: Any, sid: str, change: Callable[[], None], ws: str = WS
) -> dict[str, Any]:
    """Run a Turn that holds on a question while `change()` edits the files (as a provider's
    tools would), then answer it; the settled Turn."""
    turn_id = submit(client, sid, "/ask go on?", ws)["turnId"]
    request_id = pending_request(client, sid, turn_id, ws)
    change()
    respond(client, sid, turn_id, request_id, {"text": "yes"}, ws)
    return settle(client, sid, turn_id, ws)
