"""A `git` for PATH that is the real one, except that once armed it stalls one command as a
git on a stalled disk would: holding the lock file that command takes (`index.lock` of the
index it writes for `add`, `packed-refs.lock` for `gc`), with a child process of its own (as
`gc` starts `pack-objects`), until it is killed. The daemon's timeout is what ends it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = """#!/bin/sh
# The command: the first argument that is not a `-c <item>` pair.
sub=""
skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  if [ "$a" = "-c" ]; then skip=1; continue; fi
  sub="$a"
  break
done
if [ "$sub" = "{command}" ] && mv "{arm}" "{arm}.taken" 2>/dev/null; then
  if [ "$sub" = "gc" ]; then lock="$GIT_DIR/packed-refs.lock"
  else lock="${{GIT_INDEX_FILE:-$GIT_DIR/index}}.lock"; fi
  set -C
  : > "$lock" || exit 128
  sleep 300 &
  echo "$!" > "{child}"
  echo "$$" > "{stalled}"
  wait
  exit 0
fi
exec "{real}" "$@"
"""


@dataclass(frozen=True, slots=True)
class StallingGit:
    """`bin`: the directory to put first on PATH; `arm()` makes the next `command` stall."""

    bin: Path
    arm_file: Path
    child_file: Path
    stalled_file: Path

    def arm(self) -> None:
        self.arm_file.write_text("")

    def taken(self) -> bool:
        """The armed command ran (and stalled)."""
        return self.arm_file.with_name(self.arm_file.name + ".taken").exists()

    def pids(self) -> list[int]:
        """The stalled git's pid and its child's (those written so far)."""
        return [int(f.read_text()) for f in (self.stalled_file, self.child_file) if f.exists()]

    def kill_left(self) -> None:
        """At a test's end: kill what of the stall is still running (a daemon whose kill
        missed them leaves them; the test has failed then)."""
        for pid in self.pids():
            if running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def stalling_git(where: Path, command: str) -> StallingGit:
    real = shutil.which("git")
    assert real is not None
    where.mkdir(parents=True, exist_ok=True)
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    stall = StallingGit(bin_dir, where / "armed", where / "child.pid", where / "stalled.pid")
    script = bin_dir / "git"
    script.write_text(
        _SCRIPT.format(
            command=command,
            arm=stall.arm_file,
            child=stall.child_file,
            stalled=stall.stalled_file,
            real=real,
        )
    )
    script.chmod(0o755)
    return stall


def running(pid: int) -> bool:
    """`pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def path_with(bin_dir: Path) -> str:
    return os.pathsep.join([str(bin_dir), os.environ.get("PATH", "/usr/bin:/bin")])
