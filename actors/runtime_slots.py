"""`RuntimeSlots`: at most N live provider runtimes per provider (issue 14 §6).

200 Sessions each starting a turn at once meant 200 app-servers starting at once in one
worker: the machine thrashed, heartbeats went silent and the worker was killed over and over.
A Session takes its provider's slot before its runtime is prepared and holds it while it has
a turn or fork in progress; then the slot stays *idle* (the runtime stays warm) until another
Session needs it, which stops the least-recently-used idle runtime first. When every slot
holds a busy runtime, the next Session waits in FIFO order (its Turn is accepted and stays
`active` meanwhile; it is not refused). The choice — queue, not 503 — is documented in
docs/user-guide.md ("Many Sessions at once").

Starting a runtime (spawning an app-server) is the expensive step: 64 of them started at once
on 2 cores all finished late together, past the provider's start timeouts, and failed their
turns. A Session whose runtime is not live (a *cold* grant) therefore also needs one of
`start_limit` start permits, held until `started()`; the waiting is done here, in the FIFO
queue, where no clock runs against the Turn — only the start itself is timed.

Thread-safe; callbacks run outside the lock.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MAX_RUNTIMES = 64
DEFAULT_MAX_STARTS = 4

Granted = Callable[[], None]
StopRuntime = Callable[[str, str], "Future[Any]"]
"""`stop(provider, key)`: ask the worker to stop that Session's runtime."""


class RuntimeSlots:
    def __init__(
        self,
        limit: int = DEFAULT_MAX_RUNTIMES,
        stop: StopRuntime | None = None,
        start_limit: int = DEFAULT_MAX_STARTS,
    ) -> None:
        self.limit = max(1, int(limit))
        self.start_limit = max(1, int(start_limit))
        self._stop = stop
        self._lock = threading.Lock()
        # provider -> key -> busy; insertion order is least-recently-used first.
        self._live: dict[str, OrderedDict[str, bool]] = {}
        # provider -> keys granted cold whose runtime start has not ended yet.
        self._starting: dict[str, set[str]] = {}
        self._waiters: dict[str, deque[tuple[str, Granted]]] = {}
        self.evictions = 0
        self.queued_total = 0

    def set_stopper(self, stop: StopRuntime) -> None:
        self._stop = stop

    def acquire(self, provider: str, key: str, granted: Granted) -> None:
        """Call `granted()` once `key` holds one of `provider`'s slots (now or later)."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            if key in live:
                live[key] = True
                live.move_to_end(key)
                victim = None
            else:
                waiters = self._waiters.setdefault(provider, deque())
                if any(k == key for k, _ in waiters):
                    # Already waiting (a fork and a turn of one Session): chain the callbacks.
                    self._chain(waiters, key, granted)
                    return
                starting = self._starting.setdefault(provider, set())
                victim = (
                    self._make_room(provider, live)
                    if not waiters and len(starting) < self.start_limit
                    else False  # FIFO: nobody overtakes a waiter
                )
                if victim is False:
                    waiters.append((key, granted))
                    self.queued_total += 1
                    return
                live[key] = True
                starting.add(key)
        self._grant_after_stop(provider, victim if isinstance(victim, str) else None, granted)

    def hold_warm(self, provider: str, key: str) -> bool:
        """Mark `key`'s slot busy if its runtime still holds one (it was neither evicted nor
        lost with its worker), and say so; never waits, never evicts (issue 20: a fork that
        reuses a warm runtime without `session.start`). False: acquire as usual."""
        with self._lock:
            live = self._live.get(provider)
            if live is None or key not in live or key in self._starting.get(provider, ()):
                return False
            live[key] = True
            live.move_to_end(key)
            return True

    def started(self, provider: str, key: str) -> None:
        """`key`'s runtime start has ended (ready or failed): its start permit goes to the
        next waiter."""
        with self._lock:
            starting = self._starting.get(provider)
            if starting is None or key not in starting:
                return
            starting.discard(key)
            handoffs = self._handoffs(provider, self._live.setdefault(provider, OrderedDict()))
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def release(self, provider: str, key: str) -> None:
        """`key` has nothing in progress: its runtime stays warm but may be evicted."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            if key in live:
                live[key] = False
                live.move_to_end(key)
            self._starting.get(provider, set()).discard(key)
            waiters = self._waiters.get(provider)
            if waiters:
                # A Session released while queued (its Turn was interrupted) waits no more.
                for entry in [w for w in waiters if w[0] == key]:
                    waiters.remove(entry)
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def forget(self, provider: str, key: str) -> None:
        """`key`'s runtime is gone (Session deleted): free its slot at once."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            live.pop(key, None)
            self._starting.get(provider, set()).discard(key)
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def reset(self, provider: str) -> None:
        """The provider's worker died, and every runtime with it: idle slots are free."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            for key in [k for k, busy in live.items() if not busy]:
                del live[key]
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def status(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {
                provider: {
                    "live": len(live),
                    "busy": sum(1 for b in live.values() if b),
                    "queued": len(self._waiters.get(provider) or ()),
                    "limit": self.limit,
                    "starting": len(self._starting.get(provider) or ()),
                    "startLimit": self.start_limit,
                }
                for provider, live in self._live.items()
            }

    # -- under the lock ---------------------------------------------------------------------

    def _make_room(self, provider: str, live: OrderedDict[str, bool]) -> str | bool | None:
        """None: a free slot; a key: evict that idle runtime; False: every slot is busy."""
        if len(live) < self.limit:
            return None
        for key, busy in live.items():
            if not busy:
                del live[key]
                self.evictions += 1
                return key
        return False

    def _handoffs(
        self, provider: str, live: OrderedDict[str, bool]
    ) -> list[tuple[str | None, Granted]]:
        out: list[tuple[str | None, Granted]] = []
        waiters = self._waiters.get(provider)
        starting = self._starting.setdefault(provider, set())
        while waiters:
            key = waiters[0][0]
            if key in live:
                # Became live while queued (granted through another path): warm, no permit.
                victim: str | bool | None = None
            elif len(starting) >= self.start_limit:
                break
            else:
                victim = self._make_room(provider, live)
                if victim is False:
                    break
                starting.add(key)
            key, granted = waiters.popleft()
            live[key] = True
            out.append((victim if isinstance(victim, str) else None, granted))
        return out

    @staticmethod
    def _chain(waiters: deque[tuple[str, Granted]], key: str, granted: Granted) -> None:
        for i, (k, first) in enumerate(waiters):
            if k == key:

                def both(first: Granted = first) -> None:
                    first()
                    granted()

                waiters[i] = (k, both)
                return

    # -- outside the lock -------------------------------------------------------------------

    def _grant_after_stop(self, provider: str, victim: str | None, granted: Granted) -> None:
        """Grant once the evicted runtime is stopped, so the worker never holds more than
        `limit` live runtimes of a provider."""
        if victim is None or self._stop is None:
            self._safe(granted)
            return
        try:
            fut = self._stop(provider, victim)
        except Exception:  # noqa: BLE001 - a stop that cannot be sent still frees the slot
            log.exception("stopping idle runtime %s failed", victim)
            self._safe(granted)
            return
        fut.add_done_callback(lambda _f: self._safe(granted))

    @staticmethod
    def _safe(granted: Granted) -> None:
        try:
            granted()
        except Exception:  # noqa: BLE001 - one Session's bug must not block the others
            log.exception("runtime slot callback failed")
