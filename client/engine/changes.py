"""The Engine's one lock and its change feed: the changes its parts publish while they hold the
lock, handed to listeners (and `wait_for` callers) outside it, in order, by `flush`.

Every part of the Engine shares this one object, so one lock orders every record, cache and
timer change, and a view never runs while the Engine's lock is held.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from client.engine.values import EngineChange, Listener

log = logging.getLogger("client.engine")


class ChangeFeed:
    """The lock, the closed flag, the outbox of changes and the listeners of one Engine."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self._outbox: list[EngineChange] = []
        self._listeners: list[Listener] = []
        self.closed = False

    def publish(self, change: EngineChange) -> None:
        """Queue a change for the next `flush`; the caller holds `lock`."""
        self._outbox.append(change)

    def close(self) -> bool:
        """Mark the Engine closed and wake every waiter; false if it already was. The caller
        holds `lock` (and stops its timers under it)."""
        if self.closed:
            return False
        self.closed = True
        self._cond.notify_all()
        return True

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self.lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self.lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Block until `predicate()` is truthy (re-checked on every flush)."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def flush(self) -> None:
        """Notify listeners outside the lock, in order, and wake `wait_for` callers."""
        with self.lock:
            changes, self._outbox = self._outbox, []
            listeners = list(self._listeners)
            self._cond.notify_all()
        for change in changes:
            for listener in listeners:
                try:
                    listener(change)
                except Exception:  # noqa: BLE001 - a view's bug must not break the Engine
                    log.exception("engine listener failed")
