"""The SessionActor: one pykka actor per live Session, serialising that Session's mutations,
its turns' streamed events and its fork sagas.

It never blocks on a provider: driver calls return futures whose completions come back to the
actor as `FollowUp` messages, so a fenced write arriving mid-fork is rejected by the store
fence instead of queueing behind the saga.

This module is the actor itself: its lifecycle, the dispatch of its messages, its busy state,
and the `ForkHost` port a fork saga or `fork.resolve` runs through. It owns one part per other
concern, each with its own state, wired in its constructor (docs/design/internals.md, "The
actors"): the runtime (`session_runtime`), the durable writes (`turn_writes`), the Turns
(`session_turns`) and the client's controls (`session_controls`), all handed one
`session_base.SessionCore` (the Session's identity and thread hops).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pykka

from actors import fork_saga
from actors.context import HostContext, LiveOperations, Timeouts
from actors.fork_host import LiveSaga, PreparedRuntime
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
from actors.pool import PooledActor, TimerHandle
from actors.ports import Failpoints, ProviderCatalog, WorkerPort
from actors.session_base import RetryDurable, SessionCore, T
from actors.session_controls import SessionControls
from actors.session_runtime import SessionRuntime
from actors.session_turns import TurnRunner
from actors.store_ports import ResolveStore, SagaStore
from actors.turn_writes import TurnWrites
from domain.errors import HostError, StoreBusy
from storage.models import Session
from storage.sqlite import host_error_of
from workspace.worktree import ForkTrees

log = logging.getLogger(__name__)

MAX_HELD_WRITES = 4
"""Durable writes a burst of driver events may hold back to land as one batch (a Turn's usual
burst: item, binding, message, settle)."""

ROW_KEEPING = (ForkCreate, ForkAdvance, FollowUp, Submit, DriverEvent, RetryDurable)
"""The messages the Session row cache (`cached_session`) survives: those that cannot change
what it is read for (`SessionRuntime.cached_session`): a fork's start and its saga's steps (a
fork's transitions and commit never write the source's row), and a Turn's submit, driver
events, continuations and write retries (a Turn's writes move only the row's
`active_turn_id` and `updated_at_ms`). Everything else — mutations, interrupts and answers,
`fork.resolve`, a lost runtime — may, so it empties the cache before and after it runs
(`SessionActor.on_receive`, which asks a message's kind once for both); the actor's own
runtime write (`update_runtime`) replaces it with the row it wrote."""


class SessionActor(PooledActor):
    """One live Session (see the module docstring); `HostActor` starts and stops it."""

    def __init__(
        self,
        ctx: HostContext,
        workspace_id: str,
        session_id: str,
        predecessor: pykka.Future[Any] | None = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.actor_pool = ctx.actor_pool
        self.core = SessionCore(ctx, workspace_id, session_id, self.actor_ref)
        self.ws, self.sid, self.key = workspace_id, session_id, self.core.key
        self.runtime = SessionRuntime(self.core)
        self.writes = TurnWrites(self.core, give_up=lambda item, exc: self.turns.give_up(item, exc))
        self.turns = TurnRunner(self.core, self.runtime, self.writes)
        self.controls = SessionControls(self.core, self.turns, self.runtime)
        # Fork sagas and fork.resolve requests in flight (actors/fork_saga.py, fork_resolve.py);
        # both see this actor only through the `actors.fork_host.ForkHost` port.
        self.sagas: dict[str, LiveSaga] = {}
        self.resolves: dict[str, Any] = {}
        self.home_calls = 0
        """`fork.resolve`'s worker calls sent and not yet answered on this thread, or held for
        a delete's removal (`use_homes`): the actor stays busy meanwhile, or the idle reaper
        stopped it and the call's answer found no actor (an inspection never answered)."""
        self.tree_records: set[str] = set()
        self._busy = False
        # A previous actor for this Session may still drain its mailbox: start after it, so
        # the Session's writes stay serialised across an idle stop and a restart.
        self.wait_for(predecessor)

    # -- lifecycle -------------------------------------------------------------------------

    def on_stop(self) -> None:
        self.writes.cancel()
        self.turns.cancel_watchdogs()
        # This thread ends now: its store connection (and file descriptors) must go with it.
        self.core.session_store.db.release_thread_connection()

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
        # A Turn's driver events come in bursts (start, binding; item, completion): while the
        # next queued message is another driver event, or the provider's answer to the Turn's
        # `turn.start` (which only queues more of its writes; `FollowUp.turn_event`), this
        # one's durable writes wait for it, and the burst's writes land as one transaction
        # (one baton turn, one COMMIT, one `turn.updated`). Which message comes next is looked
        # at once this one is handled (what arrived meanwhile counts), and while a Turn's
        # `turn.start` is unanswered its writes wait for that answer, which is sure to come
        # (its result, its failure or its timeout) and follows the start's own events
        # (`TurnRunner.awaiting_start`); a Turn's assistant Message waits, within a bound, for
        # the Turn's next write — its settlement, most often (`TurnWrites.linger`). Any other
        # message finds them durable — it drains them
        # before it runs — all but a plain mutation that went ahead of the burst
        # (`goes_ahead`), which does not read or depend on a Turn's writes. At most
        # MAX_HELD_WRITES wait: a provider that streams faster than the store commits still
        # has its Turn land (and its `turn.updated` events go out) every few messages, and
        # the queue stays bounded.
        if self.writes and not self._joins_burst(message) and not self.goes_ahead(message):
            self.writes.drain_if_due()
        self.writes.hold = True  # this message's writes wait for its end, at least
        if isinstance(message, RuntimeLost):
            self.runtime.forget_warm_runtime()
        keeps_row = isinstance(message, ROW_KEEPING)
        if not keeps_row:
            self.runtime.forget_row()  # and again at its end (`ROW_KEEPING`)
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - an actor must outlive any single message
            what = f"session actor {self.key} on {type(message).__name__}"
            if isinstance(exc, HostError) and exc.status < 500:
                # An ordinary refusal (busy, fenced, not found): the caller gets it typed.
                log.debug("%s: refused: %s", what, exc)
            elif isinstance(exc, StoreBusy):
                # Retryable and nothing written (a busy or full store): the caller gets 503;
                # one line, not a traceback per request while the store stays busy.
                log.warning("%s: %s", what, exc.message)
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
            if not keeps_row:
                self.runtime.forget_row()
            following = self.next_message()
            self.writes.hold = False
            held = len(self.writes) < MAX_HELD_WRITES and (
                self._joins_burst(following)
                or (following is None and (self.turns.awaiting_start() or self.writes.lingering))
            )
            if not held:
                self.writes.drain_if_due()  # this message's writes and what was held for it
            self._update_busy()
        return None

    @staticmethod
    def _joins_burst(message: Any) -> bool:
        """A message whose writes may land with the Turn writes held before it."""
        return isinstance(message, DriverEvent) or (
            isinstance(message, FollowUp) and message.turn_event
        )

    def _dispatch(self, message: Any) -> None:
        match message:
            case FollowUp(fn=fn):
                fn()
            case RetryDurable():
                self.writes.retry()
            case Mutate():
                # A plain write the actor cannot see into: whether every settled Turn holds its
                # provider binding is the store's to say again.
                self.runtime.forget_bindings()
                self.controls.on_mutate(message)
            case Submit():
                self.turns.on_submit(message)
            case Interrupt():
                self.controls.on_interrupt(message)
            case Respond():
                self.controls.on_respond(message)
            case DriverEvent(event=event):
                self.turns.on_driver_event(event)
            case ForkCreate():
                fork_saga.start(self, message)
            case ForkAdvance():
                fork_saga.advance_leftover(self, message)
            case ForkResolve():
                ForkResolver.start(self, message)
            case RuntimeLost():
                self.turns.on_runtime_lost(message)
            case _:
                log.warning("session actor %s: unknown message %r", self.key, message)

    def _update_busy(self) -> None:
        busy = (
            bool(self.sagas)
            or bool(self.resolves)
            or self.home_calls > 0
            or bool(self.tree_records)
            or self.controls.records_pending > 0
            or self.controls.calls_pending > 0
            or bool(self.writes)
            or self.writes.late_bindings_pending  # stay alive until they are applied
            or self.turns.unsettled()
            # A runtime preparation (a slot wait, `session.start`) may outlast the idle reap;
            # a fork.create waiting on it is owed a reply by this actor.
            or self.runtime.preparing > 0
        )
        self.runtime.release_slot_if_idle(busy)
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
    def retry_failed_tree(self) -> Callable[[str, str, str, str], None] | None:
        return self.ctx.retry_failed_tree

    @property
    def live_operations(self) -> LiveOperations:
        return self.ctx.live_operations

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path:
        return self.ctx.runtime_home(workspace_id, session_id, provider)

    @property
    def attested_runtime(self) -> tuple[str, ...] | None:
        return self.runtime.attested_runtime

    @attested_runtime.setter
    def attested_runtime(self, value: tuple[str, ...] | None) -> None:
        self.runtime.attested_runtime = value

    def session(self) -> Session:
        return self.core.session()

    def cached_session(self) -> Session:
        return self.runtime.cached_session()

    def warm_runtime(self, session: Session) -> PreparedRuntime | None:
        return self.runtime.warm_runtime(session)

    def forget_warm_runtime(self) -> None:
        self.runtime.forget_warm_runtime()

    def prepare_runtime(
        self,
        session: Session,
        on_ready: Callable[[PreparedRuntime | HostError], None],
        *,
        fork: bool = False,
    ) -> None:
        self.runtime.prepare_runtime(session, on_ready, fork=fork)

    def later(
        self,
        future: Future[T],
        on_done: Callable[[Future[T]], None],
        reply: Callable[[Any], None] | None = None,
    ) -> None:
        self.core.later(future, on_done, reply)

    def after(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        return self.core.after(seconds, fn)

    def use_homes(self, session_ids: Sequence[str], go: Callable[[], None]) -> None:
        self.home_calls += 1
        self._use_homes([(self.core.ws, sid) for sid in dict.fromkeys(session_ids)], go)

    def _use_homes(self, keys: Sequence[tuple[str, str]], go: Callable[[], None]) -> None:
        ref = self.actor_ref

        def later() -> None:
            # From the removal's thread: back on this actor's (kept busy), to ask again.
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(FollowUp(lambda: self._use_homes(keys, go)))

        self.ctx.home_uses.use(keys, go, later)

    def homes_done(self, session_ids: Sequence[str]) -> None:
        self.ctx.home_uses.done([(self.core.ws, sid) for sid in dict.fromkeys(session_ids)])

    def home_call_ended(self) -> None:
        self.home_calls -= 1

    def apply_late_bindings(self) -> None:
        self.writes.apply_late_bindings()
