"""The SessionActor: one pykka actor per live Session, serialising that Session's mutations,
its turns' streamed events and its fork sagas.

It never blocks on a provider: driver calls return futures whose completions come back to the
actor as `FollowUp` messages, so a fenced write arriving mid-fork is rejected by the store
fence instead of queueing behind the saga.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pykka

from actors import fork_saga, runtime_dirs
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
    runtime_key,
)
from actors.pool import PooledActor
from actors.ports import (
    DeliveryUnknown,
    Failpoints,
    NotDelivered,
    ProviderCatalog,
    WorkerFailed,
    WorkerPort,
)
from actors.rebind import CanonicalTurn, match_missing
from actors.timers import TIMERS, TimerHandle
from domain.worker_messages import (
    InteractionRequested,
    TurnActivity,
    TurnBindingMoved,
    TurnCompleted,
    TurnEvent,
    TurnItem,
    TurnStarted,
)
from storage.base import host_error_of
from storage.errors import (
    Conflict,
    ForkInProgress,
    HostError,
    InvalidRequest,
    NotFound,
    ProviderError,
    SessionBusy,
    StoreBusy,
    TurnNotFound,
    Unavailable,
)
from storage.models import Session, Turn

log = logging.getLogger(__name__)
T = TypeVar("T")

# Backoff of a Turn's durable writes while the store is busy or full.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class _RetryDurable:
    """Timer tick: retry the Session's queued durable writes."""


@dataclass
class _TurnState:
    turn_id: str
    provider_turn_id: str | None = None
    last_assistant_message_id: str | None = None
    # `settling`: the outcome is chosen (later provider events are ignored); `settled`: the
    # settle write is durable. A Turn counts as live until it is settled.
    settling: bool = False
    settled: bool = False
    pending_events: list[TurnEvent] = field(default_factory=list)
    last_activity: float = field(default_factory=time.monotonic)
    watchdog: TimerHandle | None = None
    # turn.start was sent: only from then does the inactivity limit run. Before, the Turn
    # waits for a runtime slot (no limit: it is queued, not hung) or for its runtime's start
    # (`session.start`, with its own timeout), issue 14 §6.
    at_provider: bool = False


@dataclass(eq=False)
class _Durable:
    """One durable write owed to a Turn (a driver event applied, a binding, a settlement),
    retried in order while the store is busy or full (issue 15 defect 1)."""

    turn_id: str
    what: str
    apply: Callable[[], object]
    # A settlement is never given up on: it is retried until it lands.
    final: bool = False
    first_failure: float | None = None
    then: Callable[[HostError | None], None] | None = None


