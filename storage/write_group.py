"""Group commit's bookkeeping for `storage.base`: the open group, the write counters tests pin,
and the optional per-write timings. No SQL here; `Database.write` drives them."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.models import ChangeEvent

GROUP_MAX_MEMBERS = 32
"""Writes one group commit holds at most: a bound on how long its first member waits."""
GROUP_MAX_AGE_S = 0.020
"""A group open longer than this commits at its next member's end instead of taking more (a
long body, e.g. a 1,000-Turn fork commit, does not hold the writes before it much longer)."""
CHECKPOINT_PAGES = 1000
"""WAL pages after which the background checkpointer copies the WAL into the database (the
size SQLite's own auto-checkpoint uses; it would run inside the COMMIT that crossed it)."""
CHECKPOINT_RETRY_PAGES = 250
"""WAL pages the log grows by, past the mark, before the checkpointer is asked again: a
checkpoint that readers kept from finishing leaves the WAL long (it restarts only once every
frame is copied), and asking at every COMMIT past the mark, as SQLite's auto-checkpoint does,
ran a PASSIVE checkpoint — a few frames copied, the database fsync'd — for nearly every
COMMIT under a steady load of writers and readers."""
TIMING_ENV = "AGENTHOST_STORE_TIMING"
"""When set to a file path, each write's wait / body / COMMIT / publish times are kept and a
summary per store method is written there as JSON at `close()` (docs/performance.md)."""


class WriteGroup:
    """One shared write transaction: its members' savepoints, committed by one COMMIT."""

    __slots__ = ("members", "opened", "done", "error", "lazy", "held", "released")

    def __init__(self, lazy: bool = False) -> None:
        self.members = 0
        self.lazy = lazy
        """Opened by a `durable=False` write: committed alone, without an fsync."""
        self.held: list[ChangeEvent] = []
        """A lazy group's events: published only after a later fsync'd COMMIT."""
        self.released: list[ChangeEvent] | None = None
        """Earlier lazy groups' events this group's fsync made durable (one member takes them)."""
        self.opened = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None


class WriteStats:
    """Counts of the store's writes (what tests pin): `transactions` written (savepoints
    released), `commits` (each one fsync'd `COMMIT`), `lazy_commits` (a `durable=False`
    write's COMMIT without an fsync of its own), `rolled_back` member
    savepoints, `group_failures` (a COMMIT or a transaction-aborting error that failed every
    member), `checkpoint_signals` (times the WAL hook asked the checkpointer to run) and
    `batched` writes (nested savepoints of a `write_batch`, inside one member)."""

    __slots__ = (
        "transactions",
        "commits",
        "lazy_commits",
        "rolled_back",
        "group_failures",
        "largest_group",
        "checkpoints",
        "checkpoint_signals",
        "batched",
    )

    def __init__(self) -> None:
        self.transactions = 0
        self.commits = 0
        self.lazy_commits = 0
        self.rolled_back = 0
        self.group_failures = 0
        self.largest_group = 0
        self.checkpoints = 0
        self.checkpoint_signals = 0
        self.batched = 0

    def snapshot(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in self.__slots__}


class WriteTimings:
    """Per-write durations by store method (only with `AGENTHOST_STORE_TIMING`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._rows: dict[str, list[tuple[float, float, float, float, int]]] = {}

    def add(self, method: str, row: tuple[float, float, float, float, int]) -> None:
        with self._lock:
            rows = self._rows.setdefault(method, [])
            if len(rows) < 100_000:
                rows.append(row)

    def write(self) -> None:
        def pct(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

        out: dict[str, Any] = {}
        with self._lock:
            for method, rows in self._rows.items():
                cols = list(zip(*rows, strict=True))
                out[method] = {"n": len(rows), "meanGroup": round(sum(cols[4]) / len(rows), 2)}
                for i, name in enumerate(("waitMs", "bodyMs", "commitMs", "publishMs")):
                    out[method][name] = {
                        "p50": pct(list(cols[i]), 0.5),
                        "p99": pct(list(cols[i]), 0.99),
                        "mean": round(sum(cols[i]) / len(rows), 2),
                    }
        with contextlib.suppress(OSError):
            Path(self.path).write_text(json.dumps(out, indent=1, sort_keys=True))


def caller_name() -> str:
    """The store method that wrote (the first frame outside storage.base and contextlib)."""
    frame = sys._getframe(1)
    skip = (__file__, _BASE_FILE, contextlib.__file__)
    while frame is not None and frame.f_code.co_filename in skip:
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_name if frame is not None else "?"


_BASE_FILE = str(Path(__file__).with_name("base.py"))
