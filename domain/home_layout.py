"""The layout of a daemon's home, `AGENTHOST_HOME`, as both the daemon and its clients see it:
where the home is by default, the names of the ipc sockets and of the lock under `run/`, and
the look at that lock that tells a client whether a daemon lives (`probe_home`).

Standard library only, so the client finds and probes the daemon without importing it; the
daemon's side of the lock (taking it, writing its pid) is `agenthost.home`.

The lock is an exclusive `flock` on the home directory itself, held by a daemon for its whole
life. A lock file can be removed under its holder (a cleaner of old files removing `run/`),
after which a second daemon would lock a new file; the directory holds the store, so it cannot
go without the store going with it (and a daemon whose home is moved or removed stops). Not on
the store file: SQLite holds POSIX (fcntl) locks there, which the kernel drops when the process
closes *any* descriptor of that file, so a second descriptor kept for a lock would put SQLite's
own locks at the mercy of its close. The kernel drops the flock when its holder dies (SIGKILL
included), so a free lock means no daemon serves the home, now. The holder also holds
`run/daemon.lock` (a daemon of an older version locks only that file, and its clients probe
only it) and writes its pid there, for the messages that name it.
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
"""The terminated-topic events socket (topic `workspaceId + "\\0"`)."""
LOCK_NAME = "daemon.lock"
STATE_NAME = "daemon.state"
"""One line the daemon holding the home keeps up to date while it is not simply serving:
`starting`, `starting: waiting for the store (...)`, `stopping`; gone once it serves or has
stopped. Meaningful only while the home's lock is held (a killed daemon's is stale)."""


def default_home() -> Path:
    """`$AGENTHOST_HOME` (made absolute), else the platform's own data directory for
    agenthost: `$XDG_DATA_HOME/agenthost` (`~/.local/share/agenthost`) on Linux,
    `~/Library/Application Support/agenthost` on macOS."""
    env = os.environ.get(HOME_ENV)
    if env:
        # Not resolve(): a home that is a symlink must stay visible as one (it is refused).
        return Path(os.path.abspath(Path(env).expanduser()))
    # Imported here, the one call outside the standard library in `domain`: importing the
    # layout (as every client does) must not load it.
    import platformdirs

    return Path(platformdirs.user_data_dir("agenthost", appauthor=False))


def run_dir(home: Path) -> Path:
    return home / RUN_DIR


def lock_path(home: Path) -> Path:
    return run_dir(home) / LOCK_NAME


def read_state(home: Path) -> str | None:
    """The daemon's published state line (`STATE_NAME`); None when there is none. Trust it
    only while `probe_home(home).served`."""
    try:
        with open(run_dir(home) / STATE_NAME, encoding="utf-8", errors="replace") as fh:
            text = fh.read(512).strip()
    except OSError:
        return None
    return text or None


@dataclass(frozen=True)
class Probe:
    """`served` False: no daemon holds the lock (a dead or never-started daemon)."""

    served: bool
    pid: int | None = None


def open_home_dir(home: Path) -> int:
    """A descriptor of the home directory itself, the lock's object (never through a symlink;
    not inherited by child processes)."""
    return os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _held(path: Path, flags: int) -> bool | None:
    """Whether another process holds an exclusive flock on `path` (None: it cannot be opened)."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        return False
    finally:
        os.close(fd)  # drops our shared lock, if we took it


def probe_home(home: Path) -> Probe:
    """Look without disturbing: a shared lock we get at once means nobody holds the home.
    The home directory's lock decides; the lock file too, for a daemon of an older version."""
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    file_flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if _held(home, dir_flags) or _held(lock_path(home), file_flags):
        return Probe(True, read_pid_file(home))
    return Probe(False)


def read_pid_file(home: Path) -> int | None:
    """The pid the holder wrote into `run/daemon.lock` (None: no such file, or none in it)."""
    try:
        fd = os.open(lock_path(home), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_pid(fd)
    finally:
        os.close(fd)


def read_pid(fd: int) -> int | None:
    """The pid the lock's holder wrote into the lock file (None: none, or unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
