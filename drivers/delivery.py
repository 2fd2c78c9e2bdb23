"""The supervisor's delivery thread: results, failures, turn events and lifecycle events are
handed to their waiters and sinks in arrival order on a thread of their own, so a slow callback
can never starve the loop thread (heartbeats, deadlines) and a sink bug never stops later
deliveries."""

from __future__ import annotations

import contextlib
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Any

from domain.errors import HostError
from drivers.worker_state import Pending

EventSink = Callable[[str, str, dict[str, Any]], None]
"""`sink(provider, agent_session_id, event)`; called on the delivery thread, in arrival order."""

LifecycleSink = Callable[[str, dict[str, Any]], None]
"""`sink(provider, {"type": "worker.ready"|"worker.lost", "pid", ...})`: lets the host fail the
turns that were streaming on a worker that died."""


class Deliveries:
    """One FIFO of callbacks and the thread that runs them. The sinks are read when a job runs
    (a sink set later still hears what was queued before)."""

    def __init__(self) -> None:
        self.event_sink: EventSink | None = None
        self.lifecycle_sink: LifecycleSink | None = None
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="worker-delivery", daemon=True)
        self._thread.start()

    def complete(self, pending: Pending, result: dict[str, Any]) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_result(result)

        self._jobs.put(run)

    def fail(self, pending: Pending, exc: HostError) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_exception(exc)

        self._jobs.put(run)

    def event(self, provider: str, sid: str, event: dict[str, Any]) -> None:
        def run() -> None:
            sink = self.event_sink
            if sink is not None:
                sink(provider, sid, event)

        self._jobs.put(run)

    def lifecycle(self, provider: str, event: dict[str, Any]) -> None:
        def run() -> None:
            sink = self.lifecycle_sink
            if sink is not None:
                sink(provider, event)

        self._jobs.put(run)

    def close(self, timeout: float) -> None:
        """Runs what is queued, then stops."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a sink bug must not stop later deliveries
                traceback.print_exc()
