"""The HostActor: routes each Session-scoped message to that Session's actor, starting actors
on demand and stopping them when idle (10,000 stored Sessions must not mean 10,000 threads).

It also receives the workers' streamed turn events and forwards them to the owning actor. The
live actors are kept in `SessionRoutes`, which the transport and worker threads share: a
message for a live actor goes straight to it; only the rest comes through here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pykka

from actors.context import HostContext
from actors.messages import (
    DriverEvent,
    ForkAdvance,
    ForkReply,
    Reply,
    RuntimeLost,
    parse_runtime_key,
)
from actors.session_actor import SessionActor
from actors.session_routes import SessionRoutes
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
