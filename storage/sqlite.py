"""One SQLite connection as the store opens it (WAL, `synchronous=FULL`, foreign keys, a
busy handler that counts its sleeps), the canonical JSON of its columns, and a raw SQLite
failure turned into its typed error (503 `store_busy` for the transient ones)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import apsw

from domain.errors import HostError, StoreBusy, internal_error

BUSY_TIMEOUT_MS = 10_000

Row = tuple[Any, ...]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 kept (hash input for snapshots)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# The transient store failures: the write lock held elsewhere past the busy timeout, a full
# disk, an I/O error, a file SQLite could not open (a statement's temp file or journal refused
# at the descriptor limit). Nothing was written; the caller may retry (503 `store_busy`).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    apsw.BusyError,
    apsw.LockedError,
    apsw.FullError,
    apsw.IOError,
    apsw.CantOpenError,
)


def typed_store_error(exc: BaseException) -> HostError | None:
    """The typed error for a store failure that escaped as a raw apsw exception, or None."""
    if isinstance(exc, StoreBusy):
        return exc
    if isinstance(exc, TRANSIENT_ERRORS):
        return StoreBusy(f"the store is busy or full, try again ({type(exc).__name__})")
    return None


def host_error_of(
    failure: object, what: str = "", *, logger: logging.Logger | None = None
) -> HostError:
    """The typed error for any failure on the daemon side: a `HostError` as it is, a raw store
    contention or full-disk error as the retryable 503 `store_busy`, anything else the one
    500 of `domain.errors.internal_error` (logged with a reference id, its text never sent)."""
    if isinstance(failure, HostError):
        return failure
    if isinstance(failure, BaseException):
        typed = typed_store_error(failure)
        if typed is not None:
            return typed
    return internal_error(failure, what, logger=logger)


# SQLite's own busy-wait schedule (sqlite3_busy_timeout), in ms: the sleeps between retries.
_BUSY_DELAYS_MS = (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100)


class BusyWaits:
    """A busy handler with SQLite's schedule that also counts its sleeps.

    Inside one store every writer first takes the store's writer lock, so a sleep here means
    the lock is held by *another process* (a backup tool, a second reader gone wrong, a
    test's external writer) — what `host.status`-style tools and tests want to see.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._count = 0
        self._lock = threading.Lock()

    @property
    def sleeps(self) -> int:
        return self._count

    def __call__(self, prior_calls: int) -> bool:
        waited = sum(_BUSY_DELAYS_MS[:prior_calls]) + max(0, prior_calls - 12) * 100
        if waited >= self.timeout_ms:
            return False
        delay = _BUSY_DELAYS_MS[min(prior_calls, len(_BUSY_DELAYS_MS) - 1)]
        with self._lock:
            self._count += 1
        time.sleep(min(delay, self.timeout_ms - waited) / 1000)
        return True


def open_connection(
    path: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS, busy: BusyWaits | None = None
) -> apsw.Connection:
    conn = apsw.Connection(path)
    if busy is None:
        conn.set_busy_timeout(busy_timeout_ms)
    else:
        conn.set_busy_handler(busy)
    # WAL + synchronous=FULL: a COMMIT that returned survives power loss and SIGKILL.
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn
