"""What every part of the Session actor is handed: the Session's identity and its thread hops.

`SessionCore` names the Session (workspace, id, runtime key), its store port and context, and
the two ways back onto the actor's own thread (`later` for a worker answer, `after` for a
timer); the record types its parts pass each other (`TurnState`, `DurableWrite`) live here too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pykka

from actors.checkpoints import Capture
from actors.context import HostContext, runtime_key
from actors.messages import FollowUp
from actors.pool import TimerHandle
from actors.store_ports import SessionActorStore
from domain.errors import HostError, Unavailable
from storage.models import NewMessage, Session, Turn, TurnBound

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
    last_activity: float = field(default_factory=time.monotonic)
    watchdog: TimerHandle | None = None
    # turn.start was sent: only from then does the inactivity limit run. Before, the Turn
    # waits for a runtime slot (no limit: it is queued, not hung) or for its runtime's start
    # (`session.start`, with its own timeout).
    at_provider: bool = False
    # A `turn.start` of it may have reached the provider: set as one is handed to the worker
    # link, cleared when the link answers "not sent" (`NotDelivered`) or the worker refused it
    # before the provider (`RuntimeChanged`). A Turn settled without it is host-only (schema
    # v24): the provider's thread provably holds no Turn for it.
    start_maybe_sent: bool = False
    # Its `turn.start` is sent and not yet answered: the start's events (binding) arrive
    # before the answer, and their writes wait for it to land as one transaction.
    start_unanswered: bool = False
    # What waits for that answer: an interrupt that came while the provider's turn id was not
    # known yet (it is sent to the provider once the answer names the turn).
    after_start_answer: list[Callable[[], None]] = field(default_factory=list)
    # When turn.start was last sent, and whether the model has answered since (an item, a
    # delta, an interaction or the end): the host's first-byte backstop runs until it has.
    model_asked_at: float | None = None
    model_answered: bool = False
    # That backstop's timer, cancelled once the model answered or the Turn is forgotten: left
    # armed, it would fire ~30 s later into an actor message that does nothing, holding this
    # state until then.
    first_byte: TimerHandle | None = None
    # When the model last streamed a piece of its reply, while it is in the middle of one
    # (None: not mid-stream — not begun, an item finished, a tool running, an Interaction
    # waiting, the provider retrying); the host's stream-idle backstop runs from it.
    streamed_at: float | None = None
    stream_timer: TimerHandle | None = None
    # The Session's provider, once the Turn is at it (whose model limits apply).
    provider: str | None = None
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
    # The Turn exactly as the store holds it: its claim's row with each of this actor's
    # writes of it applied (its only writer while it is active), handed to the settlement,
    # whose event then carries the settled Turn. None once it cannot be known without a
    # read (an Interaction opened); `image_losses`: `TurnWrites.losses` when it was taken (a
    # batch lost since may have taken applied writes back with it).
    image: Turn | None = None
    image_losses: int = 0


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
    # A write that only sets the Turn's provider bind or binding: a settlement of its Turn
    # queued behind it writes it in its own statement instead (`TurnWrites.take_bound`).
    bound: TurnBound | None = None
    # A write that only appends a new Message to the Turn: a settlement of its Turn queued
    # behind it inserts it itself (`TurnWrites.take_bound`), its id chosen then.
    message: NewMessage | None = None


class SessionCore:
    """One Session as its actor's parts see it; holds no mutable state of its own, so each part
    (runtime, durable writes, turns, controls) owns its state alone."""

    def __init__(
        self,
        ctx: HostContext,
        workspace_id: str,
        session_id: str,
        actor_ref: pykka.ActorRef[Any],
    ) -> None:
        self.ctx = ctx
        # The Session's own view of the store (its turns, interactions, runtime record); the
        # fork saga and fork.resolve get theirs through the `ForkHost` port.
        self.session_store: SessionActorStore = ctx.store
        self.ws = workspace_id
        self.sid = session_id
        self.key = runtime_key(workspace_id, session_id)
        self.actor_ref = actor_ref

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
        return self.session_store.sessions.get_session(self.ws, self.sid)

    def active_turn(self) -> Turn | None:
        return self.session_store.turns.active_turn(self.ws, self.sid)
