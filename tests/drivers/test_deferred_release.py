"""Objects handed to `release_later` are freed after it returns, on its own thread, lists
emptied a slice at a time, the cyclic collector held off until then, each batch a settle after
its own hand-over; nothing is freed while the caller still holds it; a small batch is freed
where it is handed over."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
from drv_helpers import wait_until

from drivers.app_server.fork import (
    INLINE_ELEMENTS,
    SETTLE_SECONDS,
    SLICE,
    drain,
    release_later,
)

pytestmark = pytest.mark.timeout(30)


class Thing:
    """A weak-referenceable stand-in for a decoded rollout line."""


def test_drain_empties_each_list_and_drops_every_object() -> None:
    lines = [Thing() for _ in range(3 * SLICE + 7)]
    alone = Thing()
    refs = [weakref.ref(t) for t in [*lines, alone]]
    batch: list[object] = [lines, alone]
    del alone
    drain(batch)
    assert batch == [] and lines == []
    assert all(ref() is None for ref in refs)


def test_release_later_frees_on_its_own_thread_and_never_what_is_still_held() -> None:
    gc.collect()
    lines = [Thing() for _ in range(2 * SLICE)]
    kept = lines[0]  # still held by the caller: must survive the release of the list
    freed_on: list[tuple[str, bool]] = []

    class Probe:
        def __del__(self) -> None:
            freed_on.append((threading.current_thread().name, gc.isenabled()))

    lines.append(Probe())
    refs = [weakref.ref(t) for t in lines[1:]]
    release_later([lines])
    del lines
    assert wait_until(lambda: all(ref() is None for ref in refs))
    # Freed on the release thread with the collector still held off; then it is back.
    assert freed_on == [("deferred-release", False)]
    assert wait_until(gc.isenabled)
    assert isinstance(kept, Thing)


def test_a_small_batch_is_freed_where_it_is_handed_over() -> None:
    """A small fork's litter (a few dozen lines) is dropped on the calling thread before
    `release_later` returns: no hand-over to the release thread, no collector held off."""
    lines: list[object] = [Thing() for _ in range(INLINE_ELEMENTS - 2)]
    freed_on: list[str] = []

    class Probe:
        def __del__(self) -> None:
            freed_on.append(threading.current_thread().name)

    lines.append(Probe())
    refs = [weakref.ref(t) for t in lines]
    release_later([lines])
    del lines
    assert all(ref() is None for ref in refs)
    assert freed_on == [threading.current_thread().name]


def test_batches_handed_over_together_wait_from_their_own_hand_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches handed over faster than one per `SETTLE_SECONDS` are each freed a settle after
    their own hand-over, not one settle after another: the release thread's waits for twenty
    batches handed over at once add up to about one settle (one per batch, a second each at
    twenty forks a second, would queue them, and keep the collector held off, for as long as
    the forks keep coming)."""
    import drivers.app_server.fork as fork_module

    real_sleep = time.sleep
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        if threading.current_thread().name == "deferred-release":
            waits.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(fork_module.time, "sleep", sleep)
    refs = []
    for _ in range(20):
        lines = [Thing() for _ in range(INLINE_ELEMENTS)]
        refs += [weakref.ref(lines[0]), weakref.ref(lines[-1])]
        release_later([lines])
        del lines
    assert wait_until(lambda: all(ref() is None for ref in refs))
    assert sum(waits) < 2 * SETTLE_SECONDS, waits
    assert wait_until(gc.isenabled)
