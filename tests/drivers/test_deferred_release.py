"""Objects handed to `release_later` are freed after it returns, on its own thread, lists
emptied a slice at a time, the cyclic collector held off until then; nothing is freed while
the caller still holds it."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from drv_helpers import wait_until

from drivers.app_server.fork import SLICE, drain, release_later

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
