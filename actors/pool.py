"""Pooled actors: many pykka actors on one bounded set of threads, and their one timer thread.

A `pykka.ThreadingActor` owns a thread for its whole life, so 700 live Session actors would
mean 700 threads. `PooledActor` is our pykka flavour, a framework base in the way
`pykka.ThreadingActor` is one: abstract (an `abc.ABC`), it keeps pykka's contract — one
message at a time, in order, `on_start`/`on_stop`/`on_failure`, `ActorRef.tell/ask/stop` —
but runs on an `ActorPool`: when its inbox turns non-empty the actor is scheduled once on the
pool, handles a small batch, and yields its thread to the next actor (round-robin, so a
chatty Session cannot starve the others). An idle actor costs no thread.

The pool also owns the daemon's one timer service (`Timers`, `call_later`): a single thread
runs every delayed callback (fork budgets, retries of durable writes, turn inactivity
watchdogs, pooled actors' delayed messages), so per-actor timers do not mean one thread each
either — a `threading.Timer` per pending delay would be a thread per active Turn.

A cancelled timer lets go of its callback at once and leaves the heap soon after: every Turn
arms a watchdog of `turn_inactivity_seconds` (30 min) and cancels it when it settles, and a
cancelled entry left in the heap until its due time kept the Turn's whole state (through the
callback's closure) for those 30 minutes — the daemon grew with every tiny Turn. The heap
holds at most twice its live timers (plus `COMPACT_MIN`).
"""

from __future__ import annotations

import abc
import heapq
import itertools
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pykka
from pykka import ActorDeadError, ActorRegistry, messages
from pykka._envelope import Envelope

from domain.wake_one import WakeOneThreads

log = logging.getLogger(__name__)

DEFAULT_ACTOR_THREADS = 32
"""Threads that run every Session actor of one daemon (`[daemon] actor_threads`)."""

_BATCH = 16
"""Messages one actor handles before it yields its thread to the next scheduled actor."""


