"""The Engine's edges to the outside: the request port (`ApiPort`), the clock (`Scheduler`,
with the real `ThreadScheduler`) and the thread that reads the daemon's events socket.

Tests substitute the request port and the clock; nothing here knows about fork mutations.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol, TypeVar

from protocol.events import ClientEvent
from protocol.methods import Method
from transport.client import EventSubscriber, Reply
from transport.security import ClientCurve

log = logging.getLogger("client.engine")

P = TypeVar("P")
R = TypeVar("R")


class ApiPort(Protocol):
    """What the Engine needs of `transport.client.Client`: non-blocking requests, each typed
    by its `protocol.methods` constant (params in, `Reply[R]` out)."""

    def submit(self, method: Method[P, R], params: P) -> Future[Reply[R]]:
        """Send `method` with its params without waiting."""
        ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """A clock plus delayed calls. Tests substitute a fake clock that runs timers on `advance`."""

    def now(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer: ...


class _ThreadTimer:
    __slots__ = ("cancelled", "due", "fn")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ThreadScheduler:
    """The real scheduler: one daemon thread runs due callbacks in order of their due time."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _ThreadTimer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = _ThreadTimer(self.now() + max(0.0, delay), fn)
        with self._cond:
            heapq.heappush(self._heap, (timer.due, next(self._seq), timer))
            self._cond.notify()
        return timer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._heap and self._heap[0][0] <= self.now():
                        break
                    wait = None if not self._heap else self._heap[0][0] - self.now()
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                try:
                    timer.fn()
                except Exception:  # noqa: BLE001 - one bad callback must not stop the clock
                    log.exception("scheduled callback failed")


class _EventPump:
    """A thread reading the events socket for one workspace and handing events to the Engine."""

    def __init__(
        self,
        endpoint: str,
        workspace_id: str,
        sink: Callable[[ClientEvent], None],
        *,
        curve: ClientCurve | None = None,
        exact: bool = False,
    ) -> None:
        self._workspace_id = workspace_id
        self._sink = sink
        self._stop = threading.Event()
        self._subscriber = EventSubscriber(endpoint, (workspace_id,), curve=curve, exact=exact)
        self._thread = threading.Thread(target=self._run, name="engine-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                message = self._subscriber.next_message(0.1)
                if message is None:
                    continue
                topic, event = message
                if topic != self._workspace_id:
                    continue  # SUB topics are prefixes: "ws" would also match "ws2"
                try:
                    self._sink(event)
                except Exception:  # noqa: BLE001
                    log.exception("event handling failed")
        finally:
            self._subscriber.close()

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)
