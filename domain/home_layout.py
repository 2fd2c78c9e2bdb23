"""The layout of a daemon's home, `AGENTHOST_HOME`, as both the daemon and its clients see it:
where the home is by default, the names of the ipc sockets and of the lock under `run/`, and
the look at that lock that tells a client whether a daemon lives (`probe_home`).

Standard library only, so the client finds and probes the daemon without importing it; the
daemon's side of the lock (taking it, writing its pid) is `agenthost.home`.

The lock is an exclusive `flock` on `run/daemon.lock` that a daemon holds for its whole life;
the kernel drops it when the holder dies (SIGKILL included), so a free lock means no daemon
serves the home, now. The holder writes its pid into the file, for the messages that name it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "AGENTHOST_HOME"
RUN_DIR = "run"
API_SOCKET = "api.sock"
EVENTS_SOCKET = "events.sock"
EVENTS_EXACT_SOCKET = "events-exact.sock"
"""The terminated-topic events socket (topic `workspaceId + "\\0"`, issue 15 #9)."""
LOCK_NAME = "daemon.lock"


def default_home() -> Path:
    """`$AGENTHOST_HOME` (made absolute), else `$XDG_DATA_HOME/agenthost`
    (`~/.local/share/agenthost`)."""
    env = os.environ.get(HOME_ENV)
    if env:
        # Not resolve(): a home that is a symlink must stay visible as one (it is refused).
        return Path(os.path.abspath(Path(env).expanduser()))
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "agenthost"


def run_dir(home: Path) -> Path:
    return home / RUN_DIR


def lock_path(home: Path) -> Path:
    return run_dir(home) / LOCK_NAME


@dataclass(frozen=True)
class Probe:
    """`served` False: no daemon holds the lock (a dead or never-started daemon)."""

    served: bool
    pid: int | None = None


def probe_home(home: Path) -> Probe:
    """Look without disturbing: a shared lock we get at once means nobody holds the home."""
    try:
        fd = os.open(lock_path(home), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return Probe(False)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return Probe(True, read_pid(fd))
            raise
        return Probe(False)
    finally:
        os.close(fd)  # drops our shared lock, if we took it


def read_pid(fd: int) -> int | None:
    """The pid the lock's holder wrote into the lock file (None: none, or unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
