"""Large objects a worker request built, released after its answer has left: on a thread of
their own, a slice at a time.

A fork of a 10,000-Turn thread ends holding the binder's decoded rollout (60,000 line objects
and their payloads, about a million containers). Dropping it where the fork returns frees them
all in one uninterrupted C-level deallocation (tens of milliseconds) between the fork's verdict
and its answer reaching the host. Handed here instead, they are freed shortly after, in slices
between which the interpreter may switch threads, so a later request is never held up by more
than a slice. The cyclic collector stays held off (`hold_collector`) from the hand-over until
they are freed: a collection in between would walk every one of them (they were built while
the fork held it off). Nothing here changes what is kept or answered: only when the memory is
returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from queue import SimpleQueue

from tutti_agent.gc_pause import hold_collector

SETTLE_SECONDS = 0.05
"""How long a batch waits before it is freed: long enough for the answer it followed to be
encoded and sent by the link thread."""
SLICE = 256
"""Elements of a list freed per step (a decoded rollout line is some tens of objects)."""

_queue: SimpleQueue[tuple[list[object], Callable[[], None]]] = SimpleQueue()
_started = False
_start_lock = threading.Lock()


def release_later(objects: list[object]) -> None:
    """Take over `objects` (the caller keeps no reference to them): each is dropped after
    `SETTLE_SECONDS`, a list's elements `SLICE` at a time; the collector is held off until
    then. Call it while the objects' builder still holds the collector off."""
    global _started
    if not objects:
        return
    with _start_lock:
        if not _started:
            threading.Thread(target=_run, name="deferred-release", daemon=True).start()
            _started = True
    _queue.put((objects, hold_collector()))


def _run() -> None:
    while True:
        batch, resume = _queue.get()
        try:
            time.sleep(SETTLE_SECONDS)
            drain(batch)
        finally:
            del batch
            resume()


def drain(batch: list[object]) -> None:
    """Drop every object of `batch`, emptying lists slice by slice first."""
    while batch:
        obj = batch.pop()
        if isinstance(obj, list):
            while obj:
                del obj[-SLICE:]
        del obj
