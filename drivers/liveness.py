"""Whether a provider process can still make progress, read from the operating system through
psutil (Linux, macOS, Windows alike): a provider that was stopped (SIGSTOP, SIGTSTP, a debugger)
keeps its pipes open and answers nothing, so neither its exit nor a request timeout ever ends the
Turn it was running. The check covers the process and its descendants (Codex's `codex` is a Node
launcher over a native child; Claude Code's CLI may run tools under it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil

from domain.procfs import read_proc_stat, stat_fields

PROVIDER_STOPPED = "provider_stopped"
"""The reason word a Turn fails with when its provider process stayed stopped."""
PROVIDER_UNRESPONSIVE = "provider_unresponsive"
"""... when its provider process runs but answered nothing to a liveness request past the
bound (wedged: not stopped, but making no progress)."""

DEFAULT_STOPPED_LIMIT_S = 30.0
"""How long a provider running a Turn may stay stopped before the Turn fails `provider_stopped`
(the daemon's `provider_stopped_seconds`)."""

RELIST_S = 60.0
"""How often a `TreeWatch` lists its tree again."""

STOPPED_STATES = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})
"""States of a process that does not run until it is continued: stopped by a signal, or at a
tracer's stop (Linux `T` / `t`; macOS reports a stopped process as `stopped` too)."""


STOPPED_STAT_STATES = frozenset({b"T", b"t"})
"""`STOPPED_STATES` as `/proc/PID/stat` spells them (field 3)."""


def stopped_now(pid: int) -> bool:
    """Whether `pid` is stopped now (`/proc/PID/stat` state `T` or `t`), in one read: a close
    asks it before it waits for an exit a stopped process cannot make (it reads no end of
    input and handles no SIGTERM; only SIGKILL ends it). False when gone or unreadable."""
    try:
        fields = stat_fields(read_proc_stat(pid))
    except OSError:
        return False
    return fields is not None and fields[0] in STOPPED_STAT_STATES


def process_state(pid: int) -> str | None:
    """The state of `pid` as psutil names it (`running`, `sleeping`, `stopped`, …), None if it
    is gone or cannot be read."""
    try:
        return str(psutil.Process(pid).status())
    except (psutil.Error, OSError):
        return None


def process_tree(pid: int) -> Iterator[int]:
    """`pid` and every process below it (empty where it is gone)."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except (psutil.Error, OSError):
        return
    yield pid
    for child in children:
        yield child.pid


class TreeWatch:
    """Watches one provider process and the processes under it for a stopped state. Listing a
    tree asks the system for every process's parent (psutil walks the whole process table), so
    the members are re-listed at most every `relist_s`; each check reads only the members' own
    states. The provider's own processes (the app-server,
    Codex's native child, the turn's CLI) exist from its start, so they are all in the first
    listing."""

    def __init__(self, pid: int, relist_s: float = RELIST_S) -> None:
        self.pid = pid
        self._relist_s = relist_s
        self._listed_at: float | None = None
        self._members: list[psutil.Process] = []

    def stopped(self, now: float) -> int | None:
        """The pid of a stopped member (the root first), or None while all run."""
        if self._listed_at is None or not self._members or now - self._listed_at >= self._relist_s:
            self._members = _processes(self.pid)
            self._listed_at = now
        for member in self._members:
            try:
                # is_running: the pid still names the process listed (not a reused one).
                if member.is_running() and member.status() in STOPPED_STATES:
                    return member.pid
            except (psutil.Error, OSError):
                continue
        return None


def _processes(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and everything below it, leaves first: a stopped child left behind (no
    parent-death signal reaches Codex's native child) would keep the thread's files. SIGKILL
    ends a stopped process too."""
    for victim in reversed(list(process_tree(pid))):
        with contextlib.suppress(psutil.Error, OSError):
            psutil.Process(victim).kill()


def stopped_error(provider: str, what: str, pid: int, stopped: int, for_s: float) -> str:
    """The failure of a Turn whose provider process stayed stopped, in words."""
    when = f"for {for_s:.0f} s and could not finish the Turn"
    return _stopped_words(provider, what, pid, stopped, when)


def stopped_start_error(provider: str, pid: int, stopped: int, what: str) -> str:
    """The failure of a provider process found stopped when its start got no answer."""
    when = f"while it started ({what})"
    return _stopped_words(provider, "app-server", pid, stopped, when, state=False)


def stopped_at_stop_error(provider: str, pid: int, stopped: int) -> str:
    """The failure of what waited on a provider process found stopped by its Session's stop
    (the request it was sent can never be answered)."""
    when = "when its Session was stopped, and could not answer"
    return _stopped_words(provider, "app-server", pid, stopped, when)


def _stopped_words(
    provider: str, what: str, pid: int, stopped: int, when: str, *, state: bool = True
) -> str:
    """`provider_stopped`'s sentence: which process was stopped, `when`, and what follows."""
    which = f"pid {pid}" if stopped == pid else f"pid {pid}, its process {stopped}"
    how = f"process state {process_state(stopped) or '?'}: " if state else ""
    return (
        f"{PROVIDER_STOPPED}: the {provider} {what} ({which}) was stopped ({how}SIGSTOP, "
        f"SIGTSTP or a debugger) {when}; it was killed, and a new one starts at the next Turn"
    )


def unresponsive_error(provider: str, what: str, pid: int, probe: str, for_s: float) -> str:
    """The failure of a Turn whose provider process runs but answers nothing, in words."""
    state = process_state(pid) or "?"
    return (
        f"{PROVIDER_UNRESPONSIVE}: the {provider} {what} (pid {pid}, process state {state}) "
        f"answered nothing, not even the liveness request {probe}, for {for_s:.0f} s and could "
        "not finish the Turn; it was killed, and a new one starts at the next Turn"
    )
