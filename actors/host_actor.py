"""The HostActor: routes each Session-scoped message to that Session's actor, starting actors
on demand and stopping them when idle (10,000 stored Sessions must not mean 10,000 threads).

It also receives the workers' streamed turn events and forwards them to the owning actor.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
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
from actors.store_ports import HostActorStore
from domain.worker_messages import MalformedMessage, turn_event_from_wire
from storage.errors import HostError
from storage.sqlite import host_error_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    workspace_id: str
    session_id: str
    message: Any


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
class BusyChange:
    workspace_id: str
    session_id: str
    busy: bool


@dataclass(frozen=True, slots=True)
class Reap:
    pass


@dataclass(frozen=True, slots=True)
class CountActors:
    reply: Reply


@dataclass
class _Entry:
    ref: pykka.ActorRef[SessionActor]
    last_used: float
    busy: bool = False


class HostActor(pykka.ThreadingActor):
    def __init__(self, ctx: HostContext, *, idle_after_s: float = 30.0) -> None:
        super().__init__()
        self.ctx = ctx
        # Routing reads one fork operation, never writes (actors/store_ports.py).
        self.store: HostActorStore = ctx.store
        self.idle_after_s = idle_after_s
        self._actors: dict[tuple[str, str], _Entry] = {}
        self._stopping: dict[tuple[str, str], pykka.Future[Any]] = {}
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()

    def on_start(self) -> None:
        me = self.actor_ref

        def _on_busy(ws: str, sid: str, busy: bool) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                me.tell(BusyChange(ws, sid, busy))

        self.ctx.on_busy_change = _on_busy
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
        for entry in self._actors.values():
            entry.ref.stop(block=False)
        for entry in list(self._actors.values()):
            with contextlib.suppress(Exception):  # best effort at shutdown
                entry.ref.stop(block=True, timeout=10)
        self._actors.clear()

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
                self._route(ws, sid, inner)
            case WorkerEvent(key=key, event=event):
                ws, sid = parse_runtime_key(key)
                try:
                    # from_wire at the link's host end: the actors see only typed events.
                    typed = turn_event_from_wire(event)
                except MalformedMessage as exc:
                    log.warning("session %s: unreadable driver event: %s", key, exc)
                    return
                self._route(ws, sid, DriverEvent(typed))
            case GetFork():
                self._get_fork(message)
            case BusyChange(workspace_id=ws, session_id=sid, busy=busy):
                entry = self._actors.get((ws, sid))
                if entry is not None:
                    entry.busy = busy
                    entry.last_used = time.monotonic()
            case RuntimeLost():
                for entry in self._actors.values():
                    with contextlib.suppress(pykka.ActorDeadError):
                        entry.ref.tell(message)
            case Reap():
                self._reap()
            case CountActors(reply=reply):
                reply(len(self._actors))

    def _route(self, ws: str, sid: str, inner: Any) -> None:
        key = (ws, sid)
        entry = self._actors.get(key)
        if entry is None or not entry.ref.is_alive():
            predecessor = self._stopping.pop(key, None)
            ref = SessionActor.start(self.ctx, ws, sid, predecessor)
            entry = _Entry(ref, time.monotonic())
            self._actors[key] = entry
        entry.last_used = time.monotonic()
        try:
            entry.ref.tell(inner)
        except pykka.ActorDeadError:
            ref = SessionActor.start(self.ctx, ws, sid, None)
            self._actors[key] = _Entry(ref, time.monotonic())
            ref.tell(inner)

    def _get_fork(self, msg: GetFork) -> None:
        op = self.store.get_fork_operation(msg.workspace_id, msg.operation_id)
        if op.is_active:
            self._route(
                msg.workspace_id, op.source_session_id, ForkAdvance(op.operation_id, msg.reply)
            )
        else:
            msg.reply(ForkReply(op, True))

    def _reap(self) -> None:
        now = time.monotonic()
        for key, entry in list(self._actors.items()):
            if entry.busy or now - entry.last_used < self.idle_after_s:
                continue
            del self._actors[key]
            # The successor waits for this future, keeping the Session's writes serialised.
            self._stopping[key] = entry.ref.stop(block=False)
        for key, fut in list(self._stopping.items()):
            try:
                fut.get(timeout=0)
                del self._stopping[key]
            except pykka.Timeout:
                pass
            except Exception:  # noqa: BLE001
                del self._stopping[key]