# -- the one timer thread --------------------------------------------------------------------

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
        # Cancelled entries still in the heap: `next(self._cancels)` (taken by each cancel,
        # without the lock: `next` on a count is one atomic C call) minus `_removed` (the count
        # when the heap was last compacted, plus the cancelled entries the thread popped since;
        # written under the lock). A cancel racing a compaction or a pop may count once too
        # often until the next compaction: the bound below is kept either way.
        self._cancels = itertools.count(1)
        self._removed = 0
        self._seq = itertools.count()
        # Held directly (`with self._lock`), not through the Condition's Python `__enter__`
        # and `__exit__`: the Condition is only for the thread's wait and its wake-up.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Started by the first `call_later`; it ends only at `close` (a callback that raises,
        # even a BaseException, is logged), after which nothing is armed: `is None` is the
        # whole check, no `Thread.is_alive()` per arm.
        self._thread: threading.Thread | None = None
        self._closed = False
        self._name = name
        self.wakes = 0
        """Times `call_later` woke the thread (a timer due before every other one)."""

    def __len__(self) -> int:
        """Entries in the heap, cancelled ones not yet compacted away included."""
        with self._lock:
            return len(self._heap)

    def call_later(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        with self._lock:
            if self._closed:
                return TimerHandle()  # born cancelled
            handle = TimerHandle(fn, self)
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), handle))
            if self._thread is None:
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
        with self._lock:
            return sum(1 for _, _, h in self._heap if not h.cancelled)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._heap.clear()
            self._removed = next(self._cancels)
            self._cond.notify_all()

    def _cancelled_one(self) -> None:
        """A handle of this heap was cancelled: counted without the lock (a Turn cancels ~4.5
        timers), which is taken only to compact."""
        if next(self._cancels) - self._removed > max(COMPACT_MIN, len(self._heap) // 2):
            self._compact()

    def _compact(self) -> None:
        with self._lock:
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._removed = next(self._cancels)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, handle = self._heap[0]
                    if handle.cancelled:
                        heapq.heappop(self._heap)
                        self._removed += 1
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
            except BaseException:  # noqa: BLE001 - one bad callback must not stop every timer
                log.exception("timer callback failed")


# -- the threads and the pooled actors ------------------------------------------------------


class ActorPool:
    """A bounded thread pool plus a single timer thread, shared by the actors of one daemon.

    The threads are `domain.wake_one.WakeOneThreads`, not a `ThreadPoolExecutor`: every message
    to an idle actor is one `submit`, and the executor's made a `Future` (a Condition each), a
    work item and a semaphore round trip per call (~4 % of the daemon's CPU at 16 forking
    clients); nothing ever waits on a slice's result, and a slice that raises is logged. A
    slice wakes ONE idle thread, the one idle last: on one `SimpleQueue` both of the Session
    actors' idle threads woke for every slice (~4 voluntary switches a slice, ~2 so), and the
    last idle thread first keeps one Session's consecutive slices on one thread
    (`tests/actors/test_pool_threads.py`). A slice submitted while no thread is idle starts one
    under the bound, or waits for the next thread done (FIFO)."""

    def __init__(self, max_threads: int = DEFAULT_ACTOR_THREADS, *, name: str = "actor") -> None:
        self.max_threads = max(1, int(max_threads))
        self._threads = WakeOneThreads(self.max_threads, name)
        self.timers = Timers(f"{name}-timer")

    def submit(self, fn: Callable[[], None]) -> None:
        try:
            self._threads.submit(fn)
        except RuntimeError:  # shut down: the daemon is closing, nothing runs any more
            log.debug("actor pool closed; dropped a scheduled slice")

    def call_later(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        """Run `fn` on the pool's timer thread after `seconds` (it must not block)."""
        return self.timers.call_later(seconds, fn)

    def close(self) -> None:
        """No more slices; each thread ends after the slices already queued."""
        self.timers.close()
        self._threads.shutdown(wait=False)


MAX_AHEAD = 8
"""How many messages may go ahead of an actor's background messages before one of those is
handled: a stream of requests cannot hold a Turn's driver events back for longer."""


def _is_background(owner: PooledActor, envelope: Envelope[Any]) -> bool:
    return envelope.reply_to is None and owner.is_background(envelope.message)


class _PooledInbox:
    """pykka's inbox protocol (`put`/`get`/`empty`); `put` schedules the owner on its pool."""

    def __init__(self) -> None:
        self._items: deque[Envelope[Any]] = deque()
        self._lock = threading.Lock()
        self._owner: PooledActor | None = None
        # True while a slice is queued or running (and before the actor started), so an
        # actor is never on two pool threads at once.
        self._scheduled = True
        # Messages put ahead of background ones since a background one was last taken
        # (`PooledActor.goes_ahead`); at `MAX_AHEAD` the next one queues at the back.
        self._ahead = 0

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            owner = self._owner
            if (
                owner is not None
                and envelope.reply_to is None
                and self._ahead < MAX_AHEAD
                and owner.goes_ahead(envelope.message)
            ):
                # In front of the background messages at the back of the queue, never in
                # front of anything else (another request keeps its place).
                at = len(self._items)
                while at and _is_background(owner, self._items[at - 1]):
                    at -= 1
                if at < len(self._items):
                    self._ahead += 1
                self._items.insert(at, envelope)
            else:
                self._items.append(envelope)
            if self._scheduled or owner is None:
                return
            self._scheduled = True
        owner._schedule()

    def _taken(self, envelope: Envelope[Any]) -> Envelope[Any]:
        owner = self._owner
        if owner is not None and _is_background(owner, envelope):
            self._ahead = 0
        return envelope

    def get(self) -> Envelope[Any]:
        with self._lock:
            return self._taken(self._items.popleft())

    def empty(self) -> bool:
        with self._lock:
            return not self._items

    def idle(self) -> bool:
        """No message queued and no slice queued or running: the actor handles nothing now
        (a message it is in the middle of keeps its slice scheduled)."""
        with self._lock:
            return not self._scheduled and not self._items

    def take_or_idle(self) -> Envelope[Any] | None:
        """The next envelope, or None after marking the actor unscheduled (atomically).

        A slice's every take (~15 a Turn): while nothing went ahead (`_ahead` 0, nearly
        always) there is no count to reset, and the actor is not asked `is_background`."""
        with self._lock:
            if self._items:
                envelope = self._items.popleft()
                if self._ahead:
                    return self._taken(envelope)
                return envelope
            self._scheduled = False
            return None


class PooledActor(pykka.Actor, abc.ABC):
    """A pykka actor whose messages run on `self.actor_pool` instead of an own thread.

    An abstract framework base, like `pykka.ThreadingActor`: it carries the scheduling only
    (inbox, slices, gate, teardown); a concrete actor owns its state as parts and says which
    of its messages may go ahead of which (`goes_ahead`, `is_background`). Subclasses set
    `actor_pool` in `__init__` (before `start()` returns) and may pass a `predecessor` future
    (`wait_for`): the actor handles nothing (not even `on_start`) until it is done, without
    holding a pool thread while it waits.
    """

    actor_pool: ActorPool

    @staticmethod
    def _create_actor_inbox() -> Any:
        return _PooledInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._started = False
        self._torn_down = False
        self._gate: pykka.Future[Any] | None = None
        self._gate_deadline = 0.0

    def wait_for(self, predecessor: pykka.Future[Any] | None, timeout: float = 30.0) -> None:
        """Handle nothing until `predecessor` completes (or `timeout` s pass)."""
        self._gate = predecessor
        self._gate_deadline = time.monotonic() + timeout

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, _PooledInbox)
        inbox._owner = self
        self._schedule()

    @abc.abstractmethod
    def goes_ahead(self, message: Any) -> bool:
        """Whether `message` (a `tell`) is queued in front of the background messages waiting
        at the back of the inbox (`is_background`), up to `MAX_AHEAD` in a row. Called on the
        sender's thread: it must only look at the message (False keeps plain FIFO order)."""

    @abc.abstractmethod
    def is_background(self, message: Any) -> bool:
        """Whether a `goes_ahead` message may be handled before `message`."""

    def next_message(self) -> Any:
        """The message this actor handles next, if one is already queued (else None).

        Asked on the actor's own thread only (in a receive, ~8.5 a Turn), so the inbox is read
        in place, without its lock or a call: only this thread takes from the deque, a `put`
        meanwhile only adds to it (each deque call is atomic), and the answer is what this
        thread takes next unless a later `put` goes ahead of it — as with the lock, which a
        `put` could take the moment after."""
        inbox = self.actor_inbox
        if not isinstance(inbox, _PooledInbox):
            return None
        items = inbox._items
        return items[0].message if items else None

    def _schedule(self) -> None:
        self.actor_pool.submit(self._run_slice)

    def _gate_open(self) -> bool:
        gate = self._gate
        if gate is None:
            return True
        try:
            gate.get(timeout=0)
        except pykka.Timeout:
            if time.monotonic() < self._gate_deadline:
                return False
        except Exception:  # noqa: BLE001 - a dead predecessor has nothing left to drain
            pass
        self._gate = None
        return True

    def _run_slice(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, _PooledInbox)
        if self._gate is not None and not self._gate_open():  # no call once it is open
            # Poll again shortly from the timer thread; no pool thread waits meanwhile.
            self.actor_pool.call_later(0.01, self._schedule)
            return
        if not self._started:
            self._started = True
            self._actor_loop_setup()
        for _ in range(_BATCH):
            if self.actor_stopped.is_set():
                self._teardown(inbox)
                return
            envelope = inbox.take_or_idle()
            if envelope is None:
                return
            self._handle_envelope(envelope)
        if self.actor_stopped.is_set():
            self._teardown(inbox)
            return
        self._schedule()  # more to do: go to the back of the pool's queue

    def _teardown(self, inbox: _PooledInbox) -> None:
        """pykka's `_actor_loop_teardown`: answer what is left (a stop with None, an ask with
        ActorDeadError). A later put schedules another slice, which answers it too."""
        while (envelope := inbox.take_or_idle()) is not None:
            if envelope.reply_to is None:
                continue
            if isinstance(envelope.message, messages._ActorStop):
                envelope.reply_to.set(None)
            else:
                dead = ActorDeadError(f"{self.actor_ref} stopped before handling the message")
                envelope.reply_to.set_exception(exc_info=(ActorDeadError, dead, None))

    def _handle_envelope(self, envelope: Envelope[Any]) -> None:
        # The body of pykka's `_actor_loop_running`, for one envelope.
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:  # noqa: BLE001
                    self._handle_failure(*sys.exc_info())
        except BaseException:  # noqa: BLE001 - pykka's contract: stop everything
            self._stop()
            ActorRegistry.stop_all()


def handling(ref: pykka.ActorRef[Any]) -> bool:
    """Whether a pooled actor has a message queued or in hand (False for any other actor)."""
    inbox = ref.actor_inbox
    return isinstance(inbox, _PooledInbox) and not inbox.idle()


__all__ = ["DEFAULT_ACTOR_THREADS", "ActorPool", "PooledActor", "handling"]