class SessionActor(PooledActor):
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
        self.ws = workspace_id
        self.sid = session_id
        self.key = runtime_key(workspace_id, session_id)
        # A previous actor for this Session may still drain its mailbox: start after it, so
        # the Session's writes stay serialised across an idle stop and a restart.
        self.wait_for(predecessor)
        self._turns: dict[str, _TurnState] = {}
        # Fork sagas and fork.resolve requests in flight (actors/fork_saga.py, fork_resolve.py);
        # both see this actor only through the `actors.fork_host.ForkHost` port.
        self.sagas: dict[str, LiveSaga] = {}
        self.resolves: dict[str, Any] = {}
        # The runtime this Session's last passed fork re-attestation proved (issue 20).
        self.attested_runtime: tuple[str, ...] | None = None
        # turn id → binding JSON of a late `turn.binding` that arrived while a fork fenced the
        # source (seed 000 §7 Claude 3): applied as soon as the fence is released.
        self._late_bindings: dict[str, str] = {}
        self._busy = False
        # Runtime slot (issue 14 §6): held while preparing or busy, released when neither.
        self._preparing = 0
        self._slot_provider: str | None = None
        self._durable: deque[_Durable] = deque()
        self._retry_timer: TimerHandle | None = None
        self._retry_delay = RETRY_FIRST_S

    # -- lifecycle -------------------------------------------------------------------------

    def on_stop(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        for state in self._turns.values():
            if state.watchdog is not None:
                state.watchdog.cancel()
        # This thread ends now: its store connection (and file descriptors) must go with it.
        self.ctx.store.release_thread_connection()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        log.error("session actor %s crashed: %r", self.key, exception_value)

    def on_receive(self, message: Any) -> Any:
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - an actor must outlive any single message
            what = f"session actor {self.key} on {type(message).__name__}"
            if isinstance(exc, HostError) and exc.status < 500:
                # An ordinary refusal (busy, fenced, not found): the caller gets it typed.
                log.debug("%s: refused: %s", what, exc)
            elif isinstance(exc, HostError):
                log.exception("%s failed", what)
            # Every message that owes a reply gets one, typed (issue 15 defect 2); a FollowUp
            # carries the reply of the request it continues. An untyped failure is logged
            # once, with its reference id, by the one internal-error builder.
            typed = host_error_of(exc, what, logger=log)
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply(typed)
        finally:
            self._update_busy()
        return None

    def _dispatch(self, message: Any) -> None:
        match message:
            case FollowUp(fn=fn):
                fn()
            case _RetryDurable():
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
                fork_saga.start(self, message)
            case ForkAdvance():
                fork_saga.advance_leftover(self, message)
            case ForkResolve():
                ForkResolver.start(self, message)
            case RuntimeLost():
                self._on_runtime_lost(message)
            case _:
                log.warning("session actor %s: unknown message %r", self.key, message)

    def _binding_write(self, turn_id: str, binding: str) -> _Durable:
        """The queued write of one `turn.binding`; one that meets a fork fence is kept in
        `_late_bindings` instead of failing (seed 000 §7 Claude 3)."""
        store, ws, sid = self.ctx.store, self.ws, self.sid

        def _apply() -> None:
            try:
                store.update_turn_binding(ws, sid, turn_id, binding)
            except ForkInProgress:
                # A fork froze the source: the operation keeps the binding it froze, and this
                # provider fact is applied when the fence is released — never lost.
                log.info("session %s: turn %s binding deferred by a fork", self.key, turn_id)
                self._late_bindings[turn_id] = binding
                return
            self._late_bindings.pop(turn_id, None)  # newer than any deferred one

        return _Durable(turn_id, "turn binding", _apply)

    def apply_late_bindings(self) -> None:
        """Queue the `turn.binding` checkpoints deferred by a fork fence; called when a fork
        operation of this source ends (still fenced by another one → deferred again)."""
        late, self._late_bindings = self._late_bindings, {}
        for turn_id, binding in late.items():
            self._enqueue(self._binding_write(turn_id, binding))

    def _update_busy(self) -> None:
        busy = (
            bool(self.sagas)
            or bool(self.resolves)
            or bool(self._durable)
            or bool(self._late_bindings)  # stay alive until they are applied
            or any(not t.settled for t in self._turns.values())
            # A runtime preparation (a slot wait, `session.start`) may outlast the idle reap;
            # a fork.create waiting on it is owed a reply by this actor (issue 15 defect 2).
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
    def live_operations(self) -> LiveOperations:
        return self.ctx.live_operations

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path:
        return self.ctx.runtime_home(workspace_id, session_id, provider)

    # -- helpers used by the saga ----------------------------------------------------------

    def later(
        self,
        future: Future[T],
        on_done: Callable[[Future[T]], None],
        reply: Callable[[Any], None] | None = None,
    ) -> None:
        """Continue on this actor's thread when `future` completes; `reply` is the reply the
        continuation owes, answered with a typed error if the continuation raises."""
        ref = self.actor_ref

        def _done(f: Future[T]) -> None:
            try:
                ref.tell(FollowUp(lambda: on_done(f), reply))
            except pykka.ActorDeadError:
                log.warning("session actor %s gone before a driver answer", self.key)
                if reply is not None:  # still owed: typed and retryable, never silence
                    reply(Unavailable("the session stopped; try again", reason="session_stopped"))

        future.add_done_callback(_done)

    def after(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        """Run `fn` on this actor's thread in `seconds` (one shared timer thread for all)."""
        ref = self.actor_ref

        def _fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(FollowUp(fn))

        return TIMERS.call_later(seconds, _fire)

    def session(self) -> Session:
        return self.ctx.store.get_session(self.ws, self.sid)

    def prepare_runtime(
        self, session: Session, on_ready: Callable[[PreparedRuntime | HostError], None]
    ) -> None:
        """Take one of the provider's runtime slots (queueing while all are busy), then
        prepare the runtime; the slot is released when the Session has nothing in progress."""
        ref = self.actor_ref
        self._preparing += 1
        self._slot_provider = session.provider

        def _ready(runtime: PreparedRuntime | HostError) -> None:
            self._preparing -= 1
            self.ctx.runtime_slots.started(session.provider, self.key)
            on_ready(runtime)

        def _prepare_now() -> None:
            try:
                self._prepare_runtime_now(session, _ready)
            except Exception as exc:  # noqa: BLE001 - the waiter and the start permit are freed
                if isinstance(exc, HostError):
                    log.exception("session %s: preparing the runtime failed", self.key)
                _ready(host_error_of(exc, f"session {self.key}: preparing the runtime", logger=log))

        def _granted() -> None:
            try:
                ref.tell(FollowUp(_prepare_now))
            except pykka.ActorDeadError:
                self.ctx.runtime_slots.release(session.provider, self.key)

        self.ctx.runtime_slots.acquire(session.provider, self.key, _granted)

    def _prepare_runtime_now(
        self, session: Session, on_ready: Callable[[PreparedRuntime | HostError], None]
    ) -> None:
        """Attach (or reuse) the Session's runtime in its worker: the same preparation for a
        live, a historical and a resumed Session; the result is persisted as runtime context
        so capability projection never has to spawn a process."""
        home = self.ctx.runtime_home(self.ws, self.sid, session.provider)
        home.mkdir(parents=True, exist_ok=True)
        params = {
            "agentSessionId": self.key,
            "home": str(home),
            "cwd": session.cwd,
            "settings": dict(session.settings),
            "model": session.model,
            "providerSessionId": session.provider_session_id,
            "runtimeContext": dict(session.runtime_context),
        }
        fut = self.ctx.workers.request(
            session.provider, "session.start", params, self.ctx.timeouts.session_start_s
        )

        def _done(f: Future[dict[str, Any]]) -> None:
            # The start itself has ended: its permit goes to the next cold Session now.
            self.ctx.runtime_slots.started(session.provider, self.key)
            try:
                result = f.result()
            except Exception as exc:  # noqa: BLE001 - every failure becomes a typed error
                on_ready(_provider_error(exc, "runtime preparation failed"))
                return
            try:
                prepared = _record(result)
            except Exception as exc:  # noqa: BLE001 - the waiter is always answered, typed
                on_ready(host_error_of(exc, f"session {self.key}: recording the runtime"))
                return
            self._rebind_missing(prepared, lambda: on_ready(prepared))

        def _record(result: dict[str, Any]) -> PreparedRuntime:
            provider_session_id = str(result.get("providerSessionId") or "")
            context = dict(result.get("runtimeContext") or {})
            current = self.session()
            if current.provider_session_id != provider_session_id or dict(
                current.runtime_context
            ) != {**current.runtime_context, **context}:
                current = self.ctx.store.update_runtime(
                    self.ws,
                    self.sid,
                    provider_session_id=provider_session_id or None,
                    runtime_context=context,
                )
            return PreparedRuntime(
                provider=current.provider,
                home=str(home),
                cwd=current.cwd,
                settings=dict(current.settings),
                provider_session_id=provider_session_id,
                runtime_context=dict(current.runtime_context),
                generation=_generation_of(result),
                verdict=context,
            )

        self.later(fut, _done)

    def _rebind_missing(self, runtime: PreparedRuntime, then: Callable[[], None]) -> None:
        """Re-bind settled completed Turns whose provider binding was never recorded, from
        the provider's own history (by order and content, fail closed), then continue. Any
        failure here only leaves those Turns unbound, as they were."""
        try:
            missing = self.ctx.store.turns_missing_binding(self.ws, self.sid)
        except HostError as exc:
            log.warning("session %s: re-bind check failed: %s", self.key, exc.message)
            missing = []
        if not missing:
            then()
            return
        fut = self.ctx.workers.request(
            runtime.provider,
            "session.history",
            {"agentSessionId": self.key},
            self.ctx.timeouts.control_s,
        )

        def _done(f: Future[dict[str, Any]]) -> None:
            try:
                self._apply_rebind(set(missing), list(f.result().get("turns") or []))
            except Exception as exc:  # noqa: BLE001 - a failed re-bind leaves Turns unbound
                log.warning("session %s: re-bind from provider history failed: %s", self.key, exc)
            then()

        self.later(fut, _done)

    def _apply_rebind(self, missing: set[str], provider_turns: list[Mapping[str, Any]]) -> None:
        turns, _ = self.ctx.store.timeline(self.ws, self.sid, after_sequence=0, limit=100_000)
        canonical = [
            CanonicalTurn(
                t.turn_id,
                t.root_provider_turn_id,
                next((m.text for m in t.messages if m.kind == "user"), None),
                t.turn_id in missing,
            )
            for t in turns
        ]
        matches = match_missing(canonical, provider_turns)
        # A provider whose Turns carry a binding JSON (Claude's checkpoint) gives it with
        # its history; one the Turn already holds (its own write landed) is kept.
        bindings = {str(t.get("providerTurnId")): t.get("bindingJson") for t in provider_turns}
        held = {t.turn_id: t.provider_turn_binding_json for t in turns}
        for turn_id, provider_turn_id in matches.items():
            binding = bindings.get(provider_turn_id)
            self.ctx.store.bind_provider_turn(
                self.ws,
                self.sid,
                turn_id,
                provider_turn_id,
                str(binding) if binding and held.get(turn_id) is None else None,
            )
            log.warning(
                "session %s: turn %s re-bound to provider turn %s from the provider's history",
                self.key,
                turn_id,
                provider_turn_id,
            )
        for turn_id in sorted(missing - matches.keys()):
            log.warning(
                "session %s: turn %s has no provider binding and none can be proven; left "
                "unbound (fail closed)",
                self.key,
                turn_id,
            )

    # -- plain mutations -------------------------------------------------------------------

    def _on_mutate(self, msg: Mutate) -> None:
        provider = self.session().provider if msg.stop_runtime else None
        result = msg.fn(self.ctx.store)
        if provider is not None:
            # Deleted (committed): its provider runtime and home have no further use. The home
            # goes once the runtime has stopped, off this thread; a kill in between is
            # finished by the next start (actors/runtime_dirs.py).
            self.ctx.failpoints.hit("host.session.delete.after_commit")
            stopped = self.ctx.workers.request(
                provider, "session.stop", {"agentSessionId": self.key}, 10.0
            )
            runtimes, ws, sid = self.ctx.runtimes_dir, self.ws, self.sid
            stopped.add_done_callback(
                lambda _f: threading.Thread(
                    target=runtime_dirs.discard,
                    args=(runtimes, ws, sid),
                    name="agenthost-discard",
                    daemon=True,
                ).start()
            )
            self.ctx.runtime_slots.forget(provider, self.key)
        msg.reply(result)

    # -- turns -----------------------------------------------------------------------------

    def _on_submit(self, msg: Submit) -> None:
        turn, created = self.ctx.store.claim_submit(self.ws, self.sid, msg.request_id, msg.text)
        msg.reply(turn)
        if not created:
            return
        state = _TurnState(turn.turn_id)
        self._turns[turn.turn_id] = state
        self._arm_watchdog(state, self.ctx.timeouts.turn_inactivity_s)
        session = self.session()

        started = time.monotonic()

        def _runtime_ready(runtime: PreparedRuntime | HostError) -> None:
            if state.settling:
                return  # interrupted (or timed out) while the runtime was being prepared
            if (
                isinstance(runtime, StoreBusy)
                and time.monotonic() - started < self.ctx.timeouts.store_retry_limit_s
            ):
                # Recording the runtime met a busy store: prepare again (idempotent).
                self.after(RETRY_MAX_S / 4, lambda: self.prepare_runtime(session, _runtime_ready))
                return
            if isinstance(runtime, HostError):
                self._settle(state, "failed", error=runtime.message)
                return
            state.at_provider = True
            state.last_activity = time.monotonic()
            fut = self.ctx.workers.request(
                session.provider,
                "turn.start",
                {"agentSessionId": self.key, "turnId": turn.turn_id, "text": msg.text},
                self.ctx.timeouts.turn_start_s,
            )
            self.later(fut, lambda f: self._turn_started(state, f))

        self.prepare_runtime(session, _runtime_ready)

    def _turn_started(self, state: _TurnState, fut: Future[dict[str, Any]]) -> None:
        try:
            result = fut.result()
        except Exception as exc:  # noqa: BLE001
            self._settle(state, "failed", error=f"turn start failed: {exc}")
            return
        state.last_activity = time.monotonic()
        self._bind(state, str(result.get("providerTurnId") or ""))
        pending, state.pending_events = state.pending_events, []
        for event in pending:
            self._on_driver_event(event)

    def _bind(self, state: _TurnState, provider_turn_id: str) -> None:
        if not provider_turn_id or state.provider_turn_id == provider_turn_id or state.settling:
            return
        state.provider_turn_id = provider_turn_id
        self._enqueue(
            _Durable(
                state.turn_id,
                "bind provider turn",
                lambda: self.ctx.store.bind_provider_turn(
                    self.ws, self.sid, state.turn_id, provider_turn_id
                ),
            )
        )

    def _settle(
        self,
        state: _TurnState,
        outcome: str,
        *,
        error: str | None = None,
        then: Callable[[HostError | None], None] | None = None,
    ) -> None:
        """Choose the Turn's outcome now; it is settled when the write is durable (issue 15
        defect 3): the write is queued behind the Turn's earlier events and retried."""
        if state.settling:
            if then is not None:
                then(None if state.settled else StoreBusy("the turn's settlement is pending"))
            return
        state.settling = True
        if state.watchdog is not None:
            state.watchdog.cancel()
        self._enqueue(self._settle_item(state, outcome, error, then))

    def _settle_item(
        self,
        state: _TurnState,
        outcome: str,
        error: str | None,
        then: Callable[[HostError | None], None] | None,
    ) -> _Durable:
        def _apply() -> None:
            try:
                self.ctx.store.settle_turn(
                    self.ws,
                    self.sid,
                    state.turn_id,
                    outcome=outcome,
                    # Read when the write lands: every earlier event has been applied.
                    final_assistant_message_id=state.last_assistant_message_id,
                    error=error,
                )
            except StoreBusy:
                raise
            except HostError:
                # Not transient (the Session is gone, …): nothing will ever settle it here.
                self._forget(state)
                raise
            self._forget(state)

        return _Durable(state.turn_id, f"settle {outcome}", _apply, final=True, then=then)

    def _forget(self, state: _TurnState) -> None:
        state.settled = True
        if state.watchdog is not None:
            state.watchdog.cancel()
        self._turns.pop(state.turn_id, None)

    # -- durable writes, in order, retried -------------------------------------------------

    def _enqueue(self, item: _Durable) -> None:
        self._durable.append(item)
        if len(self._durable) == 1 and self._retry_timer is None:
            self._drain()

    def _drain(self) -> None:
        """Apply the queued writes in order; a busy or full store stops the queue and a timer
        retries it with backoff, so no event is dropped and none overtakes another."""
        limit = self.ctx.timeouts.store_retry_limit_s
        while self._durable:
            item = self._durable[0]
            try:
                item.apply()
            except StoreBusy as exc:
                now = time.monotonic()
                if item.first_failure is None:
                    item.first_failure = now
                    log.warning("session %s: %s deferred: %s", self.key, item.what, exc.message)
                elif not item.final and now - item.first_failure > limit:
                    self._give_up(item, exc)
                    continue
                if item.then is not None:
                    # The caller waiting on this write learns it is not durable yet; the
                    # write itself stays queued.
                    then, item.then = item.then, None
                    then(exc)
                self._schedule_retry()
                return
            except HostError as exc:
                log.warning("session %s: %s failed: %s", self.key, item.what, exc.message)
                self._durable.popleft()
                if item.then is not None:
                    item.then(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - one bad write must not stop the queue
                error = host_error_of(exc, f"session {self.key}: {item.what}", logger=log)
                self._durable.popleft()
                if item.then is not None:
                    item.then(error)
                continue
            self._durable.popleft()
            self._retry_delay = RETRY_FIRST_S
            if item.then is not None:
                item.then(None)

    def _schedule_retry(self) -> None:
        if self._retry_timer is not None:
            return
        delay = self._retry_delay
        self._retry_delay = min(RETRY_MAX_S, delay * 2)
        ref = self.actor_ref

        def _fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_RetryDurable())

        self._retry_timer = TIMERS.call_later(delay, _fire)

    def _give_up(self, item: _Durable, exc: StoreBusy) -> None:
        """The store stayed unwritable past the limit: the Turn's remaining writes are dropped
        and replaced by one settlement `failed` with the reason, retried until it lands."""
        turn_id = item.turn_id
        dropped = [d for d in self._durable if d.turn_id == turn_id]
        self._durable = deque(d for d in self._durable if d.turn_id != turn_id)
        state = self._turns.get(turn_id)
        log.error(
            "session %s: turn %s: %d write(s) could not be stored for %.0f s; settling it failed",
            self.key,
            turn_id,
            len(dropped),
            self.ctx.timeouts.store_retry_limit_s,
        )
        if state is None:
            return  # a trailing binding of a settled Turn: nothing left to settle
        state.settling = True
        error = (
            f"the store stayed unwritable for {self.ctx.timeouts.store_retry_limit_s:.0f} s "
            f"({exc.message}); the turn's provider events could not be recorded"
        )
        # Its messages may be partial: the settlement names no final assistant Message.
        state.last_assistant_message_id = None
        thens = [d.then for d in dropped if d.then is not None]

        def _then(err: HostError | None) -> None:
            for fn in thens:
                fn(err)

        self._durable.appendleft(
            self._settle_item(state, "failed", error, _then if thens else None)
        )

    # -- inactivity --------------------------------------------------------------------------

    def _arm_watchdog(self, state: _TurnState, seconds: float) -> None:
        state.watchdog = self.after(max(0.05, seconds), lambda: self._check_inactive(state))

    def _check_inactive(self, state: _TurnState) -> None:
        """A Turn whose provider has been silent past the limit is hung (issue 15 defect 8):
        stop its runtime and settle it `failed`. A Turn waiting on the user is not hung."""
        if state.settling:
            return
        limit = self.ctx.timeouts.turn_inactivity_s
        if not state.at_provider:
            # Queued for a runtime slot or its runtime being started (issue 14 §6): not hung.
            state.last_activity = time.monotonic()
            self._arm_watchdog(state, limit)
            return
        try:
            turn = self.ctx.store.get_turn(self.ws, self.sid, state.turn_id)
        except HostError as exc:
            log.warning("session %s: watchdog read failed: %s", self.key, exc.message)
            self._arm_watchdog(state, RETRY_MAX_S)
            return
        waiting_on_user = any(i.status == "pending" for i in turn.interactions)
        idle = time.monotonic() - state.last_activity
        if waiting_on_user or idle < limit:
            self._arm_watchdog(state, limit if waiting_on_user else limit - idle)
            return
        log.warning("session %s: turn %s silent %.0f s; stopping", self.key, state.turn_id, idle)
        self._stop_runtime()
        self._settle(
            state,
            "failed",
            error=f"the provider sent nothing for {limit:g} s; its runtime was stopped",
        )

    def _stop_runtime(self) -> None:
        """Stop the Session's provider runtime (it respawns at the next use)."""
        provider = self.session().provider
        self.ctx.workers.request(
            provider, "session.stop", {"agentSessionId": self.key}, self.ctx.timeouts.control_s
        )

    def _state_for_event(self, turn_id: str) -> _TurnState | None:
        state = self._turns.get(turn_id)
        if state is not None:
            return state
        # An event for a Turn this actor did not start (e.g. the actor idled out and came
        # back while a trailing binding event was in flight): rebuild from the store.
        try:
            turn = self.ctx.store.get_turn(self.ws, self.sid, turn_id)
        except HostError:
            return None
        state = _TurnState(turn_id, provider_turn_id=turn.root_provider_turn_id)
        state.at_provider = True  # it sends events: the provider has it
        state.settled = state.settling = turn.phase == "settled"
        return state

    def _on_driver_event(self, event: TurnEvent) -> None:
        turn_id = event.turn_id
        state = self._state_for_event(turn_id)
        if state is None:
            log.warning("session %s: event for unknown turn %r", self.key, turn_id)
            return
        state.last_activity = time.monotonic()
        if isinstance(event, TurnActivity):
            return  # a reply is streaming (message.delta, published by the daemon): not hung
        store, ws, sid = self.ctx.store, self.ws, self.sid
        if isinstance(event, TurnBindingMoved):
            # A trailing system message may move the checkpoint after settlement (Claude).
            self._enqueue(self._binding_write(turn_id, event.binding_json))
            return
        if state.settling:
            return
        match event:
            case TurnStarted(provider_turn_id=provider_turn_id):
                self._bind(state, provider_turn_id)
            case TurnItem():
                item_kind = event.kind
                if item_kind == "user":
                    return  # the canonical user Message was written by the submit claim
                text, payload = event.text, event.payload

                def _append() -> None:
                    message = store.append_message(
                        ws, sid, turn_id, kind=item_kind, text=text, payload=payload
                    )
                    if item_kind == "assistant":
                        state.last_assistant_message_id = message.message_id

                self._enqueue(_Durable(turn_id, f"{item_kind} message", _append))
            case InteractionRequested(request_id=request_id, kind=ikind):
                payload = dict(event.input)
                self._enqueue(
                    _Durable(
                        turn_id,
                        "interaction",
                        lambda: store.open_interaction(
                            ws, sid, turn_id, request_id=request_id, kind=ikind, input=payload
                        ),
                    )
                )
            case TurnCompleted():
                self._bind(state, event.provider_turn_id)
                self._settle(state, event.outcome, error=event.error)
            case _:
                log.warning("session %s: unknown driver event %r", self.key, event.TYPE)

    def _on_runtime_lost(self, msg: RuntimeLost) -> None:
        """No event will ever settle a Turn whose provider process died: settle it here."""
        if not self._turns or self.session().provider != msg.provider:
            return
        for state in list(self._turns.values()):
            if state.provider_turn_id is not None:
                self._settle(state, "failed", error=f"provider worker lost: {msg.reason}")

    def _on_interrupt(self, msg: Interrupt) -> None:
        """Works on any Turn the store shows active (issue 15 defect 3): one this actor runs,
        one whose settlement is still pending, one nothing tracks any more, and one whose
        provider runtime is hung (defect 8: the runtime is stopped)."""
        turn = self.ctx.store.get_turn(self.ws, self.sid, msg.turn_id)
        self.ctx.store.check_fence(self.ws, self.sid)
        if turn.phase != "active":
            msg.reply(turn)
            return

        def _answer(err: HostError | None) -> None:
            if err is not None:
                msg.reply(err)
                return
            msg.reply(self.ctx.store.get_turn(self.ws, self.sid, turn.turn_id))

        state = self._turns.get(turn.turn_id)
        if state is None:
            # Nothing in this process works on it: settle it here (with what the store has).
            state = _TurnState(turn.turn_id, provider_turn_id=turn.root_provider_turn_id)
            self._turns[turn.turn_id] = state
            if turn.root_provider_turn_id:
                self._stop_runtime()
            self._settle(state, "interrupted", then=_answer)
            return
        if state.settling:
            self._settle(state, "interrupted", then=_answer)  # answers with its pending write
            return
        provider_turn_id = state.provider_turn_id or turn.root_provider_turn_id
        if not provider_turn_id:
            # Not started at the provider yet: settle it here, nothing to stop there.
            self._settle(state, "interrupted", then=_answer)
            return
        provider = self.session().provider
        fut = self.ctx.workers.request(
            provider,
            "turn.interrupt",
            {"agentSessionId": self.key, "providerTurnId": provider_turn_id},
            self.ctx.timeouts.interrupt_s,
        )

        def _done(f: Future[dict[str, Any]]) -> None:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, WorkerFailed) and exc.error.get("code") in (
                    "invalid_request",
                    "not_found",
                ):
                    msg.reply(_control_error(exc, "interrupt failed"))
                    return
                # The runtime did not take the interrupt (hung, gone, timed out): stop it
                # and settle the Turn here, so an interrupt always ends the Turn.
                log.warning("session %s: interrupt failed (%s); stopping runtime", self.key, exc)
                self._stop_runtime()
                self._settle(state, "interrupted", then=_answer)
                return
            msg.reply(self.ctx.store.get_turn(self.ws, self.sid, turn.turn_id))

        self.later(fut, _done, msg.reply)

    def _on_respond(self, msg: Respond) -> None:
        turn = self.ctx.store.get_turn(self.ws, self.sid, msg.turn_id)
        pending = [i for i in turn.interactions if i.request_id == msg.request_id]
        if not pending:
            raise TurnNotFound(
                f"no interaction {msg.request_id!r} in turn {msg.turn_id!r}",
                reason="turn_not_found",
            )
        if pending[0].status != "pending":
            raise Conflict(f"interaction {msg.request_id!r} is {pending[0].status}")
        self.ctx.store.check_fence(self.ws, self.sid)
        provider = self.session().provider
        fut = self.ctx.workers.request(
            provider,
            "interaction.respond",
            {
                "agentSessionId": self.key,
                "requestId": msg.request_id,
                "response": dict(msg.response),
            },
            self.ctx.timeouts.control_s,
        )

        def _done(f: Future[dict[str, Any]]) -> None:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001
                msg.reply(_control_error(exc, "interaction response failed"))
                return
            state = self._turns.get(msg.turn_id)
            if state is not None:
                state.last_activity = time.monotonic()
            interaction = self.ctx.store.resolve_interaction(
                self.ws, self.sid, msg.turn_id, msg.request_id, dict(msg.response)
            )
            msg.reply(interaction)

        self.later(fut, _done, msg.reply)

    def active_turn(self) -> Turn | None:
        return self.ctx.store.active_turn(self.ws, self.sid)


# A driver's client-side verdicts keep their status when they cross the worker link: an answer
# the provider no longer waits for is a 409, a malformed answer a 400, not a provider failure.
_PASSED_THROUGH: dict[str, type[HostError]] = {
    "invalid_request": InvalidRequest,
    "not_found": NotFound,
    "conflict": Conflict,
}


def _control_error(exc: BaseException, what: str) -> HostError:
    """`_provider_error` for turn controls (interrupt, interaction answers): a typed 4xx from
    the driver reaches the client as that 4xx, with its reason and params."""
    if isinstance(exc, WorkerFailed):
        cls = _PASSED_THROUGH.get(str(exc.error.get("code")))
        if cls is not None:
            params = exc.error.get("params")
            return cls(
                f"{what}: {exc.error.get('message')}",
                reason=str(exc.error.get("reason") or cls.default_reason),
                params=dict(params) if isinstance(params, dict) else None,
            )
    return _provider_error(exc, what)


def _generation_of(result: Mapping[str, Any]) -> str | None:
    """`runtimeGeneration` of a worker answer (issue 20); anything but a non-empty string is
    none, so the next fork re-attests."""
    value = result.get("runtimeGeneration")
    return value if isinstance(value, str) and value else None


def _provider_error(exc: BaseException, what: str) -> HostError:
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, NotDelivered):
        return ProviderError(
            f"{what}: provider worker unavailable: {exc}", reason="provider_unavailable"
        )
    if isinstance(exc, DeliveryUnknown):
        return ProviderError(f"{what}: provider worker lost: {exc}", reason="provider_lost")
    if isinstance(exc, WorkerFailed):
        error = exc.error
        if error.get("reason") == "agent_session_busy":
            return SessionBusy(str(error.get("message")))
        return ProviderError(
            f"{what}: {error.get('message')}", reason=str(error.get("reason") or "provider_error")
        )
    return ProviderError(f"{what}: {exc}")
