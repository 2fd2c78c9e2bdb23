"""Whether a provider history this worker reads is *final* for the Turns whose `turn.start`
never reached this worker: no process that may have been handed such a start is still alive,
so nothing can add a Turn for one to the Session's provider history after the read.

The processes that may hold a start this worker never received are the earlier workers of the
same provider and daemon (a start in a lane, or a runtime it spawned) and whatever they spawned
on the Session's provider home (an app-server, a Claude Code CLI, their children). Linux
`/proc` names both: a worker by its command line (`drivers.worker --provider P`) and its
failpoint state directory (the daemon gives each of its workers the same one, under its run
dir), a provider process by its environment, which names its home (`TUTTI_AGENT_HOME`,
`CODEX_HOME`, `CLAUDE_CONFIG_DIR`; their children inherit it). Anything this worker spawned is
left out (it never got such a start), and so are its ancestors (the daemon, which sends starts
only to its one worker of the provider, and what started it). A zombie has exited (its files
closed: every write it made is in the file); any other state counts as alive, a SIGKILL pending
or not (a write may still be in its system call). Anything unsure — no `/proc`, a process of
ours whose environment cannot be read — is not final.
"""

from __future__ import annotations

import os
import time

from domain.procfs import alive_in_stat, read_proc_stat
from drivers.failpoints import ENV_STATE_DIR

_GONE = (b"Z", b"X", b"x")


def _proc_table() -> dict[int, tuple[int, bytes]] | None:
    """pid → (parent pid, state) of every process, or None without a readable `/proc`."""
    out: dict[int, tuple[int, bytes]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            out[int(name)] = (int(fields[1]), fields[0])
    return out


def _descendants(table: dict[int, tuple[int, bytes]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _state) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _threads(pid: int) -> int:
    """How many threads the process still has (0: gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _read(path: str) -> list[bytes] | None:
    """A `/proc` file's NUL-separated items; [] when the process is gone, None when unreadable."""
    try:
        with open(path, "rb") as fh:
            return fh.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return []
    except OSError:
        return None


EXITING_WAIT_S = 3.0
"""How long `history_final` waits for the processes that keep it from being final when every
one of them is already exiting: a Claude Code CLI parked by a killed worker is SIGKILLed by
its parent-death signal as the worker dies and is gone a moment later."""


def _exiting(pid: int) -> bool:
    """The process is already on its way out: in the kernel's exit (`PF_EXITING`), or with a
    SIGKILL pending (delivered at its next return to user space; a frozen or stopped one too;
    `domain.procfs.alive_in_stat`). Its last writes may still be in their system calls: it
    counts as alive until it is gone."""
    try:
        return not alive_in_stat(read_proc_stat(pid))
    except OSError:
        return True  # gone meanwhile


def _gone(pid: int) -> bool:
    """Exited: no such process any more, or a zombie whose every thread has ended."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    fields = stat[stat.rfind(b")") + 2 :].split()
    return not fields or (fields[0] in _GONE and _threads(pid) <= 1)


def history_final(
    provider: str, home: str, state_dir: str | None = None, *, wait_s: float = EXITING_WAIT_S
) -> bool:
    """True when, at this call, no process outside this worker's own tree can add a Turn to
    the provider history of the Session whose provider home is `home`: no other live worker of
    `provider` with this worker's failpoint state directory (`state_dir`, default this
    worker's own), and no live process whose environment names `home` (or a path under it).
    A history read after a True answer holds every Turn a start this worker never received
    can ever put there.

    When every process in the way is already exiting (`_exiting`: a SIGKILL pending, in the
    kernel's exit — or a child of one that is, whose parent-death signal comes as it dies),
    it waits up to `wait_s` for them to be gone and looks again; anything else in the way, or
    one still there at the bound, is not final (as before: the Turn is asked about again)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _in_the_way(provider, home, state_dir)
        if found is None:
            return False
        table, blockers = found
        if not blockers:
            return True
        # What to wait for: each one exiting, or the exiting parent of one that is not yet
        # (looked at again once the parent is gone: by then its parent-death signal is pending,
        # or it is in the way for good).
        awaited: set[int] = set()
        for pid in blockers:
            parent = table.get(pid, (0, b""))[0]
            if _exiting(pid):
                awaited.add(pid)
            elif parent in table and _exiting(parent):
                awaited.add(parent)
            else:
                return False
        while not all(_gone(pid) for pid in awaited):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _in_the_way(
    provider: str, home: str, state_dir: str | None
) -> tuple[dict[int, tuple[int, bytes]], list[int]] | None:
    """The process table and the processes that keep the history from being final
    (`history_final`), or None when unsure."""
    state = state_dir if state_dir is not None else os.environ.get(ENV_STATE_DIR)
    if not home or not state or not os.path.isabs(home):
        return None
    table = _proc_table()
    if table is None:
        return None
    uid = os.getuid()
    mine = _descendants(table, os.getpid())
    pid: int | None = table.get(os.getpid(), (0, b""))[0]
    while pid and pid in table and pid not in mine:
        # Its ancestors — the daemon and what started it — hold no start it never sent on.
        mine.add(pid)
        pid = table[pid][0]
    want_home, under = home.encode(), (home.rstrip("/") + "/").encode()
    want_state = f"{ENV_STATE_DIR}={state}".encode()
    want_provider = provider.encode()
    blockers: list[int] = []
    for other, (_parent, proc_state) in table.items():
        if other in mine or (proc_state in _GONE and _threads(other) <= 1):
            continue  # ours, or exited (a zombie leader whose other threads run is not)
        try:
            if os.stat(f"/proc/{other}").st_uid != uid:
                continue  # another user's process is neither our worker nor our provider's
        except OSError:
            continue  # gone meanwhile
        environ = _read(f"/proc/{other}/environ")
        if environ is None:
            return None  # one of ours we cannot see into: unsure
        for item in environ:
            _, _, value = item.partition(b"=")
            if value == want_home or value.startswith(under):
                blockers.append(other)  # a provider process of the home (or a child of one)
                break
        else:
            if want_state in environ:
                argv = _read(f"/proc/{other}/cmdline")
                if argv is None:
                    return None
                if b"drivers.worker" in argv and want_provider in argv:
                    blockers.append(other)  # another worker of this provider and daemon
    return table, blockers
