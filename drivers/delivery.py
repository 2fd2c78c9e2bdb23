"""The supervisor's delivery thread: results, failures, turn events and lifecycle events are
handed to their waiters and sinks in arrival order on a thread of their own, so a slow callback
can never starve the loop thread (heartbeats, deadlines) and a sink bug never stops later
deliveries.

One exception, for fewer thread hand-offs on a fork's path and a Turn's stream: the result of
a method whose every waiter only hands it on — `INLINE_METHODS`, answered to a Session actor
by a `tell` — and a streamed delta or a Turn's end (`INLINE_EVENTS`) are delivered on the
loop thread itself when nothing is queued or running here, so arrival order still holds; a
fork then reaches its actor in one hop (loop → actor) instead of two (loop → delivery thread →
actor), each a thread wake-up and a GIL hand-off, and a delta the events queue in one."""

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


INLINE_METHODS = frozenset({"fork", "runtime.attest", "session.start"})
"""Methods whose results may be delivered on the loop thread: their futures' callbacks only
parse the answer and `tell` the Session actor that waits (actors' `later`,
`actors.ports.request_fork`, `agenthost.workers.SupervisorPort`), never block."""


INLINE_EVENTS = frozenset({"message.delta", "turn.completed"})
"""Events the sink may take on the loop thread (when nothing is queued or running here, as
for `INLINE_METHODS`): a streamed delta's sink only puts it on the daemon's events queue
(and, at most once a second, tells the Session actor its reply streams), a Turn's end only
`tell`s its Session actor; neither blocks. A Turn's ~20 deltas each skip a thread hand-off,
and so does its end, on the way to its settlement."""


class Deliveries:
    """One FIFO of callbacks and the thread that runs them. The sinks are read when a job runs
    (a sink set later still hears what was queued before)."""

    def __init__(self) -> None:
        self.event_sink: EventSink | None = None
        self.lifecycle_sink: LifecycleSink | None = None
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # Jobs put and not yet finished; a job runs only while holding `_running`, so an
        # inline one (taken when the backlog is empty) never overtakes nor overlaps a queued one.
        self._backlog = 0
        self._count_lock = threading.Lock()
        self._running = threading.Lock()
        self.inlined = 0  # results delivered on the caller's thread (tests read it)
        self._thread = threading.Thread(target=self._loop, name="worker-delivery", daemon=True)
        self._thread.start()

    def complete(self, pending: Pending, result: dict[str, Any]) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_result(result)

        if pending.method in INLINE_METHODS and self._run_inline(run):
            return
        self._put(run)

    def _put(self, job: Callable[[], None]) -> None:
        with self._count_lock:
            self._backlog += 1
        self._jobs.put(job)

    def _run_inline(self, job: Callable[[], None]) -> bool:
        """Run `job` on this thread if nothing is queued or running (else False: queue it)."""
        with self._count_lock:
            if self._backlog:
                return False
            self._backlog += 1
        try:
            with self._running:
                job()
        except Exception:  # a callback bug must not reach the supervisor's loop
            traceback.print_exc()
        finally:
            with self._count_lock:
                self._backlog -= 1
                self.inlined += 1
        return True

    def fail(self, pending: Pending, exc: HostError) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_exception(exc)

        self._put(run)

    def event(self, provider: str, sid: str, event: dict[str, Any]) -> None:
        def run() -> None:
            sink = self.event_sink
            if sink is not None:
                sink(provider, sid, event)

        if event.get("type") in INLINE_EVENTS and self._run_inline(run):
            return
        self._put(run)

    def lifecycle(self, provider: str, event: dict[str, Any]) -> None:
        def run() -> None:
            sink = self.lifecycle_sink
            if sink is not None:
                sink(provider, event)

        self._put(run)

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
                with self._running:
                    job()
            except Exception:  # a sink bug must not stop later deliveries
                traceback.print_exc()
            finally:
                with self._count_lock:
                    self._backlog -= 1
