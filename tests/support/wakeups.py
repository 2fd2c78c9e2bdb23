"""Wake-ups of a thread, read from the kernel: its voluntary context switches (each one a sleep
and a wake-up), for the tests that pin "a job wakes one idle thread" (`domain.wake_one` and the
pools on it: the actor pool, the checkpoint pool, the worker's lanes, the API's pools)."""

from __future__ import annotations

import threading
import time


def switches(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far (each a sleep and a wake-up)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def asleep(threads: list[threading.Thread]) -> dict[str, int]:
    """Each thread's switch count once none moved for 50 ms (listed idle is not yet asleep)."""
    counts = {t.name: switches(t) for t in threads}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = {t.name: switches(t) for t in threads}
        if now == counts:
            break
        counts = now
    return counts


def woken_since(threads: list[threading.Thread], before: dict[str, int]) -> dict[str, int]:
    """Each thread's wake-ups since `before` (`asleep`'s counts)."""
    return {t.name: switches(t) - before[t.name] for t in threads}
