"""Running a Turn: submit, start at the provider, apply its driver events, settle it.

One concern: a Turn's life in the Session actor — the submit claim, `turn.start` once the
runtime is ready, the typed driver events (`domain.worker_messages.TurnEvent`) turned into
durable writes, the settlement (chosen at once, durable when its write lands), the
inactivity watchdog, and settling the Turns a lost worker can never finish.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from actors.checkpoints import Capture, turn_record, unavailable
from actors.fork_host import PreparedRuntime
from actors.messages import RuntimeLost, Submit
from actors.ports import NotDelivered
from actors.provider_errors import provider_not_called, runtime_changed
from actors.session_base import RETRY_MAX_S, DurableWrite, SessionCore, TurnState
from actors.session_runtime import SessionRuntime
from actors.turn_writes import TurnWrites
from domain.errors import HostError, StoreBusy
from domain.model_limits import (
    BACKSTOP_GRACE_S,
    ModelLimits,
    first_byte_timeout,
    stream_idle_timeout,
)
from domain.turn_events import (
    ACTIVITY_PROGRESS,
    ACTIVITY_STREAM,
    InteractionRequested,
    TurnActivity,
    TurnBindingMoved,
    TurnCompleted,
    TurnEvent,
    TurnItem,
    TurnStarted,
)
from domain.worker_messages import TurnAccepted, TurnStart
from storage.models import Message, NewMessage, Session, Turn, TurnBound
from storage.sqlite import host_error_of

# One logger for every concern of the Session actor (operators filter on it).
log = logging.getLogger("actors.session_actor")

ASSISTANT_LINGER_S = 0.05
"""How long an assistant Message's write may wait for the Turn's next write (its settlement,
when it is the reply: an app-server's `turn/completed` follows the reply's `item/completed` by
~1–20 ms). Nobody waits on that write: the client already has the reply's deltas."""

START_LINGER_S = 1.0
"""How long a Turn's start writes (its provider bind and binding) may wait, once the answer to
its `turn.start` is in, for the Turn's next write: in a short Turn its reply and settlement, so
the Turn's writes after the claim land as one transaction (one COMMIT, one `turn.updated`).
Nothing waits on that write, and the store shows the Turn active either way (a crash before it
lands leaves an active, unbound Turn: what a crash before the start's answer always left).
Longer than a short Turn's stream: a bound that ends while the model streams lands the start
mid-stream (free) but one that ends as the reply arrives makes the settlement wait behind the
start's COMMIT (50 ms did so for a 20-delta Turn of `bench.turn_overhead`: its `after` stage
+2 ms in 4 pairs of 4)."""


