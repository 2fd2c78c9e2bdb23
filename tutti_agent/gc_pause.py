"""The cyclic garbage collector held off while a request builds or reads a large history.

Parsing a 10,000-Turn rollout allocates about a million containers; each allocation burst
past the collector's threshold starts a collection that walks every tracked object the
parse has made so far, and those walks cost more than the parse itself. Nothing a history
read builds is a reference cycle, so holding the collector off for its duration frees
nothing later that would have been freed sooner. Process-wide (the interpreter has one
collector): nested and concurrent holders share one pause, and the collector comes back
as it was when the last one ends."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

FREEZE_AFTER = 100_000
"""A pause that ends with more new containers alive than this (a 10,000-Turn thread's parse is
about a million) moves every tracked object into the collector's permanent generation
(`gc.freeze`, constant time) before the collector comes back: else the collection the next
allocation sets off walks all of them (~0.3–0.6 s for such a parse), and the older generations'
collections walk them again later. Frozen objects are still freed by reference counting as
before; only a reference cycle already garbage at that moment would never be collected, and
nothing a history read builds is a cycle."""

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (explicit `gc.collect()` still runs)."""
    resume = hold_collector()
    try:
        yield
    finally:
        resume()


def hold_collector() -> Callable[[], None]:
    """`gc_paused` across threads: the collector is held off until the returned function is
    called (by any thread; a second call does nothing). For a pause that ends elsewhere than
    it began: objects built under a pause and freed later, on another thread, without a
    collection walking them in between (each would walk every one of them)."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    done = False

    def resume() -> None:
        global _holders
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            _holders -= 1
            if _holders == 0 and _was_enabled:
                if gc.get_count()[0] > FREEZE_AFTER:
                    gc.freeze()
                gc.enable()

    return resume
