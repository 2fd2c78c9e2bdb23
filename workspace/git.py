"""Running `git` for the workspace checkpoints, isolated from the person's own setup: no system
or global config, no hooks, no pager, no prompts, no editor, a fixed identity, and a time
bound on every call (a git past it is killed with everything it started). The user's
repository is only ever read through this runner, except where a worktree fork adds its
worktree and branch (law 10). A git (and what it started) of a daemon that was killed lives on
in a session of its own; the next daemon on the home kills it before it works on any folder
(`kill_left_gits`).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import Any


class GitUnavailable(Exception):
    """`git` is not installed, or a call failed or ran out of time; `reason` is a short word
    for the wire (`git_missing`, `git_failed`, `timed_out`) and the message says the rest.
    `stale_locks`: the call may have left lock files behind (killed: by its bound or a
    signal) or was refused on one already there; git refuses every later write past them
    until they are removed (`ShadowStore.clear_stale_locks`)."""

    def __init__(self, reason: str, message: str, *, stale_locks: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.stale_locks = stale_locks


def _refused_on_lock(stderr: bytes) -> bool:
    """git's answer when a lock file it creates exclusively is there already:
    `Unable to create '<path>.lock': File exists.`"""
    return b".lock': File exists" in stderr


# Config that holds for every call: nothing of the person's may run or prompt.
_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.fsmonitor=false",
    "core.autocrlf=false",
    "core.symlinks=true",
    "core.quotePath=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "init.defaultBranch=main",
)


def git_binary() -> str | None:
    return shutil.which("git")


@dataclass(frozen=True, slots=True)
class Git:
    """One git invocation context: the binary, a private HOME and a deadline per call."""

    binary: str
    home: Path
    timeout_s: float = 5.0

    @classmethod
    def find(cls, home: Path, timeout_s: float = 5.0) -> Git:
        binary = git_binary()
        if binary is None:
            raise GitUnavailable("git_missing", "git is not installed (install git to checkpoint)")
        return cls(binary, home, timeout_s)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
            "GIT_EDITOR": "true",
            "GIT_ASKPASS": "true",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_AUTHOR_NAME": "agenthost",
            "GIT_AUTHOR_EMAIL": "agenthost@localhost",
            "GIT_COMMITTER_NAME": "agenthost",
            "GIT_COMMITTER_EMAIL": "agenthost@localhost",
            "GIT_AUTHOR_DATE": "1700000000 +0000",
            "GIT_COMMITTER_DATE": "1700000000 +0000",
            "LC_ALL": "C",
        }
        if extra:
            env.update(extra)
        return env

    def run(
        self,
        args: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        input_bytes: bytes | None = None,
        check: bool = True,
        timeout_s: float | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        cmd = [self.binary]
        for item in _CONFIG:
            cmd += ["-c", item]
        cmd += list(args)
        bound = self.timeout_s if timeout_s is None else timeout_s
        try:
            # Its own process group: past the bound the whole group is killed (a `gc`'s
            # `pack-objects`, `repack`), so nothing of it still writes once the call answers
            # and its lock files may be removed.
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=self.env(env),
                stdin=subprocess.PIPE if input_bytes is not None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise GitUnavailable("git_missing", f"cannot run git: {exc}") from None
        try:
            stdout, stderr = proc.communicate(input_bytes, timeout=bound)
        except subprocess.TimeoutExpired:
            _kill_group(proc, bound)
            raise GitUnavailable(
                "timed_out", f"git {args[0]} took longer than {bound:g} s", stale_locks=True
            ) from None
        except BaseException:
            _kill_group(proc, bound)
            raise
        done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        if check and done.returncode != 0:
            raise failed(args, done)
        return done

    def out(self, args: Sequence[str], **kw: object) -> str:
        return self.run(args, **kw).stdout.decode(errors="surrogateescape").strip()  # type: ignore[arg-type]


def failed(args: Sequence[str], done: subprocess.CompletedProcess[bytes]) -> GitUnavailable:
    """What `Git.run` raises for the finished call `done` (of `args`) that failed."""
    err = done.stderr.decode(errors="replace").strip().splitlines()
    return GitUnavailable(
        "git_failed",
        f"git {args[0]} failed: {err[-1] if err else done.returncode}",
        stale_locks=done.returncode < 0 or _refused_on_lock(done.stderr),
    )


def _kill_group(proc: subprocess.Popen[bytes], bound: float) -> None:
    """Kill `proc`'s process group (git and every process it started) and wait until none of
    them holds its pipes any more (each closes them as it exits), for at most `bound` more:
    then nothing of the call still writes in the repository."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        # A member stuck in the kernel (a stalled disk): stop waiting for it.
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        proc.wait()


