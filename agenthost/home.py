"""The daemon's home, `AGENTHOST_HOME`: one daemon per home, and a home that is ours alone.

- `HomeLock`: an exclusive `flock` on the home directory itself (and on `run/daemon.lock`, for
  daemons and clients of older versions), held for the daemon's whole life and taken before
  the store is opened or anything under the home is written, so a second `serve` on a live
  home changes nothing. The directory holds the store, so it cannot go while the lock matters:
  removing `run/` (as a cleaner of old files may) does not free the home. The kernel drops the
  lock when its holder dies (SIGKILL included), so a stale lock never blocks a restart. The
  holder writes its pid into `run/daemon.lock`, for the message the second process prints,
  and writes the file again when `run/` is made again (`HomeLock.renew`).
- `probe_home` (from `domain.home_layout`, where the clients take it): what a client sees
  without disturbing the holder: nobody serves the home (the lock is free: a dead daemon), or
  pid N does.
- `check_home` / `check_ipc_dir`: refuse a home or `run/` that another user owns, that others
  may write, or that is a symlink, and an ipc endpoint in a directory that is not ours with
  mode 0700. Directories are only ever chmod-ed by the code that has just created them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from domain.home_layout import (
    LOCK_NAME,
    STATE_NAME,
    Probe,
    lock_path,
    open_home_dir,
    probe_home,
    read_pid_file,
)

__all__ = [
    "LOCK_NAME",
    "HomeInUse",
    "HomeLock",
    "HomeUnsafe",
    "Probe",
    "acquire",
    "check_data_dir",
    "check_ipc_endpoint",
    "check_store_files",
    "check_private_dir",
    "lock_path",
    "make_private_dir",
    "prepare_home",
    "prepare_ipc_dir",
    "probe_home",
]

# Clients probe the lock with a short shared flock; a daemon starting at that instant retries
# its exclusive one for this long before it believes a live daemon holds the home.
_CONTENDED_RETRY_S = 0.5


class HomeInUse(RuntimeError):
    """Another live daemon holds this home's lock (exit 1)."""

    def __init__(self, home: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(f"another agenthost ({who}) is serving {home}")
        self.home = home
        self.pid = pid


class HomeUnsafe(ValueError):
    """The home, its run dir or an ipc directory is not ours alone (exit 2)."""


@dataclass
class HomeLock:
    """The held locks; `release()` at the very end of the daemon's life."""

    home: Path
    home_fd: int | None
    path: Path
    fd: int | None

    def renew(self) -> None:
        """After `run/` was removed and made again: lock and fill a new `run/daemon.lock`.
        The home's own lock was held all along, so no other daemon of this version can hold
        the new file; one of an older version could, and is refused (`HomeInUse`)."""
        old, self.fd = self.fd, None
        if old is not None:
            os.close(old)
        self.fd = _lock_file(self.home, self.path)
        _write_pid(self.fd)

    def publish(self, state: str | None) -> None:
        """The one line a client reads to say what this daemon is doing while it does not
        answer (`domain.home_layout.STATE_NAME`): written whole (a rename), None removes it.
        Best effort: a client without it says less, nothing more."""
        path = self.path.with_name(STATE_NAME)
        with contextlib.suppress(OSError):
            if state is None:
                path.unlink(missing_ok=True)
                return
            part = path.with_name(f".{STATE_NAME}.{os.getpid()}")
            part.write_text(state + "\n", encoding="utf-8")
            os.replace(part, path)

    def release(self) -> None:
        self.publish(None)
        fd, self.fd = self.fd, None
        if fd is not None:
            # The pid is cleared first so a reader never names a daemon that has gone.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the only descriptor drops the flock
        home_fd, self.home_fd = self.home_fd, None
        if home_fd is not None:
            os.close(home_fd)

    def home_replaced(self) -> bool:
        """Whether the home path no longer names the directory we locked (removed, moved, or
        another put in its place): our store is then out of every other process's reach."""
        if self.home_fd is None:
            return False
        held = os.fstat(self.home_fd)
        try:
            now = os.stat(self.home, follow_symlinks=False)
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def _flock_retrying(fd: int) -> bool:
    """An exclusive flock on `fd`; False when another process keeps holding it."""
    deadline = time.monotonic() + _CONTENDED_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() > deadline:
            return False
        # A client's probe holds a shared lock for microseconds; a daemon holds it for good.
        time.sleep(0.02)


def _lock_file(home: Path, path: Path) -> int:
    # Not inherited by worker processes (O_CLOEXEC): a surviving worker must not keep a dead
    # daemon's home locked. O_NOFOLLOW: never lock through a planted symlink.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not _flock_retrying(fd):
            raise HomeInUse(home, read_pid_file(home))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def acquire(home: Path) -> HomeLock:
    """Take the home's lock or raise `HomeInUse`; `run/` must already exist (checked). The
    home directory first: a second `serve` stops there, before it creates any file."""
    home_fd = open_home_dir(home)
    try:
        if not _flock_retrying(home_fd):
            raise HomeInUse(home, read_pid_file(home))
        path = lock_path(home)
        fd = _lock_file(home, path)
    except BaseException:
        os.close(home_fd)
        raise
    _write_pid(fd)
    held = HomeLock(home, home_fd, path, fd)
    held.publish("starting")
    return held


# -- ours alone ----------------------------------------------------------------------------


def check_private_dir(path: Path, what: str, *, exact_0700: bool = False) -> bool:
    """Refuse (`HomeUnsafe`) a directory that is a symlink, not ours, or writable by others
    (with `exact_0700`, any access by others). Returns False when it does not exist yet."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise HomeUnsafe(f"{what} {path} is a symlink; use the real directory (refused)")
    if not stat.S_ISDIR(st.st_mode):
        raise HomeUnsafe(f"{what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise HomeUnsafe(
            f"{what} {path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); "
            "use a directory of your own"
        )
    mode = stat.S_IMODE(st.st_mode)
    if exact_0700 and mode & 0o077:
        raise HomeUnsafe(f"{what} {path} has mode {mode:04o}; it must be 0700 (`chmod 700 {path}`)")
    if mode & 0o022:
        raise HomeUnsafe(
            f"{what} {path} is writable by others (mode {mode:04o}); "
            f"`chmod go-w {path}` or use another directory"
        )
    return True


def check_data_dir(path: Path, what: str) -> None:
    """Refuse (`HomeUnsafe`) a data directory of the home (`runtimes/`, `checkpoints/`) that
    exists but is no directory (a file, a dangling symlink): every Turn's provider home, or
    every checkpoint, would fail on it one by one instead. A symlink to a directory (another
    disk) is fine; a missing one is made where it is used."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise HomeUnsafe(f"{what} {path} is a dangling symlink; remove it") from None
        return
    if not stat.S_ISDIR(st.st_mode):
        raise HomeUnsafe(f"{what} {path} is not a directory; move it away (refused)")


def check_store_files(store: Path) -> None:
    """Refuse (`HomeUnsafe`) a store, or its `-wal` / `-shm`, that SQLite could never open: not
    a regular file (a directory in its place), or one we may not read and write (left by a
    daemon run as another user). SQLite says only `CantOpenError`, which a start otherwise
    retries as a busy store for its whole limit and then calls busy."""
    for path in (store, Path(f"{store}-wal"), Path(f"{store}-shm")):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise HomeUnsafe(f"the store file {path} is not a regular file; move it away")
        if not os.access(path, os.R_OK | os.W_OK):
            raise HomeUnsafe(
                f"the store file {path} is not readable and writable by us (uid "
                f"{os.geteuid()}; it is uid {st.st_uid}'s, mode {stat.S_IMODE(st.st_mode):04o})"
            )


def make_private_dir(path: Path) -> None:
    """Create `path` 0700. The chmod (umask masks mkdir's mode) only ever touches the
    directory we have just created; an existing one is left as it is (it was checked)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)


def prepare_home(home: Path) -> None:
    """Check the home and `run/`, creating what is missing; raise `HomeUnsafe` on a home that
    is not ours alone, `HomeInUse` on one a live daemon holds. Writes nothing into an existing
    home."""
    if not check_private_dir(home, "AGENTHOST_HOME"):
        home.parent.mkdir(parents=True, exist_ok=True)
        make_private_dir(home)
        check_private_dir(home, "AGENTHOST_HOME")
    # A live daemon's home is refused as in use before `run/` is looked at: one of that
    # daemon's writers may have just made `run/` again under the umask (0755), which the daemon
    # tightens on its own; a second `serve` must be told the home is served, not that it is
    # unsafe, and must touch nothing in it. `acquire` still decides a race of two starts.
    probe = probe_home(home)
    if probe.served:
        raise HomeInUse(home, probe.pid)
    run = home / "run"
    if not check_private_dir(run, "run directory", exact_0700=True):
        make_private_dir(run)
        check_private_dir(run, "run directory", exact_0700=True)


def check_ipc_endpoint(endpoint: str) -> None:
    """An ipc endpoint's file permissions are its only protection: refuse the Linux abstract
    namespace (`ipc://@name`, no permissions at all) and a socket directory that is not ours
    with mode 0700. A missing directory is fine (it will be created 0700)."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://") :]
    if path.startswith("@") or path.startswith("\0"):
        raise HomeUnsafe(
            f"{endpoint}: an abstract-namespace ipc endpoint has no file permissions, so any "
            "local user could connect; use a socket path in a directory of your own (0700)"
        )
    parent = Path(os.path.abspath(path)).parent
    check_private_dir(parent, f"ipc endpoint {endpoint}: directory", exact_0700=True)


def prepare_ipc_dir(endpoint: str) -> None:
    """Create a missing socket directory 0700 and check it again: one that appeared in
    between (another user's) is refused rather than used."""
    if not endpoint.startswith("ipc://"):
        return
    parent = Path(os.path.abspath(endpoint[len("ipc://") :])).parent
    what = f"ipc endpoint {endpoint}: directory"
    if not check_private_dir(parent, what, exact_0700=True):
        parent.parent.mkdir(parents=True, exist_ok=True)
        make_private_dir(parent)
        check_private_dir(parent, what, exact_0700=True)
