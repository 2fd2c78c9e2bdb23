"""The worker's request lanes: a lane is a queue and up to N threads that take requests from
it, handed to by the link thread itself with one lock-free put (no dispatcher thread between
the link and the lane, and no `ThreadPoolExecutor.submit` on the link thread).

Why not an executor: `ThreadPoolExecutor.submit` takes a lock that every `fork()` in the
process also takes (concurrent.futures registers it as an at-fork hook) and may start a
thread; with dozens of app-servers being spawned a submit waited for seconds, which on the
link thread stopped the heartbeats (measured at 200 Sessions). So requests went through a
dispatcher thread that submitted: one more thread hand-off on every request's path. Here the
link thread only puts into a `queue.SimpleQueue` (a C call that never blocks), and a lane's
threads are started by the lane's own threads: whenever one takes a request and leaves no
other idle, it starts a spare (up to N) before running it.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["RequestLane"]


class RequestLane:
    """Runs `handle(msg)` for each `put(msg)` on one of at most `size` threads."""

    def __init__(self, name: str, size: int, handle: Callable[[Any], None]) -> None:
        self.name = name
        self.size = max(1, size)
        self._handle = handle
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._spawn()  # one waiting from the start: the first request starts nothing

    def put(self, msg: Any) -> None:
        """Queue one request (any thread; never blocks, starts no thread)."""
        self._queue.put(msg)

    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    def _spawn(self) -> None:
        with self._lock:
            if self._threads >= self.size:
                return
            self._threads += 1
            number = self._threads
        threading.Thread(target=self._run, name=f"req-{self.name}-{number}", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            msg = self._queue.get()
            with self._lock:
                self._idle -= 1
                spare = self._idle == 0 and self._threads < self.size
            if spare:
                # The next request finds a thread waiting (started here, never on the link).
                self._spawn()
            try:
                self._handle(msg)
            except Exception:  # noqa: BLE001 - one bad request must not stop the lane
                traceback.print_exc(file=sys.stderr)
