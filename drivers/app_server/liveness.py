"""Whether an app-server can still make progress, read from the kernel: a provider process
that was stopped (SIGSTOP, SIGTSTP, a debugger) keeps its pipes open and answers nothing, so
neither its exit nor a JSON-RPC timeout ever ends the Turn it was running. The check covers
the app-server and its descendants (Codex's `codex` is a Node launcher over a native child).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

STOPPED_STATES = frozenset({b"T", b"t"})
"""`/proc/PID/stat` states of a process that does not run until it is continued: stopped by a
signal (`T`) or at a tracer's stop (`t`)."""


def process_state(pid: int) -> bytes | None:
    """The one-letter state of `pid` (field 3 of `/proc/PID/stat`), None if it is gone or
    unreadable. The command (field 2) may hold spaces and parentheses: read after its last `)`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0] if fields else None


def process_tree(pid: int) -> Iterator[int]:
    """`pid` and every process below it (`/proc/PID/task/TID/children`; empty where the
    kernel does not provide it)."""
    todo = [pid]
    seen: set[int] = set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        yield current
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            todo.extend(int(child) for child in children if child.isdigit())


def stopped_process(pid: int) -> int | None:
    """The pid of a stopped process in `pid`'s tree (itself first), or None while all run."""
    for current in process_tree(pid):
        if process_state(current) in STOPPED_STATES:
            return current
    return None
