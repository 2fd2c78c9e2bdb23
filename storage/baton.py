"""The writer baton: one writer at a time on the store's one writer connection, handed on
first come, first served (issue 20 "one writer, no busy-handler sleeps")."""

from __future__ import annotations

import threading
from collections import deque

import apsw

from storage.errors import StoreBusy


class Baton:
    """Each queued writer blocks on its own lock and the holder hands the baton to the first
    one only: no herd of waking threads fighting over the GIL and the lock, no writer
    overtaken again and again. `lock` guards the queue (and, for the store, its counters)."""

    def __init__(self) -> None:
        self.lock = threading.Condition(threading.Lock())
        self.owner: int | None = None
        self._queue: deque[tuple[int, threading.Lock]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def take(self, timeout_s: float) -> None:
        """Become the writer, waiting up to `timeout_s` behind the others (then a retryable
        `StoreBusy`, as a wait on another process's lock ends)."""
        me = threading.get_ident()
        with self.lock:
            if self.owner == me:
                # A write inside a write of the same thread: refused as SQLite refused it.
                raise apsw.SQLError("cannot start a transaction within a transaction")
            if self.owner is None and not self._queue:
                self.owner = me
                return
            entry = (me, threading.Lock())
            entry[1].acquire()
            self._queue.append(entry)
        # `pass_on` makes this thread the owner, then releases its lock.
        if entry[1].acquire(timeout=timeout_s):
            return
        with self.lock:
            if self.owner == me:  # handed over just as the wait timed out
                return
            self._queue.remove(entry)
        raise StoreBusy("the store is busy with other writes, try again")

    def pass_on(self) -> None:
        with self.lock:
            if self._queue:
                owner, wake = self._queue.popleft()
                self.owner = owner
                wake.release()
            else:
                self.owner = None
