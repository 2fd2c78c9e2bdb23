"""Process probes shared by the driver tests (a uniquely named module: conftest names collide)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from drivers.supervisor import WorkerSupervisor
from tests.support.events import EventLog, completed  # noqa: F401 - re-exported


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_until(
    predicate: Callable[[], bool], timeout: float = 15.0, interval: float = 0.05
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def worker_pid(sup: WorkerSupervisor, provider: str) -> int:
    for row in sup.status():
        if row["provider"] == provider and row["pid"]:
            return int(row["pid"])
    raise AssertionError(f"no live worker for {provider}: {sup.status()}")


TUTTI_BIN = str(Path(sys.executable).parent / "tutti-agent")
PROXY = str(Path(__file__).with_name("tamper_proxy.py"))
