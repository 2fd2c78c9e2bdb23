"""A queue whose `put` wakes at most one waiting thread (`WakeOneQueue`), and the small thread
pool built on it (`WakeOneThreads`), for every pool of the daemon and the worker whose idle
threads wait together for work. Standard library only.

Why not `queue.SimpleQueue`: every idle thread waits on its one lock, and a `get` that takes an
item releases that lock as it returns, so with two threads idle one `put` woke both — the
second found nothing, took the interpreter from the thread with the work and slept again
(docs/performance.md, "Every idle pool thread woke for every job"). Here each waiter sleeps on
a lock of its own and a `put` hands its item to ONE of them, the one idle last (LIFO: it is the
likeliest still warm in the caches, and one caller's consecutive jobs stay on one thread).
Items put while nobody waits are taken in the order they were put (FIFO).
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class QueueClosed(RuntimeError):
    """`put` on a closed queue, or `get` on a closed queue with nothing left in it. A
    `RuntimeError`, as an executor's `submit` after its shutdown."""


class _Waiter:
    """One thread asleep in `get`: on `wake` (held while it sleeps) until a `put` hands it
    `item`, or a `close` (`closed`)."""

    __slots__ = ("closed", "item", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # held from birth; held again after each wake-up (reused so)
        self.item: object = None
        self.closed = False


class WakeOneQueue(Generic[T]):
    """`put` hands the item to the thread waiting in `get` since last (LIFO), waking it alone;
    with none waiting the item is queued, and queued items are taken first in, first out.
    `close` ends the waiters (`QueueClosed`); what was queued before it is still taken (or
    returned by `close(drop=True)`)."""

    __slots__ = ("_closed", "_items", "_lock", "_spare", "_waiters", "handed")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiters: list[_Waiter] = []
        self._spare: list[_Waiter] = []  # waiters' locks kept for the next `get`
        self._lock = threading.Lock()
        self._closed = False
        self.handed = 0
        """Items handed straight to a waiting thread (each one wake-up)."""

    @property
    def waiting(self) -> int:
        """Threads asleep in `get` with nothing to do."""
        return len(self._waiters)

    def __len__(self) -> int:
        """Items queued (not yet taken)."""
        return len(self._items)

    def put(self, item: T) -> bool:
        """Hand `item` to the waiter idle last (True: one thread woken) or queue it (False)."""
        with self._lock:
            if self._closed:
                raise QueueClosed("the queue is closed")
            if self._waiters:
                waiter = self._waiters.pop()
                waiter.item = item
                self.handed += 1
                waiter.wake.release()
                return True
            self._items.append(item)
            return False

    def get(self) -> T:
        """The oldest queued item, else the next one put (asleep until then); `QueueClosed`
        once the queue is closed and empty."""
        with self._lock:
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise QueueClosed("the queue is closed")
            waiter = self._spare.pop() if self._spare else _Waiter()
            self._waiters.append(waiter)
        waiter.wake.acquire()  # released by the `put` that hands an item, or by `close`
        if waiter.closed:
            raise QueueClosed("the queue is closed")
        item, waiter.item = waiter.item, None
        # Its lock is held again: kept for the next `get` (one atomic append, no lock).
        self._spare.append(waiter)
        return item  # type: ignore[return-value]

    def get_nowait(self) -> T:
        """The oldest queued item, or `queue.Empty`."""
        with self._lock:
            if self._items:
                return self._items.popleft()
        raise queue.Empty

    def close(self, *, drop: bool = False) -> list[T]:
        """No more `put`s; every waiter ends (`QueueClosed`). The items queued are still taken
        by `get` — or, with `drop`, taken out and returned."""
        with self._lock:
            self._closed = True
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.closed = True
                waiter.wake.release()
            dropped: list[T] = []
            if drop:
                dropped = list(self._items)
                self._items.clear()
            return dropped


class WakeOneThreads:
    """Up to `max_threads` threads running submitted callables, each job handed through a
    `WakeOneQueue` (one idle thread woken per job, the one idle last). A thread starts only when
    a job finds none idle, under the bound; nothing waits on a job's result (a job that raises
    is logged). `shutdown` ends every thread after the jobs queued (or drops them, `drop`);
    at the interpreter's exit it is shut down before the threads are joined."""

    def __init__(self, max_threads: int, name: str) -> None:
        self.max_threads = max(1, int(max_threads))
        self._name = name
        self._queue: WakeOneQueue[Callable[[], object]] = WakeOneQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def idle(self) -> int:
        return self._queue.waiting

    @property
    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._threads)

    def submit(self, fn: Callable[[], object]) -> None:
        """Run `fn` on a pool thread; `QueueClosed` (a `RuntimeError`) once shut down."""
        if self._queue.put(fn) or len(self._threads) >= self.max_threads:
            return
        with self._lock:
            count = len(self._threads)
            if count >= self.max_threads:
                return
            if not count:
                _shut_at_exit(self)
            thread = threading.Thread(target=self._work, name=f"{self._name}_{count}")
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        get = self._queue.get
        while True:
            try:
                fn = get()
            except QueueClosed:
                return
            try:
                fn()
            except BaseException:  # noqa: BLE001 - one job must not end the thread
                log.exception("%s: a job failed", self._name)
            del fn  # not held while this thread sleeps

    def shutdown(self, *, wait: bool = True, drop: bool = False) -> list[Callable[[], object]]:
        """No more jobs; each thread ends after the jobs queued (with `drop`: after its own,
        the queued ones returned, not run). `wait`: join them (not the calling thread)."""
        dropped = self._queue.close(drop=drop)
        if wait:
            me = threading.current_thread()
            for thread in self.threads:
                if thread is not me:
                    thread.join()
        return dropped


def _shut_at_exit(threads: WakeOneThreads) -> None:
    """At the interpreter's exit, before it joins its threads (`threading._shutdown`), the pool
    is shut down so its threads end after the jobs already queued: what an executor's own exit
    hook does. Held weakly: a pool nobody holds is not kept for the hook."""
    ref = weakref.ref(threads)

    def shut() -> None:
        pool = ref()
        if pool is not None:
            pool.shutdown(wait=False)

    threading._register_atexit(shut)  # type: ignore[attr-defined]


__all__ = ["QueueClosed", "WakeOneQueue", "WakeOneThreads"]