class TurnRunner:
    """Runs the Session's Turns from submit to settlement; owns what it knows of each Turn
    until it is settled, and prepares runtimes and queues writes through its two parts."""

    def __init__(self, core: SessionCore, runtime: SessionRuntime, writes: TurnWrites) -> None:
        self._core = core
        self._runtime = runtime
        self._writes = writes
        self._turns: dict[str, TurnState] = {}
        writes.binding_recorded = self._binding_recorded

    # -- what the actor and the controls see -------------------------------------------------

    def get(self, turn_id: str) -> TurnState | None:
        return self._turns.get(turn_id)

    def track(self, turn_id: str, provider_turn_id: str | None) -> TurnState:
        """Track a Turn the store shows active that nothing in this process works on."""
        state = self._turns[turn_id] = TurnState(turn_id, provider_turn_id=provider_turn_id)
        return state

    def __bool__(self) -> bool:
        """Any Turn tracked (settled or not)."""
        return bool(self._turns)

    def unsettled(self) -> bool:
        return any(not t.settled for t in self._turns.values())

    def awaiting_start(self) -> bool:
        """A Turn not settling has its `turn.start` unanswered: its writes may wait for the
        answer (which comes: a result, a failure or the request's timeout)."""
        return any(t.start_unanswered and not t.settling for t in self._turns.values())

    def cancel_watchdogs(self) -> None:
        for state in self._turns.values():
            if state.watchdog is not None:
                state.watchdog.cancel()
            if state.stream_timer is not None:
                state.stream_timer.cancel()
            _answered_first_byte(state)

    # -- turns -----------------------------------------------------------------------------

    def on_submit(self, msg: Submit) -> None:
        # What the start needs from the store is read before the claim, while the `before`
        # capture runs beside (the claim changes none of it: the Session's provider, folder
        # and runtime, whether a settled Turn lacks its binding), so nothing is read between
        # the claim's COMMIT and the start. None: the claim answers why it cannot be read.
        read = self._read_for_start()
        # The files as they were before the provider gets the Turn, taken off this thread while
        # the claim commits here (nothing orders the two; the start waits for both) under the
        # id the claim gives a new Turn.
        early = self._early_before(read[0] if read is not None else None)
        try:
            self._core.ctx.failpoints.hit("host.turn.before_claim")
            turn, created = self._core.session_store.turns.claim_submit(
                self._core.ws,
                self._core.sid,
                msg.request_id,
                msg.text,
                turn_id=early[1] if early is not None else None,
            )
        except BaseException:
            self._discard_before(early)
            raise
        msg.reply(turn)
        if not created:
            self._discard_before(early)  # a replay: the claimed Turn is not this capture's
            return
        state = TurnState(turn.turn_id, image=turn, image_losses=self._writes.losses)
        self._turns[turn.turn_id] = state
        self._arm_watchdog(state, self._core.ctx.timeouts.turn_inactivity_s)
        try:
            self._begin(state, msg.text, read, early)
        except Exception as exc:  # noqa: BLE001 - the claim is answered: the Turn must still end
            # Nothing else would end it: the watchdog waits for a Turn not yet at its provider.
            failed = host_error_of(exc, f"session {self._core.key}: starting a turn", logger=log)
            self.settle(state, "failed", error=f"turn start failed: {failed.message}")

    def _begin(
        self,
        state: TurnState,
        text: str,
        read: tuple[Session, bool] | None,
        early: tuple[str, str, Future[Capture]] | None,
    ) -> None:
        """A claimed Turn's start: its `before` capture, then `turn.start` on the warm runtime,
        or the runtime's preparation first (`read`, `early`: what `on_submit` read and began
        before the claim)."""
        session, unbound = read if read is not None else (self._core.session(), None)
        # The runtime's preparation runs while the capture finishes; the start waits for it,
        # within its bound. A capture not begun beside the claim begins now.
        if early is not None and early[0] == session.cwd:
            self._capture_before(state, session.cwd, early[2])
        else:
            self._discard_before(early)
            self._capture_before(state, session.cwd)

        # The start's steps are methods given what they need, not closures of this frame: a
        # closure that names itself (a retry, a deferral) is a reference cycle, and this one
        # would hold the Turn's state, its captures and the `Submit` for the collector.
        started = time.monotonic()
        # The runtime the last `session.start` reported is still live and
        # unchanged: no `session.start` round trip before this Turn.
        warm = self._runtime.warm_turn_runtime(session, unbound=unbound)
        if warm is None:
            self._prepare(state, text, session, started)
            return
        self._core.ctx.failpoints.hit("host.turn.before_warm_start")
        self._start(state, text, session, started, warm, True)

    def _start(
        self,
        state: TurnState,
        text: str,
        session: Session,
        started: float,
        runtime: PreparedRuntime,
        warm: bool,
    ) -> None:
        """Send the Turn's `turn.start` on `runtime` (`warm`: one no `session.start` prepared
        for it), once its `before` capture has answered; `started`: when it was submitted."""
        if state.before_pending:
            state.after_before.append(
                lambda: (
                    None
                    if state.settling
                    else self._start(state, text, session, started, runtime, warm)
                )
            )
            return
        state.at_provider = True
        state.start_maybe_sent = True
        state.start_unanswered = True
        state.last_activity = time.monotonic()
        # A bound Turn: the provider's history of the Session must be there to resume.
        bound = self._runtime.bound_history()
        # And the last Turn bound and settled `completed`: its end must still be there.
        last = self._runtime.bound_turn_id() if bound else None
        if warm:
            # The worker starts it only on this runtime, else refuses it (`RuntimeChanged`)
            # before the provider sees anything; then it is prepared and started once more.
            request = TurnStart(
                self._core.key, state.turn_id, text, runtime.home, runtime.generation, bound, last
            )
        else:
            request = TurnStart(
                self._core.key, state.turn_id, text, bound_history=bound, bound_turn_id=last
            )
        fut = self._core.ctx.workers.start_turn(
            session.provider, request, self._core.ctx.timeouts.turn_start_s
        )
        again: Callable[[], None] | None = None
        if warm:
            again = partial(self._prepare, state, text, session, started)
        self._core.later(fut, lambda f: self._turn_started(state, f, again), turn_event=True)

    def _prepare(self, state: TurnState, text: str, session: Session, started: float) -> None:
        """Prepare the Session's runtime (`session.start`), then start the Turn on it."""
        self._runtime.prepare_runtime(
            session, partial(self._runtime_ready, state, text, session, started)
        )

    def _runtime_ready(
        self,
        state: TurnState,
        text: str,
        session: Session,
        started: float,
        runtime: PreparedRuntime | HostError,
    ) -> None:
        if state.settling:
            return  # interrupted (or timed out) while the runtime was being prepared
        if (
            isinstance(runtime, StoreBusy)
            and time.monotonic() - started < self._core.ctx.timeouts.store_retry_limit_s
        ):
            # Recording the runtime met a busy store: prepare again (idempotent).
            self._core.after(RETRY_MAX_S / 4, partial(self._prepare, state, text, session, started))
            return
        if isinstance(runtime, HostError):
            self.settle(state, "failed", error=runtime.message)
            return
        self._start(state, text, session, started, runtime, False)

    def _turn_started(
        self,
        state: TurnState,
        fut: Future[TurnAccepted],
        again: Callable[[], None] | None = None,
    ) -> None:
        """`turn.start` answered. `again`: the Turn went to a warm runtime; if the worker
        refused it because that runtime is no longer the live one, nothing was started at the
        provider, so the runtime is prepared (`session.start`) and the Turn started once more,
        without a generation (it cannot be refused that way twice)."""
        state.start_unanswered = False
        try:
            self._on_start_answer(state, fut, again)
        finally:
            waiting, state.after_start_answer = state.after_start_answer, []
            for then in waiting:
                then()
        if not state.settling:
            # The start's writes wait, within a bound, for the Turn's next write.
            self._writes.linger(START_LINGER_S)

    def _on_start_answer(
        self,
        state: TurnState,
        fut: Future[TurnAccepted],
        again: Callable[[], None] | None,
    ) -> None:
        try:
            result = fut.result()
        except Exception as exc:  # noqa: BLE001
            if (
                isinstance(exc, NotDelivered)
                or (again is not None and runtime_changed(exc))
                or provider_not_called(exc)
            ):
                # Never left the host, refused by the worker before the provider saw it, or
                # failed in the worker before the provider could get it.
                state.start_maybe_sent = False
            if again is not None and runtime_changed(exc):
                self._runtime.forget_warm_runtime()
                if not state.settling:
                    state.at_provider = False  # waiting for its runtime again, not hung
                    again()
                return
            self.settle(state, "failed", error=f"turn start failed: {exc}")
            return
        state.last_activity = time.monotonic()
        # From here the provider holds the turn (Claude Code answers once the CLI runs, so its
        # start-up is not counted against the model). The Session's provider, from the row
        # cache: no Turn message empties it, and no write changes a Session's provider.
        state.provider = self._runtime.cached_session().provider
        self._arm_first_byte(state, state.provider)
        self._bind(state, result.provider_turn_id)

    def _bind(self, state: TurnState, provider_turn_id: str) -> None:
        if not provider_turn_id or state.provider_turn_id == provider_turn_id or state.settling:
            return
        state.provider_turn_id = provider_turn_id
        self._writes.enqueue(
            DurableWrite(
                state.turn_id,
                "bind provider turn",
                partial(self._record_bind, state, provider_turn_id),
                then=self._runtime.binding_written,
                bound=TurnBound(root_provider_turn_id=provider_turn_id),
            )
        )
        if not state.start_unanswered:
            # A provider that names its turn after answering the start: as at the answer.
            self._writes.linger(START_LINGER_S)

    def _record_bind(self, state: TurnState, provider_turn_id: str) -> None:
        self._core.session_store.turns.record_provider_turn(
            self._core.ws, self._core.sid, state.turn_id, provider_turn_id
        )
        if state.image is not None:
            state.image = turn_bound(state.image, provider_turn_id, None)

    def _binding_recorded(self, turn_id: str, binding: str) -> None:
        state = self._turns.get(turn_id)
        if state is not None and state.image is not None:
            state.image = turn_bound(state.image, None, binding)

    def _image(self, state: TurnState) -> Turn | None:
        """The Turn as the store holds it, for its settlement to carry (None: read back)."""
        if state.image_losses != self._writes.losses:
            state.image = None  # a lost batch may have taken applied writes back
        return state.image

    def settle(
        self,
        state: TurnState,
        outcome: str,
        *,
        error: str | None = None,
        then: Callable[[HostError | None], None] | None = None,
    ) -> None:
        """Choose the Turn's outcome now; it is settled when the write is durable:
        the write is queued behind the Turn's earlier events and retried."""
        if state.settling:
            if then is not None and state.awaiting_after:
                state.settle_waiters.append(then)  # answered when the settlement lands
            elif then is not None:
                then(None if state.settled else StoreBusy("the turn's settlement is pending"))
            return
        state.settling = True
        if state.watchdog is not None:
            state.watchdog.cancel()
        if outcome == "completed" and state.provider_turn_id:
            self._runtime.turn_completed(state.provider_turn_id)

        def _then(err: HostError | None) -> None:
            waiting, state.settle_waiters = state.settle_waiters, []
            for fn in [then, *waiting] if then is not None else waiting:
                fn(err)

        def _queue() -> None:
            state.awaiting_after = False
            # The Turn's start writes still queued (held for its next write: in a short Turn
            # they land in this batch anyway) are written by the settlement's own statement.
            taken = self._writes.take_bound(state.turn_id)
            self._writes.enqueue(self._settle_item(state, outcome, error, _then, taken))

        # The settlement carries the `after` checkpoint in its own transaction: a settled
        # Turn is never seen (nor forked through) without it or its `unavailable` record.
        state.awaiting_after = True
        self.capture_after(state, _queue)

    # -- workspace checkpoints ---------------------------------------------------------------

    def _read_for_start(self) -> tuple[Session, bool] | None:
        """The Session's row and whether a settled Turn of it lacks its binding
        (`SessionRuntime.settled_turn_unbound`); None when the row cannot be read. The row
        comes from the actor's row cache (`SessionRuntime.cached_session`): the start reads
        only what it holds true (provider, folder, settings, runtime), which a plain
        mutation, the runtime's own record or `fork.resolve` changes, and each of those
        empties or replaces it; a Turn's claim, whose `active_turn_id` it does not hold true,
        is read by no step of the start."""
        try:
            session = self._runtime.cached_session()
        except HostError:
            return None
        return session, self._runtime.settled_turn_unbound()

    def _early_before(self, session: Session | None) -> tuple[str, str, Future[Capture]] | None:
        """The `before` capture of the Turn a submit may create, begun ahead of its claim:
        (cwd, the Turn's id, the capture). None when checkpoints are off, the Session cannot be
        read (`session` None: the claim answers why), or a Turn of this Session is still
        running here (the claim will refuse it, and its files are still being written)."""
        checkpoints = self._core.ctx.turn_checkpoints
        if checkpoints is None or session is None or self.unsettled():
            return None
        cwd = session.cwd
        turn_id = str(uuid.uuid4())
        # An unchanged small folder whose tree the Session's ref keeps already: taken here,
        # with no pool thread woken beside the claim's COMMIT.
        real = checkpoints.resolve(cwd)  # once: the pool's capture reuses it
        here = checkpoints.capture_before_here(cwd, self._core.sid, turn_id, real)
        if here is None:
            fut = checkpoints.capture(cwd, self._core.sid, turn_id, "before", real=real)
            return cwd, turn_id, fut
        done: Future[Capture] = Future()
        done.set_result(here)
        return cwd, turn_id, done

    def _discard_before(self, early: tuple[str, str, Future[Capture]] | None) -> None:
        checkpoints = self._core.ctx.turn_checkpoints
        if early is not None and checkpoints is not None:
            cwd, turn_id, fut = early
            checkpoints.discard(fut, cwd, self._core.sid, turn_id, "before")

    def _capture_before(
        self, state: TurnState, cwd: str, begun: Future[Capture] | None = None
    ) -> None:
        """Wait for the Turn's `before` capture (`begun`, or one begun now) within its bound."""
        checkpoints = self._core.ctx.turn_checkpoints
        if checkpoints is None:
            return
        state.cwd = cwd
        fut = begun or checkpoints.capture(cwd, self._core.sid, state.turn_id, "before")
        if fut.done():
            # Taken while the claim committed: the start goes on at once, with no message to
            # this thread in between (and no bound to time).
            state.before = fut.result()
            return
        state.before_pending = True
        bound = checkpoints.bound_s

        def _answered(capture: Capture | None) -> None:
            if not state.before_pending:
                return  # the bound ran out first (or the capture answered first)
            state.before_pending = False
            timer.cancel()
            # Kept here until the settlement writes the whole record (nothing forks through,
            # diffs or restores a running Turn, and it saves the Turn a transaction).
            state.before = capture or _timed_out(cwd, "before", bound)
            waiting, state.after_before = state.after_before, []
            for fn in waiting:
                fn()

        def _bound_fired() -> None:
            # Nobody reads it any more: a capture still queued never runs (it pinned nothing,
            # wrote nothing); one running lands and pins for a settled Turn nothing
            # (`RefPins.settled`). Cancelled here, not in `_answered`: that closure is the
            # future's own callback's, and naming the future in it would make a cycle.
            fut.cancel()
            _answered(None)

        timer = self._core.after(bound, _bound_fired)
        self._core.later(fut, lambda f: _answered(_capture_of(f)))

    def capture_after(self, state: TurnState, then: Callable[[], None]) -> None:
        """Capture the files as the Turn leaves them, then `then()` (within the bound)."""
        checkpoints = self._core.ctx.turn_checkpoints
        if checkpoints is None:
            then()
            return
        checkpoints_ = checkpoints
        self._writes.hold_for_capture()

        def _release() -> None:
            self._writes.release_capture()
            then()
            self._writes.capture_released()

        def _capture() -> None:
            if state.cwd is None:
                # A Turn this actor did not start (it idled out and came back): no `before`.
                try:
                    state.cwd = self._core.session().cwd
                except HostError:
                    _release()
                    return
            cwd = state.cwd
            before = state.before.checkpoint if state.before is not None else None
            tree = getattr(before, "tree", None)
            # An unchanged small folder: taken here, with no hop to the pool and back.
            real = checkpoints_.resolve(cwd)  # once: the pool's capture reuses it
            here = checkpoints_.capture_after_here(cwd, self._core.sid, state.turn_id, tree, real)
            if here is not None:
                state.after = here
                _release()
                return
            fut = checkpoints_.capture(cwd, self._core.sid, state.turn_id, "after", tree, real=real)
            bound = checkpoints_.bound_s
            done = [False]

            def _answered(capture: Capture | None) -> None:
                if done[0]:
                    return
                done[0] = True
                timer.cancel()
                state.after = capture or _timed_out(cwd, "after", bound)
                _release()

            def _bound_fired() -> None:
                fut.cancel()  # still queued: never runs (see `capture_before`)
                _answered(None)

            timer = self._core.after(bound, _bound_fired)
            self._core.later(fut, lambda f: _answered(_capture_of(f)))

        if state.before_pending:
            state.after_before.append(_capture)
        else:
            _capture()

    def _checkpoint_json(self, state: TurnState) -> str:
        """The record the settlement writes (actors/checkpoints.py `turn_record`)."""
        if self._core.ctx.turn_checkpoints is None:
            return json.dumps(
                unavailable("disabled", "workspace checkpoints are off ([workspace] checkpoints)")
            )
        after = state.after or Capture.missing(
            state.cwd or "", "not_captured", "the turn settled before its files were captured"
        )
        return json.dumps(turn_record(state.before, after))

    def _settle_item(
        self,
        state: TurnState,
        outcome: str,
        error: str | None,
        then: Callable[[HostError | None], None] | None,
        taken: list[DurableWrite] | None = None,
    ) -> DurableWrite:
        """The settlement's write; `taken`: the Turn's queued bind and binding writes
        (`TurnWrites.take_bound`) it writes too, answered when it lands or fails."""
        bound = _bound_of(taken) if taken else None
        # The Turn's queued new Messages (its reply) it inserts first, each under an id
        # chosen here; the newest assistant one is the Turn's final Message.
        messages = tuple(
            NewMessage(str(uuid.uuid4()), m.kind, m.text, m.payload)
            for d in taken or ()
            if (m := d.message) is not None
        )
        reply = next((m.message_id for m in reversed(messages) if m.kind == "assistant"), None)
        thens = [d.then for d in taken or () if d.then is not None]
        if thens:
            settled_then = then

            def then_(err: HostError | None) -> None:
                for fn in thens:
                    fn(err)
                if settled_then is not None:
                    settled_then(err)

            then = then_

        def _landed() -> None:
            self._forget(state)
            if taken:
                self._writes.bound_landed(taken)

        # The checkpoint record, built here (its JSON is off the writer's baton, which a
        # Turn's batch holds while it applies this write) and built again when the write
        # lands only if a capture changed since (a given-up Turn's settlement, queued while
        # its `after` was still being taken): what lands is the record as of then.
        captured = (state.before, state.after)
        record = [self._checkpoint_json(state)]

        def _record() -> str:
            if state.before is not captured[0] or state.after is not captured[1]:
                record[0] = self._checkpoint_json(state)
            return record[0]

        def _apply() -> None:
            # Read when the write lands: no `turn.start` can be sent after it.
            host_only = not state.start_maybe_sent and state.provider_turn_id is None
            try:
                self._core.session_store.turns.record_settlement(
                    self._core.ws,
                    self._core.sid,
                    state.turn_id,
                    outcome=outcome,
                    # Read when the write lands: every earlier event has been applied.
                    final_assistant_message_id=reply or state.last_assistant_message_id,
                    error=error,
                    checkpoint_json=_record(),
                    turn=self._image(state),
                    bound=bound,
                    messages=messages,
                    host_only=host_only,
                )
                if reply is not None:
                    state.last_assistant_message_id = reply
                self._runtime.turn_settled(outcome, state.provider_turn_id, host_only=host_only)
            except StoreBusy:
                raise
            except HostError:
                # Not transient (the Session is gone, …): nothing will ever settle it here.
                self._forget(state)
                raise

        return DurableWrite(
            state.turn_id,
            f"settle {outcome}",
            _apply,
            # Never given up on — but one carrying its Turn's reply may be, as the reply's own
            # write would have been: past the store's retry limit the Turn settles `failed`
            # with the reason (`give_up`), the reply dropped, as before it was taken.
            final=not messages,
            then=then,
            # Settled only once durable: a batch's COMMIT may still fail after the apply.
            landed=_landed,
        )

    def _forget(self, state: TurnState) -> None:
        state.settled = True
        checkpoints = self._core.ctx.turn_checkpoints
        if checkpoints is not None:
            # Its record is durable (or never will be): its checkpoint refs are unpinned.
            checkpoints.settled(self._core.sid, state.turn_id)
        if state.watchdog is not None:
            state.watchdog.cancel()
        if state.stream_timer is not None:
            state.stream_timer.cancel()
        _answered_first_byte(state)
        self._turns.pop(state.turn_id, None)

    def give_up(self, item: DurableWrite, exc: StoreBusy) -> None:
        """The store stayed unwritable past the limit: the Turn's remaining writes are dropped
        and replaced by one settlement `failed` with the reason, retried until it lands."""
        turn_id = item.turn_id
        dropped = self._writes.drop_turn(turn_id)
        state = self._turns.get(turn_id)
        log.error(
            "session %s: turn %s: %d write(s) could not be stored for %.0f s; settling it failed",
            self._core.key,
            turn_id,
            len(dropped),
            self._core.ctx.timeouts.store_retry_limit_s,
        )
        if state is None:
            return  # a trailing binding of a settled Turn: nothing left to settle
        state.settling = True
        error = (
            f"the store stayed unwritable for {self._core.ctx.timeouts.store_retry_limit_s:.0f} s "
            f"({exc.message}); the turn's provider events could not be recorded"
        )
        # Its messages may be partial: the settlement names no final assistant Message.
        state.last_assistant_message_id = None
        thens = [d.then for d in dropped if d.then is not None]

        def _then(err: HostError | None) -> None:
            for fn in thens:
                fn(err)

        self._writes.push_front(self._settle_item(state, "failed", error, _then if thens else None))

    # -- inactivity --------------------------------------------------------------------------

    def _arm_watchdog(self, state: TurnState, seconds: float) -> None:
        state.watchdog = self._core.after(max(0.05, seconds), lambda: self._check_inactive(state))

    def _check_inactive(self, state: TurnState) -> None:
        """A Turn whose provider has been silent past the limit is hung:
        stop its runtime and settle it `failed`. A Turn waiting on the user is not hung."""
        if state.settling:
            return
        limit = self._core.ctx.timeouts.turn_inactivity_s
        if not state.at_provider:
            # Queued for a runtime slot or its runtime being started: not hung.
            state.last_activity = time.monotonic()
            self._arm_watchdog(state, limit)
            return
        try:
            turn = self._core.session_store.turns.get_turn(
                self._core.ws, self._core.sid, state.turn_id
            )
        except HostError as exc:
            log.warning("session %s: watchdog read failed: %s", self._core.key, exc.message)
            self._arm_watchdog(state, RETRY_MAX_S)
            return
        waiting_on_user = any(i.status == "pending" for i in turn.interactions)
        idle = time.monotonic() - state.last_activity
        if waiting_on_user or idle < limit:
            self._arm_watchdog(state, limit if waiting_on_user else limit - idle)
            return
        log.warning(
            "session %s: turn %s silent %.0f s; stopping", self._core.key, state.turn_id, idle
        )
        self._runtime.stop_runtime()
        self.settle(
            state,
            "failed",
            error=f"the provider sent nothing for {limit:g} s; its runtime was stopped",
        )

    # -- the model's first byte ------------------------------------------------------------

    def _arm_first_byte(self, state: TurnState, provider: str) -> None:
        """The host's backstop for a model that accepts a request and never answers: each
        provider enforces its own limit first (with a better message); this one fires a
        little later, for a provider that has no such setting or does not honour it."""
        limits = self._core.ctx.timeouts.model_limits.get(provider)
        if limits is None:
            return  # no model endpoint (tutti-agent's built-in model)
        state.model_asked_at = asked = time.monotonic()
        wait = limits.first_byte_budget_s + BACKSTOP_GRACE_S
        _answered_first_byte(state)  # a start's earlier check (a Turn started again)
        state.first_byte = self._core.after(
            wait, lambda: self._check_first_byte(state, provider, asked, limits)
        )

    def _check_first_byte(
        self, state: TurnState, provider: str, asked: float, limits: ModelLimits
    ) -> None:
        if state.settling or state.model_answered or state.model_asked_at != asked:
            return  # answered, settled, or started again (that start armed its own check)
        endpoint = self._core.ctx.timeouts.model_endpoints.get(provider)
        log.warning(
            "session %s: turn %s: no answer from the model in %.1f s; stopping its runtime",
            self._core.key,
            state.turn_id,
            time.monotonic() - asked,
        )
        self._runtime.stop_runtime()
        self.settle(
            state,
            "failed",
            error=first_byte_timeout(provider, endpoint, limits.first_byte_budget_s)
            + "; agenthost stopped the provider's runtime",
        )

    # -- the model's stream ------------------------------------------------------------------

    def _follow_model(self, state: TurnState, event: TurnEvent) -> None:
        """What `event` says of the model: it answered (the first-byte backstop is done), it is
        in the middle of a reply (the stream-idle backstop runs from now), or the Turn is
        legitimately silent — an item finished (the next model request has not begun), a tool
        runs, an Interaction waits for the user, the provider retries on its own."""
        if isinstance(event, (TurnStarted, TurnBindingMoved)) or (
            isinstance(event, TurnItem) and event.kind == "user"
        ):
            return  # the provider's bookkeeping, not the model
        if isinstance(event, TurnActivity) and event.kind == ACTIVITY_PROGRESS:
            # A retry note: shown to the user, but no answer (the first byte is still owed),
            # and the provider noticed the silence itself (its stream is over).
            state.streamed_at = None
            return
        state.model_answered = True
        if state.first_byte is not None:
            _answered_first_byte(state)  # its check would find the model answered
        if isinstance(event, TurnActivity) and event.kind == ACTIVITY_STREAM:
            state.streamed_at = time.monotonic()
            if state.stream_timer is None and not state.settling:
                self._arm_stream_idle(state)
        else:
            state.streamed_at = None

    def _arm_stream_idle(self, state: TurnState) -> None:
        """The host's backstop for a reply that began and went silent: each provider enforces
        its own stream-idle limit first (with a better message); this one fires
        `BACKSTOP_GRACE_S` later, for a provider that does not honour it. One timer per Turn,
        moved on when it fires early (the stream went on meanwhile)."""
        provider = state.provider
        if provider is None:
            try:
                provider = state.provider = self._core.session().provider
            except HostError:
                return
        limits = self._core.ctx.timeouts.model_limits.get(provider)
        if limits is None:
            return  # no model endpoint (tutti-agent's built-in model)
        wait = limits.stream_idle_s + BACKSTOP_GRACE_S
        state.stream_timer = self._core.after(
            wait, lambda: self._check_stream_idle(state, provider, limits)
        )

    def _check_stream_idle(self, state: TurnState, provider: str, limits: ModelLimits) -> None:
        state.stream_timer = None
        if state.settling or state.streamed_at is None:
            return  # settled, or no longer mid-stream (re-armed by the next delta)
        wait = limits.stream_idle_s + BACKSTOP_GRACE_S
        idle = time.monotonic() - state.streamed_at
        if idle < wait:
            state.stream_timer = self._core.after(
                wait - idle, lambda: self._check_stream_idle(state, provider, limits)
            )
            return
        endpoint = self._core.ctx.timeouts.model_endpoints.get(provider)
        log.warning(
            "session %s: turn %s: the model's reply stalled %.1f s mid-stream; stopping its "
            "runtime",
            self._core.key,
            state.turn_id,
            idle,
        )
        self._runtime.stop_runtime()
        self.settle(
            state,
            "failed",
            error=stream_idle_timeout(provider, endpoint, limits.stream_idle_s)
            + "; agenthost stopped the provider's runtime",
        )

    def _state_for_event(self, turn_id: str) -> TurnState | None:
        state = self._turns.get(turn_id)
        if state is not None:
            return state
        # An event for a Turn this actor did not start (e.g. the actor idled out and came
        # back while a trailing binding event was in flight): rebuild from the store.
        try:
            turn = self._core.session_store.turns.get_turn(self._core.ws, self._core.sid, turn_id)
        except HostError:
            return None
        state = TurnState(turn_id, provider_turn_id=turn.root_provider_turn_id)
        # It sends events: the provider has it, so its `turn.start` was sent (never host-only,
        # even while the store holds no provider turn id for it).
        state.at_provider = state.start_maybe_sent = True
        state.settled = state.settling = turn.phase == "settled"
        return state

    def _binding_moved(self, state: TurnState, binding_json: str) -> None:
        """A `turn.binding` (alone, or carried by its `turn.started`): queued even once the Turn
        settles (a late checkpoint)."""
        self._writes.enqueue(self._writes.binding_write(state.turn_id, binding_json))
        if not state.settling and not state.start_unanswered:
            # Heard after the start's answer (the answer can overtake the event): it waits
            # for the Turn's next write as the start's writes do, not alone.
            self._writes.linger(START_LINGER_S)

    def on_driver_event(self, event: TurnEvent) -> None:
        turn_id = event.turn_id
        state = self._state_for_event(turn_id)
        if state is None:
            log.warning("session %s: event for unknown turn %r", self._core.key, turn_id)
            return
        state.last_activity = time.monotonic()
        self._follow_model(state, event)
        if isinstance(event, TurnActivity):
            return  # a reply streams, the provider retries, a tool runs: nothing to store
        store, ws, sid = self._core.session_store, self._core.ws, self._core.sid
        if isinstance(event, TurnBindingMoved):
            # A trailing system message may move the checkpoint after settlement (Claude).
            self._binding_moved(state, event.binding_json)
            return
        if isinstance(event, TurnStarted) and event.binding_json is not None:
            # The start carrying its binding: exactly `turn.started`, then `turn.binding`.
            self._bind(state, event.provider_turn_id)  # (a no-op once settling)
            self._binding_moved(state, event.binding_json)
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
                    message = store.history.append_message(
                        ws, sid, turn_id, kind=item_kind, text=text, payload=payload
                    )
                    if item_kind == "assistant":
                        state.last_assistant_message_id = message.message_id
                    if state.image is not None:
                        # Built from what was inserted (a new id: a new Message, last).
                        state.image = turn_with_message(state.image, message)

                self._writes.enqueue(
                    DurableWrite(
                        turn_id,
                        f"{item_kind} message",
                        _append,
                        message=NewMessage("", item_kind, text, payload or {}),
                    )
                )
                if item_kind == "assistant":
                    # Most often the Turn's reply, its completion a few milliseconds behind:
                    # the Message waits for the settlement and both land as one transaction.
                    self._writes.linger(ASSISTANT_LINGER_S)
            case InteractionRequested(request_id=request_id, kind=ikind):
                payload = dict(event.input)
                state.image = None  # its Interactions' states are read back, not followed
                self._writes.enqueue(
                    DurableWrite(
                        turn_id,
                        "interaction",
                        lambda: store.history.open_interaction(
                            ws, sid, turn_id, request_id=request_id, kind=ikind, input=payload
                        ),
                    )
                )
            case TurnCompleted():
                self._bind(state, event.provider_turn_id)
                error = event.error
                if event.outcome == "interrupted" and state.interrupted_why:
                    error = state.interrupted_why  # who stopped it says more than the provider
                self.settle(state, event.outcome, error=error)
            case _:
                log.warning("session %s: unknown driver event %r", self._core.key, event.TYPE)

    def on_runtime_lost(self, msg: RuntimeLost) -> None:
        """No event will ever settle a Turn whose provider process died: settle it here."""
        if not self._turns or self._core.session().provider != msg.provider:
            return
        for state in list(self._turns.values()):
            if state.provider_turn_id is not None:
                self.settle(state, "failed", error=f"provider worker lost: {msg.reason}")


