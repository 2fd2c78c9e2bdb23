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
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pykka

from actors import runtime_dirs
from actors.context import HostContext
from actors.fork_saga import ForkSaga
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
from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from storage.errors import (
    Conflict,
    HostError,
    InvalidRequest,
    NotFound,
    ProviderError,
    SessionBusy,
    TurnNotFound,
)
from storage.models import Session, Turn

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PreparedRuntime:
    """The runtime identity resolved once per attempt (seed 000 §6.3): used for attestation,
    re-attestation, dispatch, and frozen into a fork child's cwd/settings/runtime context."""

    provider: str
    home: str
    cwd: str
    settings: Mapping[str, Any]
    provider_session_id: str
    runtime_context: Mapping[str, Any]


@dataclass
class _TurnState:
    turn_id: str
    provider_turn_id: str | None = None
    last_assistant_message_id: str | None = None
    settled: bool = False
    pending_events: list[Mapping[str, Any]] = field(default_factory=list)


class SessionActor(pykka.ThreadingActor):
    def __init__(
        self,
        ctx: HostContext,
        workspace_id: str,
        session_id: str,
        predecessor: pykka.Future[Any] | None = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.ws = workspace_id
        self.sid = session_id
        self.key = runtime_key(workspace_id, session_id)
        self._predecessor = predecessor
        self._turns: dict[str, _TurnState] = {}
        self.sagas: dict[str, ForkSaga] = {}
        self._busy = False

    # -- lifecycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        # A previous actor for this Session may still drain its mailbox: wait, so the
        # Session's writes stay serialised across an idle stop and a restart.
        if self._predecessor is not None:
            with contextlib.suppress(Exception):  # a dead predecessor has nothing left to drain
                self._predecessor.get(timeout=30)
            self._predecessor = None

    def on_stop(self) -> None:
        # This thread ends now: its store connection (and file descriptors) must go with it.
        self.ctx.store.release_thread_connection()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        log.error("session actor %s crashed: %r", self.key, exception_value)
        self.ctx.store.release_thread_connection()

    def on_receive(self, message: Any) -> Any:
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - an actor must outlive any single message
            if isinstance(exc, HostError) and exc.status < 500:
                # An ordinary refusal (busy, fenced, not found): the caller gets it typed.
                log.debug("session actor %s refused %r: %s", self.key, type(message).__name__, exc)
            else:
                log.exception("session actor %s failed on %r", self.key, type(message).__name__)
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply(exc if isinstance(exc, HostError) else _internal(exc))
        finally:
            self._update_busy()
        return None

    def _dispatch(self, message: Any) -> None:
        match message:
            case FollowUp(fn=fn):
                fn()
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
                ForkSaga.start(self, message)
            case ForkAdvance():
                ForkSaga.advance_leftover(self, message)
            case RuntimeLost():
                self._on_runtime_lost(message)
            case _:
                log.warning("session actor %s: unknown message %r", self.key, message)

    def _update_busy(self) -> None:
        busy = bool(self.sagas) or any(not t.settled for t in self._turns.values())
        if busy != self._busy:
            self._busy = busy
            if self.ctx.on_busy_change is not None:
                self.ctx.on_busy_change(self.ws, self.sid, busy)

    # -- helpers used by the saga ----------------------------------------------------------

    def later(self, future: Future[T], on_done: Callable[[Future[T]], None]) -> None:
        """Continue on this actor's thread when `future` completes."""
        ref = self.actor_ref

        def _done(f: Future[T]) -> None:
            try:
                ref.tell(FollowUp(lambda: on_done(f)))
            except pykka.ActorDeadError:
                log.warning("session actor %s gone before a driver answer", self.key)

        future.add_done_callback(_done)

    def after(self, seconds: float, fn: Callable[[], None]) -> threading.Timer:
        ref = self.actor_ref

        def _fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(FollowUp(fn))

        timer = threading.Timer(seconds, _fire)
        timer.daemon = True
        timer.start()
        return timer

    def session(self) -> Session:
        return self.ctx.store.get_session(self.ws, self.sid)

    def prepare_runtime(
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
            try:
                result = f.result()
            except Exception as exc:  # noqa: BLE001 - every failure becomes a typed error
                on_ready(_provider_error(exc, "runtime preparation failed"))
                return
            provider_session_id = str(result.get("providerSessionId") or "")
            context = dict(result.get("runtimeContext") or {})
            current = self.session()
            if current.provider_session_id != provider_session_id or dict(
                current.runtime_context
            ) != {**current.runtime_context, **context}:
                try:
                    current = self.ctx.store.update_runtime(
                        self.ws,
                        self.sid,
                        provider_session_id=provider_session_id or None,
                        runtime_context=context,
                    )
                except HostError as exc:
                    on_ready(exc)
                    return
            on_ready(
                PreparedRuntime(
                    provider=current.provider,
                    home=str(home),
                    cwd=current.cwd,
                    settings=dict(current.settings),
                    provider_session_id=provider_session_id,
                    runtime_context=dict(current.runtime_context),
                )
            )

        self.later(fut, _done)

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
        msg.reply(result)

    # -- turns -----------------------------------------------------------------------------

    def _on_submit(self, msg: Submit) -> None:
        turn, created = self.ctx.store.claim_submit(self.ws, self.sid, msg.request_id, msg.text)
        msg.reply(turn)
        if not created:
            return
        state = _TurnState(turn.turn_id)
        self._turns[turn.turn_id] = state
        session = self.session()

        def _runtime_ready(runtime: PreparedRuntime | HostError) -> None:
            if isinstance(runtime, HostError):
                self._settle(state, "failed", error=runtime.message)
                return
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
        self._bind(state, str(result.get("providerTurnId") or ""))
        pending, state.pending_events = state.pending_events, []
        for event in pending:
            self._on_driver_event(event)

    def _bind(self, state: _TurnState, provider_turn_id: str) -> None:
        if not provider_turn_id or state.provider_turn_id == provider_turn_id or state.settled:
            return
        state.provider_turn_id = provider_turn_id
        self.ctx.store.bind_provider_turn(self.ws, self.sid, state.turn_id, provider_turn_id)

    def _settle(self, state: _TurnState, outcome: str, *, error: str | None = None) -> None:
        if state.settled:
            return
        state.settled = True
        self.ctx.store.settle_turn(
            self.ws,
            self.sid,
            state.turn_id,
            outcome=outcome,
            final_assistant_message_id=state.last_assistant_message_id,
            error=error,
        )
        self._turns.pop(state.turn_id, None)

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
        state.settled = turn.phase == "settled"
        return state

    def _on_driver_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        turn_id = str(event.get("turnId") or "")
        state = self._state_for_event(turn_id)
        if state is None:
            log.warning("session %s: event for unknown turn %r", self.key, turn_id)
            return
        if kind == "turn.binding":
            # A trailing system message may move the checkpoint after settlement (Claude).
            self.ctx.store.update_turn_binding(
                self.ws, self.sid, turn_id, str(event.get("bindingJson") or "")
            )
            return
        if state.settled:
            return
        if kind == "turn.started":
            self._bind(state, str(event.get("providerTurnId") or ""))
        elif kind == "item":
            item = event.get("item") or {}
            item_kind = str(item.get("kind") or "assistant")
            if item_kind == "user":
                return  # the canonical user Message was written by the submit claim
            message = self.ctx.store.append_message(
                self.ws,
                self.sid,
                turn_id,
                kind=item_kind,
                text=item.get("text"),
                payload=dict(item.get("payload") or {}),
            )
            if item_kind == "assistant":
                state.last_assistant_message_id = message.message_id
        elif kind == "interaction.requested":
            self.ctx.store.open_interaction(
                self.ws,
                self.sid,
                turn_id,
                request_id=str(event.get("requestId")),
                kind=str(event.get("kind") or "question"),
                input=dict(event.get("input") or {}),
            )
        elif kind == "turn.completed":
            self._bind(state, str(event.get("providerTurnId") or ""))
            outcome = str(event.get("outcome") or "completed")
            self._settle(state, outcome, error=event.get("error"))
        else:
            log.warning("session %s: unknown driver event %r", self.key, kind)

    def _on_runtime_lost(self, msg: RuntimeLost) -> None:
        """No event will ever settle a Turn whose provider process died: settle it here."""
        if not self._turns or self.session().provider != msg.provider:
            return
        for state in list(self._turns.values()):
            if state.provider_turn_id is not None:
                self._settle(state, "failed", error=f"provider worker lost: {msg.reason}")

    def _on_interrupt(self, msg: Interrupt) -> None:
        turn = self.ctx.store.get_turn(self.ws, self.sid, msg.turn_id)
        self.ctx.store.check_fence(self.ws, self.sid)
        if turn.phase != "active":
            msg.reply(turn)
            return
        state = self._turns.get(turn.turn_id)
        provider_turn_id = (state.provider_turn_id if state else None) or turn.root_provider_turn_id
        if not provider_turn_id:
            # Not started at the provider yet: settle it here, nothing to stop there.
            if state is not None:
                self._settle(state, "interrupted")
            msg.reply(self.ctx.store.get_turn(self.ws, self.sid, turn.turn_id))
            return
        provider = self.session().provider
        fut = self.ctx.workers.request(
            provider,
            "turn.interrupt",
            {"agentSessionId": self.key, "providerTurnId": provider_turn_id},
            self.ctx.timeouts.control_s,
        )

        def _done(f: Future[dict[str, Any]]) -> None:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001
                msg.reply(_control_error(exc, "interrupt failed"))
                return
            msg.reply(self.ctx.store.get_turn(self.ws, self.sid, turn.turn_id))

        self.later(fut, _done)

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
            interaction = self.ctx.store.resolve_interaction(
                self.ws, self.sid, msg.turn_id, msg.request_id, dict(msg.response)
            )
            msg.reply(interaction)

        self.later(fut, _done)

    def active_turn(self) -> Turn | None:
        return self.ctx.store.active_turn(self.ws, self.sid)


def _internal(exc: Exception) -> HostError:
    """An untyped failure, already logged with its traceback: the client gets a 500 whose
    message never carries the exception's text (docs/protocol.md, "Internal errors")."""
    return HostError(f"internal error ({type(exc).__name__}); see the daemon log")


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
