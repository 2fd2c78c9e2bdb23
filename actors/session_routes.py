"""The live Session actors by Session, shared by the `HostActor` (which starts, reaps and
replaces them) and the threads that route to them — the transport thread's Session requests
and the worker supervisor's driver events — so a message for a live actor goes straight into
its inbox, without a hop through the HostActor's thread.

Order per Session is kept: once a message of a Session went to the HostActor (no live actor,
or one it must start), later ones follow it there until the HostActor has delivered it, so a
direct message never overtakes an earlier one. A reap removes the actor and queues its stop
under the same lock a direct message is delivered under, so none lands behind the stop.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

Key = tuple[str, str]
"""(workspace id, session id)."""


@dataclass
class RouteEntry:
    """One live Session actor; `last_used` and `busy` decide its reap."""

    ref: pykka.ActorRef[Any]
    last_used: float
    busy: bool = False


class SessionRoutes:
    """See the module docstring. Every method may be called from any thread; the entries are
    changed only by the HostActor (`start_or_tell`, `reap`, `take_all`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, RouteEntry] = {}
        # Messages of each Session handed to the HostActor and not yet delivered by it.
        self._via_host: Counter[Key] = Counter()
        self.direct = 0
        """Messages delivered straight to a live actor (tests pin the direct path on it)."""

    def tell(self, ws: str, sid: str, message: Any) -> bool:
        """Put `message` into the Session's live actor's inbox and say True; False when the
        HostActor must deliver it (no live actor, or an earlier message of this Session is
        still on its way there): the caller then sends it to the HostActor, which must call
        `start_or_tell(..., via_host=True)` for it."""
        key = (ws, sid)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and not self._via_host[key] and entry.ref.is_alive():
                entry.last_used = time.monotonic()
                try:
                    entry.ref.tell(message)
                except pykka.ActorDeadError:
                    pass
                else:
                    self.direct += 1
                    return True
            self._via_host[key] += 1
            return False

    def start_or_tell(
        self,
        ws: str,
        sid: str,
        message: Any,
        start: Callable[[], pykka.ActorRef[Any]],
        *,
        via_host: bool,
    ) -> None:
        """The HostActor's delivery: to the live actor, else to one `start()` makes now.
        `via_host`: `message` is one a `tell` handed to the HostActor."""
        key = (ws, sid)
        with self._lock:
            try:
                entry = self._entries.get(key)
                if entry is None or not entry.ref.is_alive():
                    entry = self._entries[key] = RouteEntry(start(), time.monotonic())
                entry.last_used = time.monotonic()
                try:
                    entry.ref.tell(message)
                except pykka.ActorDeadError:
                    entry = self._entries[key] = RouteEntry(start(), time.monotonic())
                    entry.ref.tell(message)
            finally:
                if via_host:
                    left = self._via_host[key] - 1
                    if left > 0:
                        self._via_host[key] = left
                    else:
                        del self._via_host[key]

    def set_busy(self, ws: str, sid: str, busy: bool) -> None:
        with self._lock:
            entry = self._entries.get((ws, sid))
            if entry is not None:
                entry.busy = busy
                entry.last_used = time.monotonic()

    def refs(self) -> list[pykka.ActorRef[Any]]:
        with self._lock:
            return [entry.ref for entry in self._entries.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def reap(self, idle_after_s: float) -> list[tuple[Key, pykka.Future[Any]]]:
        """Stop every actor neither busy nor used for `idle_after_s`; each one's stop is queued
        before the lock is released, so no direct message lands behind it."""
        now = time.monotonic()
        stopped: list[tuple[Key, pykka.Future[Any]]] = []
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.busy or now - entry.last_used < idle_after_s:
                    continue
                del self._entries[key]
                stopped.append((key, entry.ref.stop(block=False)))
        return stopped

    def take_all(self) -> list[pykka.ActorRef[Any]]:
        """Forget every actor (the HostActor is stopping) and return them."""
        with self._lock:
            refs = [entry.ref for entry in self._entries.values()]
            self._entries.clear()
        return refs