def turn_bound(turn: Turn, root: str | None, binding: str | None) -> Turn:
    """`turn` with the provider turn id `root` and/or the binding JSON `binding` a write of it
    applied (None: kept): `dataclasses.replace` without its walk of the fields (a binding's
    write may be applied, and this image updated, inside the writer's baton).
    `tests/storage/test_turn_statements.py` pins it equal to `replace`."""
    t = turn
    return Turn(
        t.workspace_id, t.session_id, t.turn_id, t.sequence, t.sequence_provenance, t.phase,
        t.outcome, t.root_provider_turn_id if root is None else root,
        t.provider_turn_binding_json if binding is None else binding,
        t.final_assistant_message_id, t.error, t.created_at_ms, t.settled_at_ms,
        t.messages, t.interactions, t.checkpoint_json, t.host_only,
    )  # fmt: skip


def turn_with_message(turn: Turn, message: Message) -> Turn:
    """`turn` with `message` appended to its Messages: `dataclasses.replace(turn, messages=…)`
    without its walk of the fields (the Session actor's image of its Turn, updated inside the
    writer's baton by each Message write of a batch). `tests/storage/test_turn_statements.py`
    pins it equal to `replace` with every field set."""
    t = turn
    return Turn(
        t.workspace_id, t.session_id, t.turn_id, t.sequence, t.sequence_provenance, t.phase,
        t.outcome, t.root_provider_turn_id, t.provider_turn_binding_json,
        t.final_assistant_message_id, t.error, t.created_at_ms, t.settled_at_ms,
        (*t.messages, message), t.interactions, t.checkpoint_json, t.host_only,
    )  # fmt: skip


def _answered_first_byte(state: TurnState) -> None:
    """Cancel the Turn's first-byte backstop timer (`TurnState.first_byte`), if armed."""
    if state.first_byte is not None:
        state.first_byte.cancel()
        state.first_byte = None


def _bound_of(taken: list[DurableWrite]) -> TurnBound:
    """What a Turn's queued bind and binding writes would have left, in queue order: the first
    provider turn id (a later different one would have met `Conflict`), the newest binding."""
    root: str | None = None
    binding: str | None = None
    for item in taken:
        if item.bound is None:
            continue
        if root is None:
            root = item.bound.root_provider_turn_id
        if item.bound.binding_json is not None:
            binding = item.bound.binding_json
    return TurnBound(root_provider_turn_id=root, binding_json=binding)


def _capture_of(fut: Future[Capture]) -> Capture | None:
    """A capture's answer; None for one cancelled (its bound fired first, or the daemon is
    closing)."""
    return None if fut.cancelled() else fut.result()


def _timed_out(cwd: str, which: str, bound: float) -> Capture:
    return Capture.missing(
        cwd,
        "timed_out",
        f"the {which} checkpoint of {cwd} took longer than {bound:g} s ([workspace] timeout_s)",
    )
