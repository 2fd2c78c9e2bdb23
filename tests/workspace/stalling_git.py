"""A `git` for PATH that is the real one, except that once armed it stalls one command as a
git on a stalled disk would: holding the lock file that command takes (`index.lock` of the
index it writes for `add`, `write-tree`, `read-tree`; `packed-refs.lock` for `gc` and for
`update-ref`, as a ref transaction that deletes takes it), with a child process of its own (as
`gc` starts `pack-objects`), until it is killed. The daemon's timeout is what ends it. Only a
git given a repository by `GIT_DIR` (the checkpoints' shadow repositories) takes the arm."""

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
want=""
if [ -n "$GIT_DIR" ] && [ -e "{arm}" ]; then
  read -r want < "{arm}" 2>/dev/null
  [ -n "$want" ] || want="{command}"
fi
if [ -n "$want" ] && [ "$sub" = "$want" ] && mv "{arm}" "{arm}.taken" 2>/dev/null; then
  case "$sub" in
    gc|update-ref) lock="$GIT_DIR/packed-refs.lock" ;;
    *) lock="${{GIT_INDEX_FILE:-$GIT_DIR/index}}.lock" ;;
  esac
  echo "$$" > "{stalled}"
  set -C
  : > "$lock" || exit 128
  sleep 300 &
  echo "$!" > "{child}"
  wait
  exit 0
fi
exec "{real}" "$@"
"""


@dataclass(frozen=True, slots=True)
class StallingGit:
    """`bin`: the directory to put first on PATH; `arm()` makes the next `command` stall
    (`arm(other)`: the next `other` instead)."""

    bin: Path
    arm_file: Path
    child_file: Path
    stalled_file: Path

    def arm(self, command: str = "") -> None:
        for f in (self.child_file, self.stalled_file, self.taken_file):
            f.unlink(missing_ok=True)
        self.arm_file.write_text(f"{command}\n" if command else "")

    def disarm(self) -> bool:
        """The arm is withdrawn; False when a git took it first (it stalls or stalled)."""
        try:
            self.arm_file.unlink()
        except FileNotFoundError:
            return False
        return True

    @property
    def taken_file(self) -> Path:
        return self.arm_file.with_name(self.arm_file.name + ".taken")

    def taken(self) -> bool:
        """The armed command ran (and stalled)."""
        return self.taken_file.exists()

    def pids(self) -> list[int]:
        """The stalled git's pid and its child's (those written so far: a file the shell has
        made but not yet written is not read)."""
        out: list[int] = []
        for f in (self.stalled_file, self.child_file):
            with contextlib.suppress(FileNotFoundError, ValueError):
                out.append(int(f.read_text()))
        return out

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


def holds_files(pid: int) -> bool:
    """`pid` still has a file open: a live process, or a killed one not yet past closing its
    files in its exit (gone, a zombie, or past that point it can write nothing more)."""
    try:
        return bool(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return False
