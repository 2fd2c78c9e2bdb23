"""The shared timer heap stays bounded by its live timers: every Turn arms a 30-minute
inactivity watchdog and cancels it when it settles, and a cancelled entry must neither stay
in the heap until its due time nor keep its callback (the Turn's state, through the closure)
alive meanwhile."""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from actors.pool import COMPACT_MIN, Timers
from tests.support.counting_lock import CountingLock


class _TurnState:
    """Stands for what a watchdog's closure holds."""


def test_cancelled_timers_leave_the_heap_and_let_go_of_their_callbacks() -> None:
    timers = Timers()
    held: list[weakref.ref[_TurnState]] = []
    for _ in range(10_000):
        state = _TurnState()
        held.append(weakref.ref(state))
        handle = timers.call_later(1800.0, lambda state=state: None)  # type: ignore[misc]
        handle.cancel()
        del state
    gc.collect()
    assert len(timers) <= COMPACT_MIN + 1
    assert sum(1 for ref in held if ref() is not None) == 0


def test_live_timers_are_kept_and_still_fire_among_cancelled_ones() -> None:
    timers = Timers()
    fired = threading.Event()
    live = [timers.call_later(1800.0, lambda: None) for _ in range(100)]
    for _ in range(1_000):
        timers.call_later(1800.0, lambda: None).cancel()
    timers.call_later(0.01, fired.set)
    assert fired.wait(5)
    assert 100 <= len(timers) <= 2 * (100 + COMPACT_MIN)
    for handle in live:
        handle.cancel()
    assert len(timers) <= COMPACT_MIN + 1


def test_a_timer_that_fired_cannot_be_cancelled_into_the_count() -> None:
    timers = Timers()
    fired = threading.Event()
    handle = timers.call_later(0.0, fired.set)
    assert fired.wait(5)
    handle.cancel()
    assert handle.cancelled
    assert len(timers) == 0


def test_a_timer_due_after_another_does_not_wake_the_thread_and_all_fire_in_order() -> None:
    timers = Timers()
    order: list[str] = []
    done = threading.Event()
    timers.call_later(0.2, lambda: order.append("first"))
    assert timers.wakes == 1
    # Due later than the pending one: found when the thread wakes for that one.
    timers.call_later(0.4, lambda: (order.append("third"), done.set()))
    assert timers.wakes == 1
    # Due before every other one: the sleeping thread must look again, or it fires late.
    timers.call_later(0.0, lambda: order.append("zeroth"))
    assert timers.wakes == 2
    timers.call_later(0.3, lambda: order.append("second"))
    assert timers.wakes == 2
    assert done.wait(5)
    assert order == ["zeroth", "first", "second", "third"]
    timers.close()


def _python_calls_into_threading(action: Callable[[], object]) -> list[str]:
    """The functions of `threading.py` that `action` calls (Python code only; a lock's C
    methods are not seen)."""
    seen: list[str] = []

    def profile(frame: Any, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_filename == threading.__file__:
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return seen


def test_arming_a_timer_runs_no_python_code_of_threading() -> None:
    # Every Turn arms ~5 timers: the arm takes the heap's lock directly (not through the
    # Condition's Python `__enter__`/`__exit__`) and, the thread ending only at `close`,
    # never asks `Thread.is_alive()` (three Python calls).
    timers = Timers()
    timers.call_later(1800.0, lambda: None)  # starts the thread
    # Due after the pending one: no wake-up (its `notify` is Python code, and needed).
    assert _python_calls_into_threading(lambda: timers.call_later(3600.0, lambda: None)) == []
    timers.close()


def test_a_callback_that_raises_even_a_base_exception_does_not_stop_the_timers() -> None:
    # The thread is started once and only `close` ends it: a callback's SystemExit must not
    # end it either, or every later timer (fork budgets, watchdogs) would never fire.
    timers = Timers()
    fired = threading.Event()

    def bad() -> None:
        raise SystemExit(3)

    timers.call_later(0.0, bad)
    timers.call_later(0.05, fired.set)
    assert fired.wait(5)
    timers.close()


def test_cancelling_a_timer_takes_no_lock_unless_it_compacts_the_heap() -> None:
    # A Turn cancels ~4.5 timers (its watchdog, backstops, linger bounds): counted by one
    # atomic `next`, the heap's lock taken only to compact.
    timers = Timers()
    timers.call_later(1800.0, lambda: None)
    handle = timers.call_later(3600.0, lambda: None)
    counting = CountingLock(timers._lock)
    timers._lock = counting  # type: ignore[assignment]
    handle.cancel()
    assert handle.cancelled
    assert counting.taken == 0
    for _ in range(COMPACT_MIN + 1):
        timers.call_later(3600.0, lambda: None).cancel()
    assert counting.taken >= 1  # the compaction's
    timers.close()


def test_cancels_from_many_threads_at_once_keep_the_heap_bounded() -> None:
    # The count is taken without the lock: none may be lost (the heap would grow with every
    # Turn's watchdog again), whatever the threads' interleaving.
    timers = Timers()
    live = [timers.call_later(1800.0, lambda: None) for _ in range(50)]
    start = threading.Barrier(8)

    def churn() -> None:
        start.wait()
        for _ in range(3_000):
            timers.call_later(1800.0, lambda: None).cancel()

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 50 <= len(timers) <= 2 * (50 + COMPACT_MIN)
    assert timers.pending() == 50
    for handle in live:
        handle.cancel()
    assert len(timers) <= 2 * COMPACT_MIN
    timers.close()
