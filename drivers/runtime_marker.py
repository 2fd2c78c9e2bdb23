"""A runtime's marker: a value of its own in the environment of the provider process a worker
starts (`RUNTIME_VAR`), inherited by everything that process starts, so a stop can end what the
runtime left — a tool's process the provider did not take with it — and nothing of a runtime
started after it on the same home (`RuntimeMarker.end_left`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from domain.procfs import end_all, processes_marked

RUNTIME_VAR = "AGENTHOST_RUNTIME"
"""The environment variable holding a runtime's marker. Neither Codex's
`shell_environment_policy` default excludes (names holding KEY, SECRET or TOKEN) nor the Claude
CLI's Bash tool drop it."""

WORKER_VAR = "AGENTHOST_WORKER"
"""The environment variable holding a worker incarnation's marker, given by the supervisor at
its spawn and inherited by every provider it starts and what they start: a killed worker's
runtimes are never stopped by it, so its supervisor ends what still carries it
(`end_worker_left`)."""

END_LEFT_WAIT_S = 2.0
"""How long a stop waits for the processes its runtime left to be gone (`end_left`)."""


def new_marker() -> str:
    return uuid.uuid4().hex


@dataclass(slots=True)
class RuntimeMarker:
    """One runtime's marker, and whether its stop looks for what it left."""

    value: str = field(default_factory=new_marker)
    may_leave: bool = True
    """Whether the runtime may leave processes (a Session's: its Turns' tools start them): only
    then does its stop scan `/proc` (a read of every environment) for what it left."""

    def end_left(self) -> list[int]:
        """Once the runtime's provider process has exited: SIGKILL every process still carrying
        the marker and wait up to `END_LEFT_WAIT_S` until none is left (the pids killed), so a
        stop, once answered, leaves nothing of its runtime. Nothing without `may_leave`."""
        return end_left_of([self])


def end_left_of(markers: Iterable[RuntimeMarker]) -> list[int]:
    """`RuntimeMarker.end_left` for several runtimes at once (a worker's shutdown): one scan
    of `/proc` for all their markers."""
    values = {m.value for m in markers if m.may_leave and m.value}
    if not values:
        return []
    return end_all(lambda: processes_marked(RUNTIME_VAR, values), END_LEFT_WAIT_S)


def end_worker_left(incarnation: str) -> list[int]:
    """After a worker incarnation died (killed, crashed, wedged and killed): SIGKILL every
    process still carrying its marker (`WORKER_VAR`) — its providers' tools' processes; the
    providers themselves die with it (their parent-death signal) — and wait up to
    `END_LEFT_WAIT_S` until none is left, before a successor starts. The pids killed."""
    if not incarnation:
        return []
    return end_all(lambda: processes_marked(WORKER_VAR, {incarnation}), END_LEFT_WAIT_S)
