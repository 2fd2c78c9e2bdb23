"""The one timer service of the daemon's actors: a single thread runs every delayed callback
(fork budgets, retries of durable writes, turn inactivity watchdogs, pooled actors' delayed
messages). A `threading.Timer` per pending delay would be a thread per active Turn, which does
not scale to hundreds of Sessions. The `ActorPool` owns one; actors reach it through their
context (`ctx.actor_pool.call_later`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TimerHandle:
    """What `call_later` returns: `cancel()` it, like a `threading.Timer`."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """`call_later(seconds, fn)` runs `fn` on the timer thread (keep it short: a `tell`)."""

    def __init__(self, name: str = "agenthost-timers") -> None:
        self._heap: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._name = name

    def call_later(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._cond:
            if self._closed:
                handle.cancel()
                return handle
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), handle, fn))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def pending(self) -> int:
        with self._cond:
            return sum(1 for _, _, h, _ in self._heap if not h.cancelled)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, handle, fn = self._heap[0]
                    left = due - time.monotonic()
                    if left > 0:
                        self._cond.wait(left)
                        continue
                    heapq.heappop(self._heap)
                    break
            if handle.cancelled:
                continue
            try:
                fn()
            except Exception:  # noqa: BLE001 - one bad callback must not stop every timer
                log.exception("timer callback failed")
