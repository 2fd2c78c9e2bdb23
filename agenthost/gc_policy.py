"""The daemon's cyclic garbage collector: what start-up left is frozen out of every later
collection, and, behind `AGENTHOST_GC_TIMING`, each collection's pause is recorded.

Everything the daemon built to start (modules, the catalog, the pools, the store's caches)
lives as long as the process; without the freeze each full collection walks all of it again,
on whichever thread allocated last — a request's, while it holds the GIL. Frozen objects are
never collected (nothing of start-up is garbage) and are still freed at exit."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

GC_TIMING_ENV = "AGENTHOST_GC_TIMING"
"""When set to a file path, every collection's generation and pause are kept and a summary is
written there as JSON when the daemon closes (docs/performance.md)."""


def freeze_start_up() -> None:
    """Move every object start-up left into the permanent generation (`gc.freeze`): later
    collections skip it. No collection first: the freeze costs nothing on the way to ready
    (the little garbage start-up left in the young generations stays, once)."""
    gc.freeze()


class GcTimings:
    """Each collection's pause by generation (only with `AGENTHOST_GC_TIMING`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}

    @classmethod
    def from_env(cls) -> GcTimings | None:
        path = os.environ.get(GC_TIMING_ENV)
        if not path:
            return None
        timings = cls(path)
        gc.callbacks.append(timings._on_gc)
        return timings

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.perf_counter()
            return
        began = self._started.pop(me, None)
        if began is None:
            return
        ms = (time.perf_counter() - began) * 1000
        with self._lock:
            pauses = self._pauses.setdefault(int(info.get("generation", 0)), [])
            if len(pauses) < 100_000:
                pauses.append(ms)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        out: dict[str, Any] = {}
        with self._lock:
            for generation, pauses in sorted(self._pauses.items()):
                ordered = sorted(pauses)
                n = len(ordered)
                out[f"gen{generation}"] = {
                    "n": n,
                    "totalMs": round(sum(ordered), 2),
                    "p50": round(ordered[n // 2], 3) if n else 0.0,
                    "p99": round(ordered[min(n - 1, int(0.99 * n))], 3) if n else 0.0,
                    "max": round(ordered[-1], 3) if n else 0.0,
                }
        out["frozen"] = gc.get_freeze_count()
        with contextlib.suppress(OSError):
            Path(self.path).write_text(json.dumps(out, indent=1, sort_keys=True))
