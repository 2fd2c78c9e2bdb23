"""The Session actor's state and its thread hops: what every concern of `SessionActor` shares.

`SessionActorBase` holds one Session's live bookkeeping (its Turns in flight, the queue of
their durable writes, its runtime slot) and the two ways back onto the actor's own thread
(`later` for a worker answer, `after` for a timer). The concerns built on it:
`actors/session_runtime.py` (the provider runtime), `actors/turn_writes.py` (a Turn's durable
writes), `actors/session_turns.py` (running a Turn), `actors/session_controls.py` (the
client's controls); `actors/session_actor.py` composes them into `SessionActor`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pykka

from actors.checkpoints import Capture
from actors.context import HostContext
from actors.messages import FollowUp, runtime_key
from actors.pool import PooledActor
from actors.store_ports import SessionActorStore
from actors.timers import TimerHandle
from domain.worker_messages import TurnEvent
from storage.errors import HostError, Unavailable
from storage.models import Session, Turn

# One logger for every concern of the Session actor (operators filter on it).
log = logging.getLogger("actors.session_actor")
T = TypeVar("T")

# Backoff of a Turn's durable writes while the store is busy or full.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class RetryDurable:
    """Timer tick: retry the Session's queued durable writes."""


@dataclass
class TurnState:
    """What the Session actor knows of one Turn it runs, until the Turn is settled."""

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
    # (`session.start`, with its own timeout).
    at_provider: bool = False
    # When turn.start was last sent, and whether the model has answered since (an item, a
    # delta, an interaction or the end): the host's first-byte backstop runs until it has.
    model_asked_at: float | None = None
    model_answered: bool = False
    # Who interrupted it and why, once someone did: the provider's end of the Turn says only
    # that it was interrupted.
    interrupted_why: str | None = None
    # Workspace checkpoints (actors/checkpoints.py): the directory captured, the `before`
    # and `after` captures once answered, and what waits for `before` (the provider's start,
    # the `after` capture) while it is taken.
    cwd: str | None = None
    before: Capture | None = None
    after: Capture | None = None
    before_pending: bool = False
    after_before: list[Callable[[], None]] = field(default_factory=list)
    # While the `after` checkpoint is taken (the settlement not yet queued): who else asked
    # for the settlement (an interrupt), answered when it lands.
    awaiting_after: bool = False
    settle_waiters: list[Callable[[HostError | None], None]] = field(default_factory=list)


@dataclass(eq=False)
class DurableWrite:
    """One durable write owed to a Turn (a driver event applied, a binding, a settlement),
    retried in order while the store is busy or full."""

    turn_id: str
    what: str
    apply: Callable[[], object]
    # A settlement is never given up on: it is retried until it lands.
    final: bool = False
    first_failure: float | None = None
    then: Callable[[HostError | None], None] | None = None
    # Run once the write is durable (its COMMIT returned), before `then`.
    landed: Callable[[], None] | None = None


class SessionActorBase(PooledActor):
    """One Session's state; the concerns are mixed in by `actors.session_actor.SessionActor`."""

    def __init__(
        self,
        ctx: HostContext,
        workspace_id: str,
        session_id: str,
        predecessor: pykka.Future[Any] | None = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        # The Session's own view of the store (its turns, interactions, runtime record); the
        # fork saga and fork.resolve get theirs through the `ForkHost` port.
        self.session_store: SessionActorStore = ctx.store
        self.actor_pool = ctx.actor_pool
        self.ws = workspace_id
        self.sid = session_id
        self.key = runtime_key(workspace_id, session_id)
        # A previous actor for this Session may still drain its mailbox: start after it, so
        # the Session's writes stay serialised across an idle stop and a restart.
        self.wait_for(predecessor)
        self._turns: dict[str, TurnState] = {}
        # turn id → binding JSON of a late `turn.binding` that arrived while a fork fenced the
        # source (seed 000 §7 Claude 3): applied as soon as the fence is released.
        self._late_bindings: dict[str, str] = {}
        self._busy = False
        # Runtime slot: held while preparing or busy, released when neither.
        self._preparing = 0
        self._slot_provider: str | None = None
        self._durable: deque[DurableWrite] = deque()
        # True while the message being handled is followed by a driver event already queued:
        # its durable writes wait for that event's, and all land in one transaction.
        self._hold_durable = False
        self._retry_timer: TimerHandle | None = None
        # `after` checkpoints being taken: the Turn's trailing writes wait for its settlement
        # (which carries the checkpoint), so they still land as one transaction.
        self._capture_holds = 0
        self._retry_delay = RETRY_FIRST_S

    # -- helpers used by the saga ----------------------------------------------------------

    def later(
        self,
        future: Future[T],
        on_done: Callable[[Future[T]], None],
        reply: Callable[[Any], None] | None = None,
        *,
        turn_event: bool = False,
    ) -> None:
        """Continue on this actor's thread when `future` completes; `reply` is the reply the
        continuation owes, answered with a typed error if the continuation raises;
        `turn_event`: see `FollowUp.turn_event`."""
        ref = self.actor_ref

        def _done(f: Future[T]) -> None:
            try:
                ref.tell(FollowUp(lambda: on_done(f), reply, turn_event))
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

        return self.ctx.actor_pool.call_later(seconds, _fire)

    def session(self) -> Session:
        return self.session_store.get_session(self.ws, self.sid)

    def active_turn(self) -> Turn | None:
        return self.session_store.active_turn(self.ws, self.sid)
