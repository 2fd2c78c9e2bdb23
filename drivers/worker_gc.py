"""The worker's cyclic garbage collector: what the worker's start loaded is frozen out of every
later collection.

The driver's preload (`WorkerServer.preload`: the driver, and what its first Turn and fork
import — for Claude Code the SDK, ~70,000 objects of its ~97,000) lives as long as the process.
Unfrozen, each full collection walks all of it again: 20–40 ms in the Claude worker, on
whichever thread allocated last — the driver's loop thread while it relays a Turn's deltas
(docs/performance.md, "Claude Code's longest delta wait"). Frozen objects are never collected
(nothing the start loaded is garbage) and are still freed at exit; the daemon does the same
with its own start (`agenthost.gc_policy`)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections.abc import Callable
from pathlib import Path

GC_REPORT_ENV = "AGENTHOST_WORKER_GC_REPORT"
"""When set to a directory, the worker writes `<pid>.json` there once its start is frozen:
the frozen and the still-tracked object counts (tests and measurements)."""


def preload_then_freeze(preload: Callable[[], None]) -> None:
    """Run the worker's `preload`, then move every object alive into the permanent
    generation (`gc.freeze`). No collection first, as the daemon: the freeze costs nothing on
    the way to ready, and the little garbage the imports left stays, once."""
    preload()
    gc.freeze()
    folder = os.environ.get(GC_REPORT_ENV)
    if folder:
        report = {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}
        path = Path(folder, f"{os.getpid()}.json")
        with contextlib.suppress(OSError):
            path.with_suffix(".tmp").write_text(json.dumps(report))
            os.replace(path.with_suffix(".tmp"), path)  # whole, for a reader waiting on it
