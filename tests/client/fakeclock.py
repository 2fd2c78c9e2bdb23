"""A fake clock for the Engine's `Scheduler` port: time moves only when a test calls `advance`,
which runs every due timer in due order on the calling thread (so backoff tests never sleep)."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable


class FakeTimer:
    __slots__ = ("cancelled", "due", "fn")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, FakeTimer]] = []
        self._seq = itertools.count()
        # Timers are also scheduled from the client's socket thread (reply callbacks).
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def call_later(self, delay: float, fn: Callable[[], None]) -> FakeTimer:
        with self._lock:
            timer = FakeTimer(self._now + max(0.0, delay), fn)
            heapq.heappush(self._heap, (timer.due, next(self._seq), timer))
            return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, running each timer that falls due, in order."""
        with self._lock:
            target = self._now + seconds
        while True:
            with self._lock:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap or self._heap[0][0] > target:
                    self._now = target
                    return
                due, _, timer = heapq.heappop(self._heap)
                self._now = max(self._now, due)
            timer.fn()

    def pending(self) -> list[float]:
        """Due times of the live timers, soonest first."""
        with self._lock:
            return sorted(t.due for _, _, t in self._heap if not t.cancelled)
