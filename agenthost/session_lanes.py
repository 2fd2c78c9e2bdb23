"""One Session's request order between its actor and the writes that skip it: a per-Session
lane (first in, first out) for the actor-free writes, and a count of its requests the actor
still owes an answer.

A write no actor needs to order (a rename: the fork fence never refuses it, no actor reads it
back) runs straight on the store from the writer threads, so it never waits in the Session
actor's inbox behind a Turn's writes. Requests of one Session still take effect in the order
they arrived: such a write goes through the actor as before while an earlier request of the
Session is still with the actor; a request for the actor that arrives while earlier writes
wait in the lane is routed once they are done; and the lane runs its writes one after
another."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

log = logging.getLogger(__name__)

Key = tuple[str, str]


class SessionLanes:
    """The lanes and the in-flight counts of every Session (any thread)."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._lock = threading.Lock()
        self._lanes: dict[Key, deque[Callable[[], None]]] = {}
        self._routed: dict[Key, int] = {}
        self.direct_writes = 0
        """Writes run through a lane, not the actor (tests pin the path)."""

    def write_or_route(self, key: Key, write: Callable[[], None]) -> bool:
        """Queue `write` on the Session's lane and return True, or return False when an
        earlier request of the Session is still with its actor: the caller routes it there."""
        with self._lock:
            if self._routed.get(key, 0):
                return False
            lane = self._lanes.get(key)
            self.direct_writes += 1
            if lane is not None:
                lane.append(write)
                return True
            self._lanes[key] = deque((write,))
        try:
            self._executor.submit(self._drain, key)
        except RuntimeError:  # shut down: run it here, its answer says so if the store is gone
            self._drain(key)
        return True

    def begin_routed(self, key: Key) -> Callable[[], None]:
        """Count a request for the Session's actor as in flight, before it is routed; returns
        what to call once it is answered (any number of times: it counts once)."""
        with self._lock:
            self._routed[key] = self._routed.get(key, 0) + 1
        done = threading.Lock()

        def answered() -> None:
            if not done.acquire(blocking=False):
                return
            with self._lock:
                left = self._routed.get(key, 0) - 1
                if left > 0:
                    self._routed[key] = left
                else:
                    self._routed.pop(key, None)

        return answered

    def route(self, key: Key, now: Callable[[], None], later: Callable[[], None]) -> None:
        """Route a request for the actor: `now` on this thread, or `later` on the lane's
        thread once the writes waiting in the Session's lane are done."""
        with self._lock:
            lane = self._lanes.get(key)
            if lane is not None:
                lane.append(later)
        if lane is None:
            now()

    def _drain(self, key: Key) -> None:
        while True:
            with self._lock:
                lane = self._lanes[key]
                if not lane:
                    del self._lanes[key]
                    return
                step = lane.popleft()
            try:
                step()
            except Exception:  # noqa: BLE001 - each step answers its own request
                log.exception("session lane step failed")
