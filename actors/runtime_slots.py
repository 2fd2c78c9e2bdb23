"""`RuntimeSlots`: at most N live provider runtimes per provider.

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

Forks get their own share of the slots (`fork_limit`, a quarter fewer than `limit`): a fork
can sit in a slow provider call for minutes, and when forks could hold every slot, each cold
one evicted an idle warm runtime and that Session's next Turn queued behind all of them. A
fork that needs a new slot while the forks' share is full waits, without holding back the
Turns queued after it; a fork on a runtime already in its slot takes nothing new.

Thread-safe; callbacks run outside the lock.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MAX_RUNTIMES = 64
DEFAULT_MAX_STARTS = 4

Granted = Callable[[], None]
StopRuntime = Callable[[str, str], "Future[Any]"]
"""`stop(provider, key)`: ask the worker to stop that Session's runtime."""


def fork_share(limit: int) -> int:
    """How many of `limit` slots forks may hold: all but a quarter (at least one slot stays
    out of their reach once there are two)."""
    return max(1, limit - max(1, limit // 4))


@dataclass(slots=True)
class _Waiter:
    key: str
    granted: Granted
    fork: bool
    """Waiting for a slot for a fork only (a Turn of the same Session waiting too clears it)."""


class RuntimeSlots:
    def __init__(
        self,
        limit: int = DEFAULT_MAX_RUNTIMES,
        stop: StopRuntime | None = None,
        start_limit: int = DEFAULT_MAX_STARTS,
    ) -> None:
        self.limit = max(1, int(limit))
        self.fork_limit = fork_share(self.limit)
        self.start_limit = max(1, int(start_limit))
        self._stop = stop
        self._lock = threading.Lock()
        # provider -> key -> busy; insertion order is least-recently-used first.
        self._live: dict[str, OrderedDict[str, bool]] = {}
        # provider -> keys granted cold whose runtime start has not ended yet.
        self._starting: dict[str, set[str]] = {}
        # provider -> keys whose slot a fork holds (busy until `release`).
        self._forking: dict[str, set[str]] = {}
        self._waiters: dict[str, deque[_Waiter]] = {}
        self.evictions = 0
        self.queued_total = 0

    def set_stopper(self, stop: StopRuntime) -> None:
        self._stop = stop

    def acquire(self, provider: str, key: str, granted: Granted, *, fork: bool = False) -> None:
        """Call `granted()` once `key` holds one of `provider`'s slots (now or later); a
        `fork` takes a new slot only within the forks' share (`fork_limit`)."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            if key in live:
                live[key] = True
                live.move_to_end(key)
                if fork:
                    self._forking.setdefault(provider, set()).add(key)
                handoffs: list[tuple[str | None, Granted]] = [(None, granted)]
            else:
                waiters = self._waiters.setdefault(provider, deque())
                entry = next((w for w in waiters if w.key == key), None)
                if entry is not None:
                    # Already waiting (a fork and a turn of one Session): chain the
                    # callbacks; a Turn among them waits as a Turn, not in the forks' share.
                    entry.granted = _both(entry.granted, granted)
                    entry.fork = entry.fork and fork
                    handoffs = self._handoffs(provider, live)
                else:
                    entry = _Waiter(key, granted, fork)
                    waiters.append(entry)  # FIFO: nobody overtakes a waiter it may not skip
                    handoffs = self._handoffs(provider, live)
                    if any(w is entry for w in waiters):
                        self.queued_total += 1
        for victim, then in handoffs:
            self._grant_after_stop(provider, victim, then)

    def hold_warm(self, provider: str, key: str, *, fork: bool = False) -> bool:
        """Mark `key`'s slot busy if its runtime still holds one (it was neither evicted nor
        lost with its worker), and say so; never waits, never evicts (for a fork that
        reuses a warm runtime without `session.start`). False: acquire as usual."""
        with self._lock:
            live = self._live.get(provider)
            if live is None or key not in live or key in self._starting.get(provider, ()):
                return False
            live[key] = True
            live.move_to_end(key)
            if fork:
                self._forking.setdefault(provider, set()).add(key)
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
            self._forking.get(provider, set()).discard(key)
            waiters = self._waiters.get(provider)
            if waiters:
                # A Session released while queued (its Turn was interrupted) waits no more.
                for entry in [w for w in waiters if w.key == key]:
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
            self._forking.get(provider, set()).discard(key)
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def reset(self, provider: str) -> None:
        """The provider's worker died, and every runtime with it: idle slots are free."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            for key in [k for k, busy in live.items() if not busy]:
                del live[key]
                self._forking.get(provider, set()).discard(key)
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
                    "queuedForks": sum(1 for w in self._waiters.get(provider) or () if w.fork),
                    "forks": len(self._forking.get(provider) or ()),
                    "limit": self.limit,
                    "forkLimit": self.fork_limit,
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
        """Grant waiters in FIFO order while there is room and a start permit; a fork waiting
        for the forks' share is passed over (it keeps its place), anything else stops it."""
        out: list[tuple[str | None, Granted]] = []
        waiters = self._waiters.get(provider)
        if not waiters:
            return out
        starting = self._starting.setdefault(provider, set())
        forking = self._forking.setdefault(provider, set())
        kept: list[_Waiter] = []
        while waiters:
            waiter = waiters.popleft()
            key = waiter.key
            if key in live:
                # Became live while queued (granted through another path): warm, no permit.
                victim: str | bool | None = None
            elif waiter.fork and len(forking) >= self.fork_limit:
                kept.append(waiter)
                continue
            elif len(starting) >= self.start_limit:
                waiters.appendleft(waiter)
                break
            else:
                victim = self._make_room(provider, live)
                if victim is False:
                    waiters.appendleft(waiter)
                    break
                starting.add(key)
            live[key] = True
            if waiter.fork:
                forking.add(key)
            out.append((victim if isinstance(victim, str) else None, waiter.granted))
        waiters.extendleft(reversed(kept))
        return out

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


def _both(first: Granted, then: Granted) -> Granted:
    def both() -> None:
        first()
        then()

    return both
