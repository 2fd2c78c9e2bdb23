"""Process probes shared by the driver tests (a uniquely named module: conftest names collide)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drivers.supervisor import WorkerSupervisor


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


class EventLog:
    """Collects `emit(agent_session_id, event)` calls and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._cond = threading.Condition()

    def __call__(self, sid: str, event: dict[str, Any]) -> None:
        with self._cond:
            self.events.append((sid, event))
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for _, event in self.events:
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no matching event in {self.events}")
                self._cond.wait(remaining)

    def of_turn(self, turn_id: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for _, e in self.events if e.get("turnId") == turn_id]


def completed(turn_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("type") == "turn.completed" and e.get("turnId") == turn_id
