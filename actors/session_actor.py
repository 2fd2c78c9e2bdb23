"""The SessionActor: one pykka actor per live Session, serialising that Session's mutations,
its turns' streamed events and its fork sagas.

It never blocks on a provider: driver calls return futures whose completions come back to the
actor as `FollowUp` messages, so a fenced write arriving mid-fork is rejected by the store
fence instead of queueing behind the saga.

This module is the actor itself: its lifecycle, the dispatch of its messages, its busy state,
and the `ForkHost` port a fork saga or `fork.resolve` runs through. Each other concern is a
module of its own, composed here (docs/design/internals.md, "The actors"):
`session_base` (state, thread hops), `session_runtime` (the provider runtime), `turn_writes`
(a Turn's durable writes), `session_turns` (running a Turn), `session_controls` (mutations,
interrupt, interaction answers), `provider_errors` (worker failures as typed errors).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pykka

from actors import fork_start
from actors.context import HostContext, LiveOperations, Timeouts
from actors.fork_host import LiveSaga, SagaStore
from actors.fork_host import PreparedRuntime as PreparedRuntime
from actors.fork_resolve import ForkResolve, ForkResolver
from actors.messages import (
    DriverEvent,
    FollowUp,
    ForkAdvance,
    ForkCreate,
    Interrupt,
    Mutate,
    Respond,
    RuntimeLost,
    Submit,
)
from actors.ports import Failpoints, ProviderCatalog, WorkerPort
from actors.session_base import RetryDurable
from actors.session_controls import SessionControls
from actors.store_ports import ResolveStore
from storage.errors import HostError
from storage.sqlite import host_error_of
from workspace.worktree import ForkTrees

log = logging.getLogger(__name__)

MAX_HELD_WRITES = 4
"""Durable writes a burst of driver events may hold back to land as one batch (a Turn's usual
burst: item, binding, message, settle)."""


class SessionActor(SessionControls):
    """One live Session (see the module docstring); `HostActor` starts and stops it."""

    def __init__(
        self,
        ctx: HostContext,
        workspace_id: str,
        session_id: str,
        predecessor: pykka.Future[Any] | None = None,
    ) -> None:
        super().__init__(ctx, workspace_id, session_id, predecessor)
        # Fork sagas and fork.resolve requests in flight (actors/fork_saga.py, fork_resolve.py);
        # both see this actor only through the `actors.fork_host.ForkHost` port.
        self.sagas: dict[str, LiveSaga] = {}
        self.resolves: dict[str, Any] = {}
        # The runtime this Session's last passed fork re-attestation proved.
        self.attested_runtime: tuple[str, ...] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def on_stop(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        for state in self._turns.values():
            if state.watchdog is not None:
                state.watchdog.cancel()
        # This thread ends now: its store connection (and file descriptors) must go with it.
        self.session_store.release_thread_connection()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        log.error("session actor %s crashed: %r", self.key, exception_value)

    def goes_ahead(self, message: Any) -> bool:
        """A client's plain mutation (title, pin, settings, goal; not a delete) is queued in
        front of the Turn's driver events and continuations waiting at the back of the inbox:
        its write is independent of theirs, and a rename sent while a Turn
        starts would otherwise wait for the Turn's start to be written first. It never goes
        in front of another request, so requests keep their order (`actors.pool`)."""
        return type(message) is Mutate and not message.stop_runtime

    def is_background(self, message: Any) -> bool:
        return type(message) in (DriverEvent, RetryDurable) or (
            type(message) is FollowUp and message.reply is None
        )

    def on_receive(self, message: Any) -> Any:
        # A Turn's driver events come in bursts (item, binding, completion): while the next
        # queued message is another driver event, or the provider's answer to the Turn's
        # `turn.start` (which only queues more of its writes; `FollowUp.turn_event`), this
        # one's durable writes wait for it, and the burst's writes land as one transaction
        # (one baton turn, one COMMIT). Any other message finds them durable — all but
        # a plain mutation that went ahead of the burst (`goes_ahead`), which does not read or
        # depend on a Turn's writes. At most MAX_HELD_WRITES wait: a provider that streams
        # faster than the store commits still has its Turn land (and its `turn.updated`
        # events go out) every few messages, and the queue stays bounded.
        following = self.next_message()
        self._hold_durable = len(self._durable) < MAX_HELD_WRITES and (
            isinstance(following, DriverEvent)
            or (isinstance(following, FollowUp) and following.turn_event)
        )
        if isinstance(message, RuntimeLost):
            self.forget_warm_runtime()
        self._expire_row_cache(message)
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - an actor must outlive any single message
            what = f"session actor {self.key} on {type(message).__name__}"
            if isinstance(exc, HostError) and exc.status < 500:
                # An ordinary refusal (busy, fenced, not found): the caller gets it typed.
                log.debug("%s: refused: %s", what, exc)
            elif isinstance(exc, HostError):
                log.exception("%s failed", what)
            # Every message that owes a reply gets one, typed; a FollowUp
            # carries the reply of the request it continues. An untyped failure is logged
            # once, with its reference id, by the one internal-error builder.
            typed = host_error_of(exc, what, logger=log)
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply(typed)
        finally:
            self._expire_row_cache(message)
            held, self._hold_durable = self._hold_durable, False
            if not held and self._durable and self._retry_timer is None:
                self._drain()  # what the events before this message held back
            self._update_busy()
        return None

    def _expire_row_cache(self, message: Any) -> None:
        """The Session row cache (`cached_session`) survives only messages that
        cannot write the row: a fork's start and its saga's steps while no Turn and no durable
        write is in flight (a fork's transitions and commit never write the source's row).
        Everything else — mutations, Turns and their events, retries, `fork.resolve`, a lost
        runtime — may, so it empties the cache before and after it runs; the actor's own
        runtime write (`update_runtime`) replaces it with the row it wrote."""
        if (
            not isinstance(message, (ForkCreate, ForkAdvance, FollowUp))
            or self._turns
            or self._durable
            or self._late_bindings
        ):
            self._session_row = None

    def _drain(self) -> None:
        # A Turn's durable writes may touch the row (its `updated_at`): never cached across.
        self._session_row = None
        super()._drain()

    def _dispatch(self, message: Any) -> None:
        match message:
            case FollowUp(fn=fn):
                fn()
            case RetryDurable():
                self._retry_timer = None
                self._drain()
            case Mutate():
                self._on_mutate(message)
            case Submit():
                self._on_submit(message)
            case Interrupt():
                self._on_interrupt(message)
            case Respond():
                self._on_respond(message)
            case DriverEvent(event=event):
                self._on_driver_event(event)
            case ForkCreate():
                fork_start.start(self, message)
            case ForkAdvance():
                fork_start.advance_leftover(self, message)
            case ForkResolve():
                ForkResolver.start(self, message)
            case RuntimeLost():
                self._on_runtime_lost(message)
            case _:
                log.warning("session actor %s: unknown message %r", self.key, message)

    def _update_busy(self) -> None:
        busy = (
            bool(self.sagas)
            or bool(self.resolves)
            or bool(self._durable)
            or bool(self._late_bindings)  # stay alive until they are applied
            or any(not t.settled for t in self._turns.values())
            # A runtime preparation (a slot wait, `session.start`) may outlast the idle reap;
            # a fork.create waiting on it is owed a reply by this actor.
            or self._preparing > 0
        )
        if not busy and self._preparing == 0 and self._slot_provider is not None:
            self.ctx.runtime_slots.release(self._slot_provider, self.key)
            self._slot_provider = None
        if busy != self._busy:
            self._busy = busy
            if self.ctx.on_busy_change is not None:
                self.ctx.on_busy_change(self.ws, self.sid, busy)

    # -- the ForkHost port (actors/fork_host.py): what a fork saga or resolver may use ------

    @property
    def store(self) -> SagaStore:
        return self.ctx.store

    @property
    def resolve_store(self) -> ResolveStore:
        return self.ctx.store

    @property
    def workers(self) -> WorkerPort:
        return self.ctx.workers

    @property
    def catalog(self) -> ProviderCatalog:
        return self.ctx.catalog

    @property
    def failpoints(self) -> Failpoints:
        return self.ctx.failpoints

    @property
    def timeouts(self) -> Timeouts:
        return self.ctx.timeouts

    @property
    def fork_trees(self) -> ForkTrees | None:
        return self.ctx.fork_trees

    @property
    def live_operations(self) -> LiveOperations:
        return self.ctx.live_operations

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path:
        return self.ctx.runtime_home(workspace_id, session_id, provider)
