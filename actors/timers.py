"""One shared timer thread for every actor's delayed messages (fork budgets, retries of
durable writes, turn inactivity watchdogs): a `threading.Timer` per pending delay would be a
thread per active Turn, which does not scale to hundreds of Sessions."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TimerHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SharedTimers:
    """`call_later(seconds, fn)` runs `fn` on the timer thread (keep it short: a `tell`)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), handle, fn))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agenthost-timers", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return handle

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
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


TIMERS = SharedTimers()
