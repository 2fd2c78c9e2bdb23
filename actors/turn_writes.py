"""A Turn's durable writes, in order, retried.

One concern: every write a Turn owes the store (a driver event applied, a binding, its
settlement) goes through one queue per Session, applied in order; a busy or full store stops
the queue and a timer retries it with backoff, so no event is dropped and none overtakes
another. A late `turn.binding` that meets a fork fence is kept aside and
applied when the fence is released (seed 000 §7 Claude 3).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

import pykka

from actors.pool import TimerHandle
from actors.session_base import (
    RETRY_FIRST_S,
    RETRY_MAX_S,
    DurableWrite,
    RetryDurable,
    SessionCore,
)
from domain.errors import ForkInProgress, HostError, StoreBusy
from storage.models import TurnBound
from storage.sqlite import host_error_of

# One logger for every concern of the Session actor (operators filter on it).
log = logging.getLogger("actors.session_actor")


class TurnWrites:
    """The Session's queue of durable Turn writes. `give_up`: what replaces a Turn's writes
    once the store stayed unwritable past the limit (the Turn runner settles it `failed`)."""

    def __init__(
        self,
        core: SessionCore,
        *,
        give_up: Callable[[DurableWrite, StoreBusy], None],
    ) -> None:
        self._core = core
        self._give_up = give_up
        self._durable: deque[DurableWrite] = deque()
        # True while the message being handled is followed by a driver event already queued:
        # its durable writes wait for that event's, and all land in one transaction.
        self.hold = False
        self._retry_timer: TimerHandle | None = None
        # `after` checkpoints being taken: the Turn's trailing writes wait for its settlement
        # (which carries the checkpoint), so they still land as one transaction.
        self._capture_holds = 0
        self._retry_delay = RETRY_FIRST_S
        # turn id → binding JSON of a late `turn.binding` that arrived while a fork fenced the
        # source (seed 000 §7 Claude 3): applied as soon as the fence is released.
        self._late_bindings: dict[str, str] = {}
        # While set, the queued writes wait for the next one, within its bound (`linger`).
        self._linger: TimerHandle | None = None
        self.losses = 0
        """Batches whose transaction or COMMIT was lost after some of their writes were
        applied: a Turn's image taken before one (`TurnState.image`) is no longer known."""
        self._draining = False
        self.binding_recorded: Callable[[str, str], None] | None = None
        """Told (turn id, binding JSON) after each `turn.binding` write applied."""

    def __len__(self) -> int:
        """Writes queued and not yet durable."""
        return len(self._durable)

    @property
    def late_bindings_pending(self) -> bool:
        return bool(self._late_bindings)

    def drain_if_due(self) -> None:
        """Apply what earlier messages held back, unless a retry or a checkpoint waits."""
        if self._durable and self._retry_timer is None:
            self.drain()

    def retry(self) -> None:
        """The retry timer fired (`RetryDurable`)."""
        self._retry_timer = None
        self.drain()

    def cancel(self) -> None:
        """The actor stops: no retry fires after it."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._end_linger()

    def linger(self, seconds: float) -> None:
        """The writes queued so far may wait up to `seconds` for the next write: a Turn's
        assistant Message for its settlement, which most often follows within milliseconds
        (an app-server sends `turn/completed` right after the reply's `item/completed`), so the
        two land in one transaction (one COMMIT, one `turn.updated`). The wait ends with the
        next write queued, the bound, or any message that does not join the Turn's burst (it
        drains the queue before it runs, as always: nothing else ever finds them pending)."""
        if self._linger is None and self._durable:
            self._linger = self._core.after(seconds, self._linger_over)

    @property
    def lingering(self) -> bool:
        """The queued writes wait for the next one (`linger`)."""
        return self._linger is not None

    def _linger_over(self) -> None:
        self._linger = None
        self.drain_if_due()

    def _end_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def hold_for_capture(self) -> None:
        """An `after` checkpoint is being taken: queued writes wait for its settlement."""
        self._capture_holds += 1

    def release_capture(self) -> None:
        self._capture_holds -= 1

    def capture_released(self) -> None:
        """The settlement of a captured Turn is queued: apply what waited for it."""
        if not self._capture_holds:
            self.drain_if_due()

    def drop_turn(self, turn_id: str) -> list[DurableWrite]:
        """Take every queued write of `turn_id` off the queue and return them."""
        dropped = [d for d in self._durable if d.turn_id == turn_id]
        self._durable = deque(d for d in self._durable if d.turn_id != turn_id)
        return dropped

    def push_front(self, item: DurableWrite) -> None:
        """Queue `item` ahead of every other write (a given-up Turn's settlement)."""
        self._durable.appendleft(item)

    def binding_write(self, turn_id: str, binding: str) -> DurableWrite:
        """The queued write of one `turn.binding`; one that meets a fork fence is kept in
        `_late_bindings` instead of failing (seed 000 §7 Claude 3)."""
        store, ws, sid = self._core.session_store, self._core.ws, self._core.sid

        def _apply() -> None:
            try:
                store.turns.record_turn_binding(ws, sid, turn_id, binding)
            except ForkInProgress:
                # A fork froze the source: the operation keeps the binding it froze, and this
                # provider fact is applied when the fence is released — never lost.
                log.info("session %s: turn %s binding deferred by a fork", self._core.key, turn_id)
                self._late_bindings[turn_id] = binding
                return
            self._late_bindings.pop(turn_id, None)  # newer than any deferred one
            if self.binding_recorded is not None:
                self.binding_recorded(turn_id, binding)

        return DurableWrite(turn_id, "turn binding", _apply, bound=TurnBound(binding_json=binding))

    def take_bound(self, turn_id: str) -> list[DurableWrite]:
        """Take `turn_id`'s queued provider bind and binding writes off the queue, for its
        settlement, queued next, to write in its own statement (one savepoint, fence check and
        Turn row read each fewer); answer them with `bound_landed` once it lands. When every
        queued write of the Turn is such a write or a new Message's (`DurableWrite.message`:
        its reply), the Messages are taken too, for the settlement to insert first (one
        savepoint, fence check, liveness check and Turn row read each fewer). Nothing while
        the queue is being applied (its writes are in hand)."""
        if self._draining:
            return []
        mine = [d for d in self._durable if d.turn_id == turn_id]
        whole = all(d.bound is not None or d.message is not None for d in mine)
        taken = [d for d in mine if d.bound is not None or (whole and d.message is not None)]
        if taken:
            out = {id(d) for d in taken}
            self._durable = deque(d for d in self._durable if id(d) not in out)
        return taken

    def bound_landed(self, taken: list[DurableWrite]) -> None:
        """The settlement that wrote `taken` (`take_bound`) is durable: what each of them
        does once it lands (their `then`s are answered with the settlement's)."""
        for item in taken:
            if item.bound is not None and item.bound.binding_json is not None:
                self._late_bindings.pop(item.turn_id, None)  # newer than any deferred one
            if item.landed is not None:
                item.landed()

    def apply_late_bindings(self) -> None:
        """Queue the `turn.binding` checkpoints deferred by a fork fence; called when a fork
        operation of this source ends (still fenced by another one → deferred again)."""
        late, self._late_bindings = self._late_bindings, {}
        for turn_id, binding in late.items():
            self.enqueue(self.binding_write(turn_id, binding))

    # -- durable writes, in order, retried -------------------------------------------------

    def enqueue(self, item: DurableWrite) -> None:
        self._end_linger()  # what the queued writes waited for
        self._durable.append(item)
        if len(self._durable) == 1 and self._retry_timer is None and not self.hold:
            self.drain()

    def drain(self) -> None:
        """Apply the queued writes in order; a busy or full store stops the queue and a timer
        retries it with backoff, so no event is dropped and none overtakes another. Several
        queued writes are applied as one store transaction (`Store.write_batch`). Held while
        a Turn's `after` checkpoint is taken (actors/session_turns.py `capture_after`)."""
        if self._capture_holds or self._draining:
            return
        self._end_linger()
        self._draining = True
        try:
            self._drain()
        finally:
            self._draining = False

    def _drain(self) -> None:
        while self._durable:
            if len(self._durable) > 1:
                if not self._drain_batch():
                    return
                continue
            item = self._durable[0]
            try:
                item.apply()
            except StoreBusy as exc:
                if self._stalled(item, exc):
                    continue
                return
            except Exception as exc:  # noqa: BLE001 - one bad write must not stop the queue
                self._durable.popleft()
                self._failed(item, exc)
                continue
            self._durable.popleft()
            self._landed(item)

    def _drain_batch(self) -> bool:
        """Apply every queued write inside one `write_batch` (one baton turn, one COMMIT);
        False if the queue stopped on a busy or full store (a retry is scheduled). A write
        that fails on its own is rolled back alone and answered as in `drain`; a write that
        meets a busy store ends the batch there (the ones before it land, it is retried)."""
        items = list(self._durable)
        applied: list[tuple[DurableWrite, BaseException | None]] = []
        busy: StoreBusy | None = None
        try:
            with self._core.session_store.db.write_batch():
                for item in items:
                    try:
                        item.apply()
                    except StoreBusy as exc:
                        busy = exc
                        break
                    except Exception as exc:  # noqa: BLE001 - answered after the COMMIT
                        applied.append((item, exc))
                        continue
                    applied.append((item, None))
        except StoreBusy as exc:
            # The batch's transaction or its COMMIT was lost: none of it exists. The head
            # write stalls the queue exactly as if it had failed alone.
            self.losses += 1
            return self._stalled(items[0], exc)
        except Exception as exc:  # noqa: BLE001 - e.g. the batch could not even begin
            self.losses += 1
            return self._stalled(items[0], StoreBusy(f"the store failed a batch: {exc}"))
        for item, outcome in applied:
            self._durable.popleft()
            if outcome is None:
                self._landed(item)
            else:
                self._failed(item, outcome)
        if busy is not None:
            return self._stalled(self._durable[0], busy)
        return True

    def _landed(self, item: DurableWrite) -> None:
        self._retry_delay = RETRY_FIRST_S
        if item.landed is not None:
            item.landed()
        if item.then is not None:
            item.then(None)

    def _failed(self, item: DurableWrite, exc: BaseException) -> None:
        if isinstance(exc, HostError):
            log.warning("session %s: %s failed: %s", self._core.key, item.what, exc.message)
            error = exc
        else:
            error = host_error_of(exc, f"session {self._core.key}: {item.what}", logger=log)
        if item.then is not None:
            item.then(error)

    def _stalled(self, item: DurableWrite, exc: StoreBusy) -> bool:
        """`item` (the queue's head) met a busy or full store: True if the Turn's writes were
        given up on (the queue goes on), else False with a retry scheduled."""
        now = time.monotonic()
        limit = self._core.ctx.timeouts.store_retry_limit_s
        if item.first_failure is None:
            item.first_failure = now
            log.warning("session %s: %s deferred: %s", self._core.key, item.what, exc.message)
        elif not item.final and now - item.first_failure > limit:
            self._give_up(item, exc)
            return True
        if item.then is not None:
            # The caller waiting on this write learns it is not durable yet; the write
            # itself stays queued.
            then, item.then = item.then, None
            then(exc)
        self._schedule_retry()
        return False

    def _schedule_retry(self) -> None:
        if self._retry_timer is not None:
            return
        delay = self._retry_delay
        self._retry_delay = min(RETRY_MAX_S, delay * 2)
        ref = self._core.actor_ref

        def _fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(RetryDurable())

        self._retry_timer = self._core.ctx.actor_pool.call_later(delay, _fire)
