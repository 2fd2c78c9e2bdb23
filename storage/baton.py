"""The writer baton: one writer at a time on the store's one writer connection, handed on
first come, first served: one writer, no busy-handler sleeps."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import apsw

from domain.errors import StoreBusy

BACKGROUND_MAX_WAIT_S = 0.1
"""How long a background writer may be overtaken by foreground ones before it goes next."""

_Entry = tuple[int, threading.Lock, float]


class Baton:
    """Each queued writer blocks on its own lock and the holder hands the baton to the first
    one only: no herd of waking threads fighting over the GIL and the lock, no writer
    overtaken again and again. `lock` guards the queue (and, for the store, its counters).

    Two queues, each first come, first served: a client's request waits on a *foreground*
    write, while a *background* one (a fork saga's steps after its prepare: `dispatching`,
    `provider_accepted`, the commit) has no request waiting on it, only its own pipeline. A
    foreground writer goes ahead of queued background ones, unless the first of those has
    waited `background_max_wait_s` already: then it goes next, so background writes are
    delayed by at most that, never starved."""

    def __init__(self) -> None:
        self.lock = threading.Condition(threading.Lock())
        self.owner: int | None = None
        self._queue: deque[_Entry] = deque()
        self._background: deque[_Entry] = deque()
        self.background_max_wait_s = BACKGROUND_MAX_WAIT_S
        self._local = threading.local()

    @property
    def waiting(self) -> int:
        return len(self._queue) + len(self._background)

    @contextmanager
    def background(self) -> Iterator[None]:
        """This thread's `take`s in the block queue as background writers: no client request
        waits on them, so a client's write queued meanwhile goes first."""
        held = getattr(self._local, "background", False)
        self._local.background = True
        try:
            yield
        finally:
            self._local.background = held

    def take(self, timeout_s: float) -> None:
        """Become the writer, waiting up to `timeout_s` behind the others (then a retryable
        `StoreBusy`, as a wait on another process's lock ends)."""
        me = threading.get_ident()
        background = getattr(self._local, "background", False)
        with self.lock:
            if self.owner == me:
                # A write inside a write of the same thread: refused as SQLite refused it.
                raise apsw.SQLError("cannot start a transaction within a transaction")
            if self.owner is None and not self.waiting:
                self.owner = me
                return
            entry = (me, threading.Lock(), time.monotonic())
            entry[1].acquire()
            queue = self._background if background else self._queue
            queue.append(entry)
        # `pass_on` makes this thread the owner, then releases its lock.
        if entry[1].acquire(timeout=timeout_s):
            return
        with self.lock:
            if self.owner == me:  # handed over just as the wait timed out
                return
            queue.remove(entry)
        raise StoreBusy("the store is busy with other writes, try again")

    def pass_on(self) -> None:
        with self.lock:
            later = self._background
            if later and (
                not self._queue or time.monotonic() - later[0][2] >= self.background_max_wait_s
            ):
                owner, wake, _ = later.popleft()
            elif self._queue:
                owner, wake, _ = self._queue.popleft()
            else:
                self.owner = None
                return
            self.owner = owner
            wake.release()
