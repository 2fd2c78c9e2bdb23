"""A recording `emit(agent_session_id, event)` for driver tests, and its wait helpers. Drivers
emit typed `TurnEvent`s; the log keeps each one's wire map (what the worker sends), so tests
read events as the host's link does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from domain.turn_events import TurnEvent


class EventLog:
    """Collects `emit(agent_session_id, event)` calls and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._cond = threading.Condition()

    def __call__(self, sid: str, event: TurnEvent) -> None:
        wire = event.to_wire()
        with self._cond:
            self.events.append((sid, wire))
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
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
