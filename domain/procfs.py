"""`/proc/PID/stat`, read the one way both sides of the host need it: the host's check that a
warm runtime's process is alive (actors.session_runtime), the Claude driver's check that a
parked CLI is still there to take (drivers.claude.warm), and the worker supervisor's CPU
samples of a silent worker (drivers.supervisor); how a line says a process is gone
(`alive_in_stat`); and which processes work in a folder by their environment
(`processes_in`: a deleted Session's, actors.runtime_dirs), or carry a stopped runtime's
marker (`processes_marked`: drivers.app_server.process), and ending them (`end_all`). Standard
library only."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection

PF_EXITING = 0x4
"""The kernel's flag on a task that has begun to exit (`/proc/PID/stat` field 9)."""
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists (a zombie too) by signal 0: one of another user's
    (`EPERM`) exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_proc_stat(pid: int) -> bytes:
    """`/proc/PID/stat` in three system calls (open, one read, close): the kernel writes the
    whole line at the first read of a buffer this size (it is a few hundred bytes). `open()`
    would add six per call that nothing here needs — the buffered reader's `isatty` ioctl,
    two `lseek`s, two `fstat`s (and a second read for the end of file) — once per warm fork
    (docs/performance.md, "The daemon's system calls per warm fork")."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def stat_after_command(stat: bytes) -> list[bytes]:
    """The fields of a `/proc/PID/stat` line after its command (field 2, which may hold spaces
    and parentheses: it ends at the line's last `)`), from field 3 (the state) on."""
    return stat[stat.rindex(b")") + 2 :].split()


def alive_in_stat(stat: bytes) -> bool:
    """`/proc/PID/stat`: not a zombie or dead, not exiting (`PF_EXITING` in its flags) and no
    SIGKILL pending (a fatal signal is queued on every thread of the process before `kill`
    returns). Left unseen: the instant between the kernel taking the SIGKILL and marking the
    task exiting."""
    fields = stat_fields(stat)
    if fields is None:
        return True  # an unreadable line is not evidence of an exit
    state, flags, pending = fields
    return state not in (b"Z", b"X", b"x") and not (flags & PF_EXITING or pending & _SIGKILL_BIT)


def stat_fields(stat: bytes) -> tuple[bytes, int, int] | None:
    """(state, flags, pending signals) of a `/proc/PID/stat` line: fields 3, 9 and 31 (the
    command, field 2, may hold spaces and parentheses: counted from its last `)`)."""
    try:
        fields = stat_after_command(stat)
        return fields[3 - 3], int(fields[9 - 3]), int(fields[31 - 3])
    except (IndexError, ValueError):
        return None


def processes_in(folder: str, marked: str | None = None) -> list[int]:
    """This user's live processes (not this one) whose environment holds a value at or under
    `folder` (absolute): what a provider runs for a Session has its homes there (`HOME`,
    `CLAUDE_CONFIG_DIR`, `CODEX_HOME`, …) and passes them on to what it starts. `marked`: only
    those whose environment also sets that variable (a runtime's marker). Empty where there is
    no `/proc`."""
    mark = os.fsencode(folder.rstrip("/"))
    key = None if marked is None else os.fsencode(marked + "=")

    def under(item: bytes) -> bool:
        value = item.partition(b"=")[2]
        return value == mark or value.startswith(mark + b"/")

    def matches(items: list[bytes]) -> bool:
        return any(map(under, items)) and (key is None or any(i.startswith(key) for i in items))

    return _environ_scan(mark, matches)


def processes_marked(name: str, values: Collection[str]) -> list[int]:
    """This user's live processes (not this one) whose environment sets `name` to one of
    `values`: a runtime's marker (drivers.runtime_marker `RUNTIME_VAR`), which the provider's
    process and whatever it starts inherit. Empty where there is no `/proc`."""
    key = os.fsencode(f"{name}=")
    items = {key + os.fsencode(v) for v in values}
    return _environ_scan(key, lambda environ: not items.isdisjoint(environ))


def _environ_scan(needle: bytes, matches: Callable[[list[bytes]], bool]) -> list[int]:
    """The live processes whose environment holds `needle` and whose items `matches` accepts."""
    return [pid for pid, items in environs_holding(needle).items() if matches(items)]


def environs_holding(needle: bytes) -> dict[int, list[bytes]]:
    """One pass over `/proc`: this user's live processes (not this one; `alive_in_stat`) whose
    environment holds `needle`, their environment's items by pid (one read of `environ` a
    process — docs/performance.md, "What a stop's scan costs" — so it runs at a stop or a
    delete, never per Turn). Empty where there is no `/proc`."""
    found: dict[int, list[bytes]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue  # gone, or another user's
        if needle not in environ:
            continue
        with contextlib.suppress(OSError):
            if alive_in_stat(read_proc_stat(int(name))):
                found[int(name)] = environ.split(b"\0")
    return found


def end_all(find: Callable[[], list[int]], wait_s: float, look_s: float = 0.02) -> list[int]:
    """SIGKILL every process `find` names, again and again, until it names none or `wait_s`
    has passed; the pids killed. What is SIGKILLed counts as ended at once (`alive_in_stat`:
    a pending SIGKILL, an exiting task), so the wait is for what forked meanwhile."""
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        left = find()
        if not left or time.monotonic() >= deadline:
            return killed
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        time.sleep(look_s)
