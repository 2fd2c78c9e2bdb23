"""Fault injection for fork materialization, configured by `TUTTI_AGENT_FAILPOINTS`.

`name=action;...` with names `fork.before_materialize`, `fork.after_child_write` and actions
`error`, `exit` (the process dies at once, like SIGKILL), `sleep:<ms>`, `hang`."""

from __future__ import annotations

import os
import threading
import time

from tutti_agent.errors import ForkInitFailed
from tutti_agent.fork import PreparedFork

NAMES = ("fork.before_materialize", "fork.after_child_write")


def parse_failpoints(spec: str) -> dict[str, str]:
    points: dict[str, str] = {}
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, action = part.partition("=")
        if name not in NAMES:
            raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(NAMES)}")
        points[name] = action or "error"
    return points


class FailpointHooks:
    """ForkHooks that act out the configured failpoints."""

    def __init__(self, points: dict[str, str]) -> None:
        self.points = points

    def _hit(self, name: str) -> None:
        action = self.points.get(name)
        if action is None or action == "off":
            return
        if action == "error":
            raise ForkInitFailed(f"failpoint {name}")
        if action == "exit":
            os._exit(137)
        if action.startswith("sleep:"):
            time.sleep(int(action[6:]) / 1000.0)
        elif action == "hang":
            threading.Event().wait()

    def before_materialize(self, prepared: PreparedFork) -> None:
        self._hit("fork.before_materialize")

    def after_child_write(self, child_thread_id: str) -> None:
        self._hit("fork.after_child_write")
