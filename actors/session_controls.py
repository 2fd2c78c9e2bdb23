"""The client's controls of a live Session: plain mutations, interrupt, interaction answers.

One concern: the requests that act on a Session or its active Turn from outside — a store
mutation serialised through the actor (with the runtime stop a delete needs), an interrupt
that always ends the Turn, and an answer to a pending Interaction — each checked against the
fork fence before it reaches the provider.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from functools import partial

from actors import runtime_dirs
from actors.messages import Interrupt, Mutate, Respond
from actors.ports import WorkerFailed
from actors.provider_errors import control_error
from actors.session_base import RETRY_FIRST_S, RETRY_MAX_S, SessionCore, TurnState
from actors.session_runtime import SessionRuntime
from actors.session_turns import TurnRunner
from domain.errors import Conflict, ForkInProgress, HostError, InteractionNotFound
from domain.worker_messages import InteractionRespond, SessionStop, TurnInterrupt
from storage.sqlite import host_error_of, typed_store_error

# One logger for every concern of the Session actor (operators filter on it).
log = logging.getLogger("actors.session_actor")

DELETE_STOP_S = 10.0
"""How long a delete waits for the worker to answer its Session's runtime stop before it
removes the Session's runtime folder anyway, killing what still runs there first. The drivers'
own stops end within less (Claude: `drivers.claude.turns`, 7 s at most; an app-server's
close: its stdin, 3 s, SIGTERM, 3 s, SIGKILL)."""


class SessionControls:
    """Mutations, interrupts and interaction answers of one Session; no state of its own but
    the answers the provider took whose record waits for a busy store (`records_pending`): it
    acts through the Session's Turns and its runtime."""

    def __init__(self, core: SessionCore, turns: TurnRunner, runtime: SessionRuntime) -> None:
        self._core = core
        self._turns = turns
        self._runtime = runtime
        self.records_pending = 0
        """Interaction answers the provider took whose record a busy store refused, retried
        (the actor stays busy meanwhile, so no idle stop drops the retry or its reply)."""
        self.calls_pending = 0
        """Interrupts and interaction answers sent to the worker and not answered yet: the
        actor stays busy meanwhile. The Turn they act on may settle first (its end can
        overtake the worker's reply), and an idle stop then left the reply no actor: the
        request answered 503 `session_stopped` and an answer the provider took unrecorded."""

    # -- plain mutations -------------------------------------------------------------------

    def on_mutate(self, msg: Mutate) -> None:
        runtime = self._runtime
        if msg.stop_runtime and runtime.forks_preparing:
            # A delete while a `fork.create` of this Session prepares its runtime (queued for a
            # slot, or in `session.start`; no operation, no fence yet) meets the fork now, as
            # its fence would: the fork, accepted first, goes first, and the delete is not held
            # for as long as the fork waits for a slot (minutes, with every slot busy).
            raise ForkInProgress(
                f"a fork of agent session {self._core.key} is preparing its runtime; "
                "retry the delete once it has ended"
            )
        session = self._core.session() if msg.stop_runtime else None
        provider = session.provider if session is not None else None
        result = msg.fn()
        if session is not None and self._core.ctx.checkpoint_janitor is not None:
            # Its checkpoints have no further use: their refs go now (off this thread), their
            # objects at the next collection.
            self._core.ctx.checkpoint_janitor.drop_session(session.cwd, self._core.sid)
        if provider is not None:
            # Deleted (committed): its provider runtime and home have no further use. A
            # preparation still queued for its slot starts nothing (`SessionRuntime.gone`).
            runtime.gone = True
            self._core.ctx.failpoints.hit("host.session.delete.after_commit")
            if runtime.preparing > runtime.slot_waits:
                # A Turn's `session.start` is in progress (the Turn interrupted while it
                # waited; an active one's claim refuses the delete): the delete is applied
                # now, and the runtime that start makes (in the home it works in) is stopped
                # and its home removed once it has answered, its answer discarded; a start
                # held by a stopped app-server is ended now, not at its request limit.
                runtime.stop_start(provider)
                runtime.after_preparing.append(partial(self._discard_runtime, provider))
            else:
                self._discard_runtime(provider)
        msg.reply(result)

    def _discard_runtime(self, provider: str) -> None:
        """A deleted Session's runtime is stopped, then its home removed off this thread (a
        kill in between is finished by the next start: actors/runtime_dirs.py), and its slot
        freed. What still runs in the home is killed before it is removed: a stop the worker
        did not answer within `DELETE_STOP_S` (a worker whose lifecycle lane is full, or that
        is wedged) may have left the runtime itself there."""
        stopped = self._core.ctx.workers.stop_session(
            provider, SessionStop(self._core.key), DELETE_STOP_S
        )
        runtimes, ws, sid = self._core.ctx.runtimes_dir, self._core.ws, self._core.sid
        failpoints = self._core.ctx.failpoints
        key = self._core.key

        uses = self._core.ctx.home_uses

        def remove() -> None:
            # Whatever the stop's answer: what a provider started and left (a tool's process
            # its CLI did not take with it) would work on in a folder nothing owns.
            killed = runtime_dirs.end_processes(runtimes, ws, sid)
            if killed:
                failed = stopped.exception()
                log.warning(
                    "session %s: killed what still ran in its runtime folder after its stop (%s): "
                    "%s",
                    key,
                    "answered" if failed is None else f"not answered: {failed}",
                    killed,
                )
            runtime_dirs.discard(runtimes, ws, sid)

        def discard() -> None:
            failpoints.hit("host.session.delete.discard")
            # Not while a worker call may start an app-server in the folder (a
            # `fork.resolve` reading a fork's child there): it would make it again.
            uses.remove((ws, sid), remove)

        stopped.add_done_callback(
            lambda _f: threading.Thread(
                target=discard,
                name="agenthost-discard",
                daemon=True,
            ).start()
        )
        self._core.ctx.runtime_slots.forget(provider, self._core.key)

    def on_interrupt(self, msg: Interrupt) -> None:
        """Works on any Turn the store shows active: one this actor runs,
        one whose settlement is still pending, one nothing tracks any more, and one whose
        provider runtime is hung (that runtime is stopped)."""
        turn = self._core.session_store.turns.get_turn(self._core.ws, self._core.sid, msg.turn_id)
        if turn.phase != "active":
            # Answered unchanged, a fork in flight or not: nothing is written.
            msg.reply(turn)
            return
        self._core.session_store.fork_fence.check_fence(self._core.ws, self._core.sid)

        def _answer(err: HostError | None) -> None:
            if err is not None:
                msg.reply(err)
                return
            msg.reply(
                self._core.session_store.turns.get_turn(self._core.ws, self._core.sid, turn.turn_id)
            )

        state = self._turns.get(turn.turn_id)
        if state is None:
            # Nothing in this process works on it: settle it here (with what the store has).
            # Whether its `turn.start` left is not known here (the actor that started it is
            # gone): it may have, so it is never marked host-only (the re-bind from the
            # provider's history decides it), and its runtime is stopped even while it is
            # unbound — the provider may run it, and nothing here could stop it later.
            state = self._turns.track(turn.turn_id, turn.root_provider_turn_id)
            state.start_maybe_sent = True
            self._runtime.stop_runtime()
            self._turns.settle(state, "interrupted", error=msg.why, then=_answer)
            return
        if state.settling:
            # Answers with its pending write.
            self._turns.settle(state, "interrupted", error=msg.why, then=_answer)
            return
        state.interrupted_why = msg.why
        provider_turn_id = state.provider_turn_id or turn.root_provider_turn_id
        if not provider_turn_id and state.start_unanswered:
            # `turn.start` is at the worker: the provider may be starting the turn. Settling
            # here would leave it running there, unstopped (and the next Turn refused as
            # "already active"): once the answer names the turn, this interrupt comes back
            # through the actor's inbox and goes to the provider.
            state.after_start_answer.append(partial(self._core.actor_ref.tell, msg))
            return
        if not provider_turn_id:
            # Not started at the provider yet: settle it here, nothing to stop there. A
            # `session.start` it waits for is given up: one on a stopped app-server is ended
            # now, or the Session's next Turn waited out its request limit behind it.
            self._runtime.stop_start(self._runtime.cached_session().provider)
            self._turns.settle(state, "interrupted", error=msg.why, then=_answer)
            return
        provider = self._core.session().provider
        fut = self._core.ctx.workers.interrupt_turn(
            provider,
            TurnInterrupt(self._core.key, provider_turn_id),
            self._core.ctx.timeouts.interrupt_s,
        )

        def _done(f: Future[None]) -> None:
            self.calls_pending -= 1
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, WorkerFailed) and exc.error.get("code") in (
                    "invalid_request",
                    "not_found",
                ):
                    msg.reply(control_error(exc, "interrupt failed"))
                    return
                if isinstance(exc, WorkerFailed) and exc.error.get("code") == "conflict":
                    # The provider answered that it runs no such Turn: it ended there (its
                    # `turn/completed` can follow the answer, or came first), or its runtime is
                    # gone (whose end fails it). Not hung: its end is awaited, within the
                    # interrupt's bound, and answered; stopping a live runtime would record a
                    # Turn the provider completed as `interrupted`.
                    if state.settling:
                        self._turns.settle(state, "interrupted", error=msg.why, then=_answer)
                        return
                    state.settle_waiters.append(_answer)
                    self._core.after(
                        self._core.ctx.timeouts.interrupt_s, partial(self._no_end, state, msg.why)
                    )
                    return
                # The runtime did not take the interrupt (hung, gone, timed out): stop it
                # and settle the Turn here, so an interrupt always ends the Turn.
                log.warning(
                    "session %s: interrupt failed (%s); stopping runtime", self._core.key, exc
                )
                self._runtime.stop_runtime()
                self._turns.settle(state, "interrupted", error=msg.why, then=_answer)
                return
            msg.reply(
                self._core.session_store.turns.get_turn(self._core.ws, self._core.sid, turn.turn_id)
            )

        self.calls_pending += 1
        self._core.later(fut, _done, msg.reply)

    def _no_end(self, state: TurnState, why: str | None) -> None:
        """An interrupted Turn whose provider said it runs no such Turn sent no end within the
        interrupt's bound: as a hung one, its runtime is stopped and it is settled here (the
        waiting interrupt answered with it)."""
        if state.settling:
            return
        log.warning(
            "session %s: turn %s: no end after the provider ran no such turn; stopping runtime",
            self._core.key,
            state.turn_id,
        )
        self._runtime.stop_runtime()
        self._turns.settle(state, "interrupted", error=why)

    def on_respond(self, msg: Respond) -> None:
        turn = self._core.session_store.turns.get_turn(self._core.ws, self._core.sid, msg.turn_id)
        pending = [i for i in turn.interactions if i.request_id == msg.request_id]
        if not pending:
            raise InteractionNotFound(f"no interaction {msg.request_id!r} in turn {msg.turn_id!r}")
        if pending[0].status != "pending":
            raise Conflict(f"interaction {msg.request_id!r} is {pending[0].status}")
        self._core.session_store.fork_fence.check_fence(self._core.ws, self._core.sid)
        provider = self._core.session().provider
        fut = self._core.ctx.workers.respond_interaction(
            provider,
            InteractionRespond(self._core.key, msg.request_id, dict(msg.response)),
            self._core.ctx.timeouts.control_s,
        )

        def _done(f: Future[None]) -> None:
            self.calls_pending -= 1
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001
                msg.reply(control_error(exc, "interaction response failed"))
                return
            state = self._turns.get(msg.turn_id)
            if state is not None:
                state.last_activity = time.monotonic()
            # The worker answered the provider: the Turn may already have settled (its end
            # can reach us before this reply), and the answer is still what happened.
            output = dict(msg.response) if msg.by is None else {**msg.response, "by": msg.by}
            self._record_answer(msg, output, RETRY_FIRST_S)

        self.calls_pending += 1
        self._core.later(fut, _done, msg.reply)

    def _record_answer(self, msg: Respond, output: dict[str, object], delay: float) -> None:
        """The answer the provider took, recorded; a busy (or full) store's refusal, or a fork's
        fence, is retried with backoff until it lands, and the request answered then. Answered
        503 at once, a retry of the answer met the provider's "not pending" (409) while the
        record stayed `pending` — the Turn's watchdog waiting on the person — until the Turn's
        settlement superseded it, the answer the provider took never recorded."""
        try:
            interaction = self._core.session_store.history.resolve_interaction(
                self._core.ws, self._core.sid, msg.turn_id, msg.request_id, output, delivered=True
            )
        except Exception as exc:  # noqa: BLE001 - a busy store or a fence is retried
            # A fork of the Session that began after the Turn settled (the answer's Turn, not
            # pending any more, does not refuse it) fences the record: it lands once the fork
            # ends (every active operation has a saga that ends it), never inside its window.
            waits = exc if isinstance(exc, ForkInProgress) else typed_store_error(exc)
            if waits is None:
                msg.reply(host_error_of(exc, f"session {self._core.key}: answer", logger=log))
                return
            log.warning(
                "session %s: recording the answer to %s deferred %.2f s: %s",
                self._core.key,
                msg.request_id,
                delay,
                waits.message,
            )
            self.records_pending += 1

            def again() -> None:
                self.records_pending -= 1
                self._record_answer(msg, output, min(RETRY_MAX_S, delay * 2))

            self._core.after(delay, again)
            return
        msg.reply(interaction)
