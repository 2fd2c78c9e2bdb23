"""The cyclic garbage collector held off while the worker binds and proves a large rollout.

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
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (explicit `gc.collect()` still runs)."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
