"""A daemon home whose git stalls on demand: the set-up the git-killed tests share
(tests/daemon/test_checkpoint_git_killed.py, tests/daemon/test_restore_git_killed.py). A home
with a workspace timeout, a folder holding one file, a real git behind a PATH wrapper that
stalls one chosen git command once armed, and the real daemon started with that PATH."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.workspace.stalling_git import StallingGit, path_with, stalling_git


@dataclass(frozen=True)
class StallingGitHome:
    home: Path
    folder: Path
    """The Session's folder: `a.txt` holding "a\\n"."""
    stall: StallingGit
    daemon: DaemonProcess


@contextmanager
def stalling_git_home(tmp_path: Path, command: str, timeout_s: float) -> Iterator[StallingGitHome]:
    """The daemon started on a home under `tmp_path` whose `[workspace] timeout_s` is
    `timeout_s`, with a git that stalls `command` once armed; stopped (and any stalled git
    killed) on the way out."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(f"[workspace]\ntimeout_s = {timeout_s}\n")
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    stall = stalling_git(tmp_path / "stall", command)
    daemon = DaemonProcess(home, env={"PATH": path_with(stall.bin)}).start()
    try:
        yield StallingGitHome(home, folder, stall, daemon)
    finally:
        daemon.stop()
        stall.kill_left()
