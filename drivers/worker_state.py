"""The supervisor's record of each worker, as its loop thread keeps it: the lifecycle states
(`WorkerState`), a request waiting for its answer (`Pending`), one provider's incarnations,
sockets, queues and restart backoff (`WorkerRecord`), and the status row `status()` shows.
Plain data; only the supervisor's loop thread mutates it."""

from __future__ import annotations

import subprocess
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from protocol.objects import WorkerStatus
from transport.worker_link import HostEnd

BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0
STABLE_AFTER_S = 10.0  # a worker alive this long resets the restart backoff


class WorkerState(StrEnum):
    STARTING = "starting"
    """Spawned, no hello yet: requests queue (never sent)."""
    READY = "ready"
    """Said hello and heartbeats: requests are sent at once."""
    BACKOFF = "backoff"
    """Died; respawns when the backoff elapses."""
    STOPPED = "stopped"
    """Closed with the supervisor."""


@dataclass(slots=True)
class Pending:
    req_id: int
    provider: str
    method: str
    params: dict[str, Any]
    future: Future[dict[str, Any]]
    deadline: float | None
    sent: bool = False


@dataclass(slots=True)
class WorkerRecord:
    """Loop-thread-only mutable state of one provider's worker."""

    provider: str
    state: WorkerState = WorkerState.STARTING
    proc: subprocess.Popen[bytes] | None = None
    end: HostEnd | None = None
    pidfd: int | None = None
    """A descriptor of `proc` (`os.pidfd_open`) in the loop's poll set: readable once the
    process has exited. None where the kernel has none: the loop's tick polls `proc`."""
    generation: int = 0
    incarnation: str = ""
    """The marker of the incarnation running (`drivers.runtime_marker.WORKER_VAR`)."""
    restarts: int = 0
    spawned_at: float = 0.0
    last_seen: float = 0.0
    last_hb: float = 0.0
    backoff: float = BACKOFF_INITIAL_S
    restart_at: float | None = None
    last_error: str | None = None
    cpu_ticks: int | None = None
    cpu_sampled_at: float = 0.0
    busy_silences: int = 0
    spawned_points: dict[str, str] = field(default_factory=dict)
    """The failpoints this incarnation was started with (its environment): points armed while
    it was starting are sent to it when it says hello."""
    queued: deque[Pending] = field(default_factory=deque)
    inflight: dict[int, Pending] = field(default_factory=dict)

    def status_row(self) -> WorkerStatus:
        """The row `WorkerSupervisor.status()` shows for this provider."""
        return {
            "provider": self.provider,
            "pid": self.proc.pid if self.proc is not None else None,
            "state": self.state.value,
            "restarts": self.restarts,
            # Why the last incarnation died or could not start (e.g. "spawn failed:
            # OSError: [Errno 24] Too many open files"); null until one did.
            "lastError": self.last_error,
            # Watchdog windows in which the worker was silent but running (busy, kept).
            "busySilences": self.busy_silences,
        }