def gits_of(home: Path) -> list[int]:
    """The processes running with `home` as their HOME: every git a `Git(home)` ran and what
    it started (each inherits the environment), here or of an earlier daemon on the same home."""
    found = _open_gits_of(home)
    for _, fd, _ in found:
        os.close(fd)
    return [pid for pid, _, _ in found]


@dataclass(frozen=True, slots=True)
class LeftGit:
    """A git a killed daemon left that outlived its kill at start: its pid, its pidfd (readable
    once it is gone) and the repository it works in (`GIT_DIR`; None: unknown, so any)."""

    pid: int
    pidfd: int
    git_dir: str | None


class LeftGits:
    """The left gits still alive after `kill_left_gits`'s wait, watched by their pidfds: the
    lock files of a repository one of them works in are its own, held while it lives, and are
    not removed until it is gone (`holds`). Each is forgotten, its pidfd closed, once gone."""

    def __init__(self, gits: Sequence[LeftGit] = ()) -> None:
        self._gits = list(gits)
        self._lock = threading.Lock()

    def alive(self) -> list[LeftGit]:
        """Those still alive now (a poll of each pidfd, no wait)."""
        with self._lock:
            if self._gits:
                # poll, not select: a pidfd's number may pass select's 1,024 in a daemon
                # holding thousands of connections.
                poll = select.poll()
                for git in self._gits:
                    poll.register(git.pidfd, select.POLLIN)
                ready = {fd for fd, _ in poll.poll(0)}
                for git in [g for g in self._gits if g.pidfd in ready]:
                    self._gits.remove(git)
                    os.close(git.pidfd)
            return list(self._gits)

    def holds(self, repo: Path) -> bool:
        """Whether a left git still alive may write in `repo` (one whose `GIT_DIR` is
        unknown may write in any)."""
        real = os.path.realpath(repo)
        return any(g.git_dir is None or os.path.realpath(g.git_dir) == real for g in self.alive())

    def status(self) -> dict[str, Any]:
        """`host.status` → `leftGits`: how many live on, their pids and repositories."""
        alive = self.alive()
        return {
            "alive": len(alive),
            "pids": [g.pid for g in alive],
            "repositories": sorted({g.git_dir or "?" for g in alive}),
        }

    def close(self) -> None:
        with self._lock:
            for git in self._gits:
                os.close(git.pidfd)
            self._gits.clear()


def kill_left_gits(home: Path, wait_s: float) -> tuple[int, LeftGits]:
    """Kill every process left running with `home` as its HOME (`gits_of`): a git of a daemon
    that was killed, still holding its lock files and maybe still writing in a shadow
    repository. Called at start-up, once the home is held and before anything runs git, so
    the lock files `clear_stale_once` removes have no writer any more. Each is addressed by a
    pidfd opened before its environment is read (a reused pid is never signalled), and
    waited for up to `wait_s` (a process in the kernel on a stalled disk dies when that ends).
    Returns how many were killed and those still alive after `wait_s`, watched (`LeftGits`:
    their repositories' lock files stay until they are gone)."""
    found = _open_gits_of(home)
    kept: list[LeftGit] = []
    try:
        for _, fd, _ in found:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        poll = select.poll()
        for _, fd, _ in found:
            poll.register(fd, select.POLLIN)
        alive = {fd for _, fd, _ in found}
        deadline = monotonic() + wait_s
        while alive and (left := deadline - monotonic()) > 0:
            for fd, _ in poll.poll(left * 1000):
                alive.discard(fd)
                poll.unregister(fd)
        kept = [LeftGit(pid, fd, git_dir) for pid, fd, git_dir in found if fd in alive]
        return len(found), LeftGits(kept)
    finally:
        for _, fd, _ in found:
            if not any(g.pidfd == fd for g in kept):
                os.close(fd)


def _open_gits_of(home: Path) -> list[tuple[int, int, str | None]]:
    """(pid, pidfd, GIT_DIR or None) of each live process whose environment has
    HOME=`home` (not this one)."""
    want = b"HOME=" + os.fsencode(home)
    me = os.getpid()
    found: list[tuple[int, int, str | None]] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            env = b""  # gone, or not ours to read (another user's)
        # Read while the pidfd's process lived: the environment was its own, not a reuser's.
        entries = env.split(b"\0")
        if want in entries and not select.select([fd], [], [], 0)[0]:
            dirs = [e[len(b"GIT_DIR=") :] for e in entries if e.startswith(b"GIT_DIR=")]
            found.append((pid, fd, os.fsdecode(dirs[0]) if dirs else None))
        else:
            os.close(fd)
    return found
