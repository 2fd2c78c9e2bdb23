"""The one timer service of the daemon's actors: a single thread runs every delayed callback
(fork budgets, retries of durable writes, turn inactivity watchdogs, pooled actors' delayed
messages). A `threading.Timer` per pending delay would be a thread per active Turn, which does
not scale to hundreds of Sessions. The `ActorPool` owns one; actors reach it through their
context (`ctx.actor_pool.call_later`).

A cancelled timer lets go of its callback at once and leaves the heap soon after: every Turn
arms a watchdog of `turn_inactivity_seconds` (30 min) and cancels it when it settles, and a
cancelled entry left in the heap until its due time kept the Turn's whole state (through the
callback's closure) for those 30 minutes — the daemon grew with every tiny Turn. The heap
holds at most twice its live timers (plus `COMPACT_MIN`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

COMPACT_MIN = 32
"""Cancelled entries the heap may hold before it is compacted, whatever its size."""


class TimerHandle:
    """What `call_later` returns: `cancel()` it, like a `threading.Timer`; cancelling drops
    the callback (and what it holds)."""

    __slots__ = ("_fn", "_owner")

    def __init__(self, fn: Callable[[], None] | None = None, owner: Timers | None = None) -> None:
        self._fn = fn
        self._owner = owner

    @property
    def cancelled(self) -> bool:
        return self._fn is None

    def cancel(self) -> None:
        if self._fn is None:
            return
        self._fn = None
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._cancelled_one()

    def _take(self) -> Callable[[], None] | None:
        """The callback, once: a timer that fired is spent (a later `cancel` is a no-op)."""
        fn, self._fn, self._owner = self._fn, None, None
        return fn


class Timers:
    """`call_later(seconds, fn)` runs `fn` on the timer thread (keep it short: a `tell`)."""

    def __init__(self, name: str = "agenthost-timers") -> None:
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._cancelled = 0  # cancelled entries still in the heap
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._name = name
        self.wakes = 0
        """Times `call_later` woke the thread (a timer due before every other one)."""

    def __len__(self) -> int:
        """Entries in the heap, cancelled ones not yet compacted away included."""
        with self._cond:
            return len(self._heap)

    def call_later(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        with self._cond:
            if self._closed:
                return TimerHandle()  # born cancelled
            handle = TimerHandle(fn, self)
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), handle))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if self._heap[0][2] is handle:
                # Due before every other entry: the thread sleeps until the old first one's
                # time (or for ever), so it must look again. A later one is found when the
                # thread wakes for the earlier: no wake-up (a fork's 2 s budget, armed and
                # cancelled on every fork, never wakes the thread while anything is due first).
                self.wakes += 1
                self._cond.notify()
        return handle

    def pending(self) -> int:
        with self._cond:
            return sum(1 for _, _, h in self._heap if not h.cancelled)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify_all()

    def _cancelled_one(self) -> None:
        with self._cond:
            self._cancelled += 1
            if self._cancelled > max(COMPACT_MIN, len(self._heap) // 2):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, handle = self._heap[0]
                    if handle.cancelled:
                        heapq.heappop(self._heap)
                        self._cancelled = max(0, self._cancelled - 1)
                        continue
                    left = due - time.monotonic()
                    if left > 0:
                        self._cond.wait(left)
                        continue
                    heapq.heappop(self._heap)
                    break
            fn = handle._take()
            if fn is None:
                continue  # cancelled between the pop and here
            try:
                fn()
            except Exception:  # noqa: BLE001 - one bad callback must not stop every timer
                log.exception("timer callback failed")
