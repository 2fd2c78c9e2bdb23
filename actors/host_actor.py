"""The HostActor: routes each Session-scoped message to that Session's actor, starting actors
on demand and stopping them when idle (10,000 stored Sessions must not mean 10,000 threads).

It also receives the workers' streamed turn events and forwards them to the owning actor. The
live actors are kept in `SessionRoutes`, which the HostActor (which starts, reaps and
replaces them) shares with the threads that route to them — the transport thread's Session
requests and the worker supervisor's driver events: a message for a live actor goes straight
into its inbox, without a hop through the HostActor's thread; only the rest comes through here.

Order per Session is kept: once a message of a Session went to the HostActor (no live actor,
or one it must start), later ones follow it there until the HostActor has delivered it, so a
direct message never overtakes an earlier one. A reap removes the actor and queues its stop
under the same lock a direct message is delivered under, so none lands behind the stop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pykka

from actors.context import HostContext, parse_runtime_key
from actors.messages import DriverEvent, ForkAdvance, ForkReply, Reply, RuntimeLost
from actors.pool import handling
from actors.session_actor import SessionActor
from actors.store_ports import HostActorStore
from domain.errors import HostError
from domain.turn_events import turn_event_from_wire
from domain.worker_messages import MalformedMessage
from storage.sqlite import host_error_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    workspace_id: str
    session_id: str
    message: Any
    counted: bool = False
    """Sent because `SessionRoutes.tell` said so (it counts it until delivered)."""


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    key: str
    event: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GetFork:
    workspace_id: str
    operation_id: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class Reap:
    pass


@dataclass(frozen=True, slots=True)
class CountActors:
    reply: Reply


class HostActor(pykka.ThreadingActor):
    def __init__(
        self,
        ctx: HostContext,
        *,
        idle_after_s: float = 30.0,
        routes: SessionRoutes | None = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        # Routing reads one fork operation, never writes (actors/store_ports.py).
        self.store: HostActorStore = ctx.store
        self.idle_after_s = idle_after_s
        self.routes = routes if routes is not None else SessionRoutes()
        self._stopping: dict[tuple[str, str], pykka.Future[Any]] = {}
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()

    def on_start(self) -> None:
        me = self.actor_ref

        # A Session actor's busy flag is set from its own thread, straight in the routes table
        # (which locks): it decides only this actor's reap, which reads it under that lock,
        # and a message to this actor per change woke its thread twice a fork or a Turn.
        self.ctx.on_busy_change = self.routes.set_busy
        period = max(0.05, min(5.0, self.idle_after_s / 2))

        def _reap_loop() -> None:
            while not self._closed.wait(period):
                try:
                    me.tell(Reap())
                except pykka.ActorDeadError:
                    return

        self._reaper = threading.Thread(target=_reap_loop, name="agenthost-reaper", daemon=True)
        self._reaper.start()

    def on_stop(self) -> None:
        self._closed.set()
        refs = self.routes.take_all()
        for ref in refs:
            ref.stop(block=False)
        for ref in refs:
            with contextlib.suppress(Exception):  # best effort at shutdown
                ref.stop(block=True, timeout=10)

    def on_receive(self, message: Any) -> Any:
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001
            what = f"host actor on {type(message).__name__}"
            if isinstance(exc, HostError) and exc.status < 500:
                log.debug("%s: refused: %s", what, exc)
            elif isinstance(exc, HostError):
                log.exception("%s failed", what)
            # An untyped failure is logged once, with a reference id, by the one builder.
            typed = host_error_of(exc, what, logger=log)
            reply = getattr(message, "reply", None) or getattr(
                getattr(message, "message", None), "reply", None
            )
            if reply is not None:
                reply(typed)
        return None

    def _dispatch(self, message: Any) -> None:
        match message:
            case Route(workspace_id=ws, session_id=sid, message=inner):
                self._route(ws, sid, inner, via_host=message.counted)
            case WorkerEvent(key=key, event=event):
                ws, sid = parse_runtime_key(key)
                typed = driver_event(key, event)
                if typed is not None:
                    self._route(ws, sid, typed)
            case GetFork():
                self._get_fork(message)
            case RuntimeLost():
                for ref in self.routes.refs():
                    with contextlib.suppress(pykka.ActorDeadError):
                        ref.tell(message)
            case Reap():
                self._reap()
            case CountActors(reply=reply):
                reply(len(self.routes))

    def _route(self, ws: str, sid: str, inner: Any, *, via_host: bool = False) -> None:
        """Deliver `inner` to the Session's actor, starting one if none is live. `via_host`:
        a message `SessionRoutes.tell` handed here (`Route.counted`)."""
        key = (ws, sid)
        first = [True]

        def start() -> pykka.ActorRef[Any]:
            # The first start waits for a reaped predecessor; a replacement of an actor that
            # died while this message was delivered does not.
            predecessor = self._stopping.pop(key, None) if first[0] else None
            first[0] = False
            return SessionActor.start(self.ctx, ws, sid, predecessor)

        self.routes.start_or_tell(ws, sid, inner, start, via_host=via_host)

    def _get_fork(self, msg: GetFork) -> None:
        op = self.store.fork_queries.get_fork_operation(msg.workspace_id, msg.operation_id)
        if op.is_active:
            self._route(
                msg.workspace_id, op.source_session_id, ForkAdvance(op.operation_id, msg.reply)
            )
        else:
            msg.reply(ForkReply(op, True))

    def _reap(self) -> None:
        for key, stopped in self.routes.reap(self.idle_after_s):
            # The successor waits for this future, keeping the Session's writes serialised.
            self._stopping[key] = stopped
        for key, fut in list(self._stopping.items()):
            try:
                fut.get(timeout=0)
                del self._stopping[key]
            except pykka.Timeout:
                pass
            except Exception:  # noqa: BLE001
                del self._stopping[key]


def driver_event(key: str, event: Mapping[str, Any]) -> DriverEvent | None:
    """A worker's turn event as the actor's typed message (parsed once, at the link's host
    end); None, logged, for one that cannot be read."""
    try:
        return DriverEvent(turn_event_from_wire(event))
    except MalformedMessage as exc:
        log.warning("session %s: unreadable driver event: %s", key, exc)
        return None


def route(
    routes: SessionRoutes, host: pykka.ActorRef[HostActor], ws: str, sid: str, message: Any
) -> None:
    """Deliver a Session's message: straight to its live actor, else through the HostActor
    (which starts one). Raises `pykka.ActorDeadError` once the HostActor is stopped."""
    if not routes.tell(ws, sid, message):
        host.tell(Route(ws, sid, message, counted=True))


# -- the live Session actors, shared with the threads that route to them -------------------

Key = tuple[str, str]
"""(workspace id, session id)."""


@dataclass
class RouteEntry:
    """One live Session actor; `last_used` and `busy` decide its reap."""

    ref: pykka.ActorRef[Any]
    last_used: float
    busy: bool = False


class SessionRoutes:
    """The live Session actors by Session (see the module docstring). Every method may be
    called from any thread; the entries are changed only by the HostActor (`start_or_tell`,
    `reap`, `take_all`)."""

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
        """Stop every actor neither busy nor used for `idle_after_s`, nor handling a message
        (`handling`: one told longer ago than that may still be queued or in hand — a submit
        whose claim waits on the store — and would run ahead of the stop: its Turn started by
        an actor that stops at once, nothing left to follow it); each one's stop is queued
        before the lock is released, so no direct message lands behind it."""
        now = time.monotonic()
        stopped: list[tuple[Key, pykka.Future[Any]]] = []
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.busy or now - entry.last_used < idle_after_s or handling(entry.ref):
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
