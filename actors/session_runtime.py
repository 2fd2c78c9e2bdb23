"""Provider runtimes: a Session's runtime's lifecycle in the worker, and the host's slots that
bound how many are live (`RuntimeSlots`).

One concern: taking a runtime slot, starting (or reusing) the runtime with `session.start`
and recording what it reports, re-binding settled Turns from the provider's own history,
and stopping the runtime (`SessionRuntime`, one per Session actor). Turns and fork sagas both
prepare their runtime here (`prepare_runtime` is part of the `ForkHost` port).

The slots (`RuntimeSlots`, one per daemon, handed to every actor through `HostContext` as the
`actors.ports.RuntimeSlotsPort`): at most N live provider runtimes per provider.

200 Sessions each starting a turn at once meant 200 app-servers starting at once in one
worker: the machine thrashed, heartbeats went silent and the worker was killed over and over.
A Session takes its provider's slot before its runtime is prepared and holds it while it has
a turn or fork in progress; then the slot stays *idle* (the runtime stays warm) until another
Session needs it, which stops the least-recently-used idle runtime first. When every slot
holds a busy runtime, the next Session waits in FIFO order (its Turn is accepted and stays
`active` meanwhile; it is not refused). The choice — queue, not 503 — is documented in
docs/user-guide.md ("Many Sessions at once").

Starting a runtime (spawning an app-server) is the expensive step: 64 of them started at once
on 2 cores all finished late together, past the provider's start timeouts, and failed their
turns. A Session whose runtime is not live (a *cold* grant) therefore also needs one of
`start_limit` start permits, held until `started()`; the waiting is done here, in the FIFO
queue, where no clock runs against the Turn — only the start itself is timed.

Forks get their own share of the slots (`fork_limit`, a quarter fewer than `limit`): a fork
can sit in a slow provider call for minutes, and when forks could hold every slot, each cold
one evicted an idle warm runtime and that Session's next Turn queued behind all of them. A
fork that needs a new slot while the forks' share is full waits, without holding back the
Turns queued after it; a fork on a runtime already in its slot takes nothing new.

Thread-safe; callbacks run outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pykka

from actors.fork_host import PreparedRuntime
from actors.fork_saga import attestation_key
from actors.messages import FollowUp
from actors.provider_errors import provider_error
from actors.rebind import CanonicalTurn, match_missing, prove_absent
from actors.session_base import SessionCore
from domain.errors import HostError, SessionNotFound
from domain.procfs import alive_in_stat, pid_exists, read_proc_stat
from domain.worker_messages import (
    HistoryRequest,
    SessionHistory,
    SessionStart,
    SessionStarted,
    SessionStop,
)
from storage.models import Session, TurnPhase
from storage.sqlite import host_error_of

# One logger for every concern of the Session actor (operators filter on it).
log = logging.getLogger("actors.session_actor")


def process_alive(pid: int) -> bool:
    """Whether `pid` is a running process (not gone, not a zombie, not exiting, no SIGKILL
    waiting for it): the host's check that a runtime the worker named is still there, without
    a round trip. A process killed a moment ago is dead here from the moment its
    SIGKILL is pending, so the next fork or Turn on it takes the cold path instead of being
    refused by the worker — all but the kernel's own instant between taking the signal and
    marking the task exiting (a fork then is refused safely: `failed`, no child)."""
    try:
        stat = read_proc_stat(pid)
    except FileNotFoundError:
        return False
    except OSError:
        return pid_exists(pid)
    return alive_in_stat(stat)


def runtime_alive(runtime: PreparedRuntime) -> bool:
    """Whether a warm runtime's processes are all still there: the runtime's own (the
    app-server) and the worker it lives in or under. A worker killed a moment ago has its
    SIGKILL pending before its app-server takes the parent-death signal, so its pid is what
    makes the runtime gone to the host at once."""
    return all(pid is None or process_alive(pid) for pid in (runtime.pid, runtime.worker_pid))


class SessionRuntime:
    """Prepares, re-binds and stops the Session's provider runtime; owns its runtime slot, the
    warm runtime of the fork and Turn fast paths, and the Session row cache."""

    def __init__(self, core: SessionCore) -> None:
        self._core = core
        # The fork fast path: the runtime the last `session.start` reported with a
        # generation, and when (monotonic).
        self._warm: tuple[PreparedRuntime, float] | None = None
        # The worker that ran the runtime this actor last prepared (its pid), kept past the
        # warm runtime's end: a stop is not sent once that worker is gone (`stop_runtime`).
        self._runtime_worker_pid: int | None = None
        # The Session row as this actor last read or wrote it, emptied by every message that
        # may change what it is read for (`forget_row`, called by the SessionActor).
        self._session_row: Session | None = None
        # The runtime this Session's last passed fork re-attestation proved.
        self.attested_runtime: tuple[str, ...] | None = None
        # True: no settled `completed` Turn of the Session lacks its provider binding, as the
        # store last answered (`turns_missing_binding`, asked once: at the actor's first
        # runtime start or warm Turn) and as this actor's own writes kept it since — the
        # Session's Turns are settled and bound only here (startup recovery settles before
        # any actor runs, and only `interrupted`). False: ask the store, which a Turn this
        # actor settles `completed` without a durable binding, a binding write that did not
        # land, a re-bind and any plain mutation all bring back.
        self._all_bound = False
        # True once a Turn of the Session is known bound to its provider (the store asked
        # at the first Turn start, or this actor's own bind write landed): the provider then
        # holds a history the Session's next Turn must resume, never start afresh. A bound
        # Turn stays bound, so True is kept.
        self._bound_history = False
        # The provider's id of the Session's last Turn bound and settled `completed` (its
        # end the provider's history must still hold: `bound_turn_id`), once asked of the
        # store (`_bound_turn_asked`) or settled by this actor; None: none such.
        self._bound_turn: str | None = None
        self._bound_turn_asked = False
        # False until this actor's first re-bind check has also asked for settled Turns that
        # are not `completed` and unbound (a kill mid-Turn leaves one when its bind was still
        # queued, or one its provider never got): asked on the cold path only
        # (`_rebind_missing`), once per actor, and again after this actor settles such a Turn
        # itself or a history came back not final.
        self._unanswered_asked = False
        # Runtime slot: held while preparing or busy, released when neither.
        self.preparing = 0
        self._slot_provider: str | None = None
        # What waits for every runtime preparation in progress to end (a delete's stop of the
        # runtime a Turn's start makes, `SessionControls.on_mutate`): run, in order, on this
        # actor's thread right after the last one's answer was handed on.
        self.after_preparing: list[Callable[[], None]] = []
        # Of the preparations in progress: the forks' (`fork.create`), and those still queued
        # for their slot (nothing started yet). A delete meets the former at once, as their
        # fence would meet it, and does not wait for the latter (`SessionControls.on_mutate`).
        self.forks_preparing = 0
        self.slot_waits = 0
        # The Session was deleted (committed): a preparation granted its slot after that starts
        # nothing, and one in `session.start` then has its answer discarded, each answered as
        # for a Session that is gone.
        self.gone = False

    def forget_row(self) -> None:
        self._session_row = None

    def release_slot_if_idle(self, busy: bool) -> None:
        """Give the provider's runtime slot back once the Session has nothing in progress."""
        if not busy and self.preparing == 0 and self._slot_provider is not None:
            self._core.ctx.runtime_slots.release(self._slot_provider, self._core.key)
            self._slot_provider = None

    def cached_session(self) -> Session:
        """The Session row as this actor last read or wrote it, for what a runtime's start
        and a fork's start read of it: the Session's provider, folder, settings, model,
        provider session id and runtime context (and its identity, kind and lineage), which
        only a plain mutation, the runtime's own record and `fork.resolve` write. A Turn's
        claim and settlement move its `active_turn_id` and `updated_at_ms` without emptying
        it: read those with `SessionCore.session`, never from here."""
        row = self._session_row
        if row is None:
            row = self._session_row = self._core.session()
        return row

    def forget_warm_runtime(self) -> None:
        self._warm = None

    def warm_runtime(self, session: Session) -> PreparedRuntime | None:
        """The fork's warm runtime (`ForkHost.warm_runtime`): one its Session's last fork
        attested, else None."""
        return self._hold_warm(session, attested=True)

    def warm_turn_runtime(
        self, session: Session, *, unbound: bool | None = None
    ) -> PreparedRuntime | None:
        """The runtime a Turn may start on without `session.start`: the
        one the last `session.start` reported, under the same rules as a fork's, unattested
        (a Turn needs no fork verdict); None while a settled Turn of the Session lacks its
        provider binding, so the cold path's re-bind from the provider's history runs first.
        The Turn's `turn.start` carries the generation: the worker refuses it, before the
        provider sees anything, if another runtime is live by then. `unbound`: that answer
        (`settled_turn_unbound`), when the caller read it already."""
        if self._warm is None:
            return None
        if unbound is None:
            unbound = self.settled_turn_unbound()
        if unbound:
            return None
        return self._hold_warm(session, attested=False)

    def settled_turn_unbound(self) -> bool:
        """Whether a settled Turn of the Session lacks its provider binding (or the store
        cannot say): no Turn starts warm then. Nothing to ask while no runtime is warm."""
        if self._warm is None:
            return True
        try:
            return bool(self._missing_bindings())
        except HostError:
            return True

    def _missing_bindings(self) -> list[str]:
        """The settled `completed` Turns without their provider binding, in sequence order:
        none while this actor knows every one bound (`_all_bound`), else the store's answer,
        which it then keeps."""
        if self._all_bound:
            return []
        missing = self._core.session_store.turns.turns_missing_binding(
            self._core.ws, self._core.sid
        )
        self._all_bound = not missing
        return missing

    def turn_settled(
        self, outcome: str, provider_turn_id: str | None, *, host_only: bool = False
    ) -> None:
        """A Turn's settlement is written here: a `completed` one without its provider binding
        is what the re-bind looks for, so the store is asked again; an unanswered one (not
        marked host-only) is asked about at the next cold start's re-bind, whose final
        history may prove it never reached the provider."""
        if outcome == "completed" and not provider_turn_id:
            self._all_bound = False
        elif not provider_turn_id and not host_only:
            self._unanswered_asked = False

    def binding_written(self, error: HostError | None) -> None:
        """A Turn's provider-binding write answered: one that did not land (failed, or
        deferred by a busy store and perhaps given up on) may leave its Turn unbound, so the
        store is asked again."""
        if error is not None:
            self._all_bound = False
        else:
            self._bound_history = True

    def bound_history(self) -> bool:
        """Whether a Turn of the Session is bound to its provider (its history holds it): the
        store is asked until it says so or this actor's own bind lands. A store that cannot
        answer: False, the start as it was (the driver alone decides)."""
        if not self._bound_history:
            try:
                self._bound_history = self._core.session_store.turns.has_bound_turn(
                    self._core.ws, self._core.sid
                )
            except HostError:
                return False
        return self._bound_history

    def bound_turn_id(self) -> str | None:
        """The provider's id of the Session's last Turn bound and settled `completed`, whose
        end its provider's history must still hold: the store asked once, then this actor's
        own settlements. A store that cannot answer: None (not checked this time)."""
        if not self._bound_turn_asked:
            try:
                self._bound_turn = self._core.session_store.turns.last_completed_provider_turn(
                    self._core.ws, self._core.sid
                )
            except HostError:
                return None
            self._bound_turn_asked = True
        return self._bound_turn

    def turn_completed(self, provider_turn_id: str) -> None:
        """A Turn of this actor, bound to `provider_turn_id`, settles `completed`."""
        self._bound_turn = provider_turn_id
        self._bound_turn_asked = True

    def forget_bindings(self) -> None:
        """A write this actor cannot see into (a plain mutation) ran: ask the store again."""
        self._bound_turn_asked = False
        self._all_bound = False

    def _hold_warm(self, session: Session, *, attested: bool) -> PreparedRuntime | None:
        warm = self._warm
        if warm is None:
            return None
        runtime, at = warm
        window = self._core.ctx.timeouts.fork_warm_runtime_s
        if runtime.idle_s is not None:
            window = min(window, runtime.idle_s / 2)
        generation = runtime.generation
        if (
            generation is None
            or time.monotonic() - at > window
            or (attested and self.attested_runtime != attestation_key(runtime, generation))
            or session.provider != runtime.provider
            or session.cwd != runtime.cwd
            or dict(session.settings) != dict(runtime.settings)
            or (session.provider_session_id or "") != runtime.provider_session_id
            or dict(session.runtime_context) != dict(runtime.runtime_context)
            or not runtime_alive(runtime)
        ):
            return None
        if not self._core.ctx.runtime_slots.hold_warm(
            session.provider, self._core.key, fork=attested
        ):
            return None  # evicted or lost with its worker: start it again
        self._slot_provider = session.provider
        return runtime

    def prepare_runtime(
        self,
        session: Session,
        on_ready: Callable[[PreparedRuntime | HostError], None],
        *,
        fork: bool = False,
    ) -> None:
        """Take one of the provider's runtime slots (queueing while all are busy; a `fork`
        within the forks' share), then prepare the runtime; the slot is released when the
        Session has nothing in progress."""
        ref = self._core.actor_ref
        self.preparing += 1
        self.forks_preparing += fork
        self.slot_waits += 1
        self._slot_provider = session.provider

        def _ready(runtime: PreparedRuntime | HostError) -> None:
            self.preparing -= 1
            self.forks_preparing -= fork
            self._core.ctx.runtime_slots.started(session.provider, self._core.key)
            try:
                on_ready(runtime)
            finally:
                if self.preparing == 0 and self.after_preparing:
                    waiting, self.after_preparing = self.after_preparing, []
                    for fn in waiting:
                        fn()

        def _prepare_now() -> None:
            self.slot_waits -= 1
            if self.gone:
                # Deleted while this waited for its slot: nothing is started (the delete's
                # runtime directory stays gone), the slot freed at once.
                self._core.ctx.runtime_slots.forget(session.provider, self._core.key)
                _ready(SessionNotFound(f"agent session {self._core.key} was deleted"))
                return
            try:
                self._prepare_runtime_now(session, _ready)
            except Exception as exc:  # noqa: BLE001 - the waiter and the start permit are freed
                if isinstance(exc, HostError):
                    log.exception("session %s: preparing the runtime failed", self._core.key)
                _ready(
                    host_error_of(
                        exc, f"session {self._core.key}: preparing the runtime", logger=log
                    )
                )

        def _granted() -> None:
            try:
                ref.tell(FollowUp(_prepare_now))
            except pykka.ActorDeadError:
                self._core.ctx.runtime_slots.release(session.provider, self._core.key)

        self._core.ctx.runtime_slots.acquire(session.provider, self._core.key, _granted, fork=fork)

    def _prepare_runtime_now(
        self, session: Session, on_ready: Callable[[PreparedRuntime | HostError], None]
    ) -> None:
        """Attach (or reuse) the Session's runtime in its worker: the same preparation for a
        live, a historical and a resumed Session; the result is persisted as runtime context
        so capability projection never has to spawn a process.

        The request is built from the row as cached now, not from the caller's `session`,
        read before its slot wait or its claim: another preparation's answer recorded
        meanwhile (a new Session's provider session id) is what this start must name, or a
        worker replaced in between draws a second id for the Session."""
        session = self.cached_session()
        home = self._core.ctx.runtime_home(self._core.ws, self._core.sid, session.provider)
        home.mkdir(parents=True, exist_ok=True)
        request = SessionStart(
            agent_session_id=self._core.key,
            home=str(home),
            cwd=session.cwd,
            settings=dict(session.settings),
            model=session.model,
            provider_session_id=session.provider_session_id,
            runtime_context=dict(session.runtime_context),
            bound_history=bool(session.provider_session_id) and self.bound_history(),
            bound_turn_id=self.bound_turn_id() if session.provider_session_id else None,
        )
        fut = self._core.ctx.workers.start_session(
            session.provider, request, self._core.ctx.timeouts.session_start_s
        )

        def _done(f: Future[SessionStarted]) -> None:
            # The start itself has ended: its permit goes to the next cold Session now.
            self._core.ctx.runtime_slots.started(session.provider, self._core.key)
            if self.gone:
                # Deleted while it started: its answer is not recorded; the delete stops the
                # runtime it made and removes its home once this has answered.
                on_ready(SessionNotFound(f"agent session {self._core.key} was deleted"))
                return
            try:
                result = f.result()
            except Exception as exc:  # noqa: BLE001 - every failure becomes a typed error
                on_ready(provider_error(exc, "runtime preparation failed"))
                return
            try:
                prepared = _record(result)
            except Exception as exc:  # noqa: BLE001 - the waiter is always answered, typed
                on_ready(host_error_of(exc, f"session {self._core.key}: recording the runtime"))
                return
            self._rebind_missing(prepared, lambda: on_ready(prepared))

        def _record(result: SessionStarted) -> PreparedRuntime:
            provider_session_id = result.provider_session_id
            context = dict(result.runtime_context)
            current = self.cached_session()
            if current.provider_session_id != provider_session_id or dict(
                current.runtime_context
            ) != {**current.runtime_context, **context}:
                current = self._core.session_store.sessions.update_runtime(
                    self._core.ws,
                    self._core.sid,
                    provider_session_id=provider_session_id or None,
                    runtime_context=context,
                )
            self._session_row = current
            prepared = PreparedRuntime(
                provider=current.provider,
                home=str(home),
                cwd=current.cwd,
                settings=dict(current.settings),
                provider_session_id=provider_session_id,
                runtime_context=dict(current.runtime_context),
                generation=result.stamp.generation,
                verdict=context,
                pid=result.stamp.pid,
                idle_s=result.stamp.idle_s,
                worker_pid=result.stamp.worker_pid,
            )
            self._warm = None if prepared.generation is None else (prepared, time.monotonic())
            self._runtime_worker_pid = prepared.worker_pid
            return prepared

        self._core.later(fut, _done)

    def _rebind_missing(self, runtime: PreparedRuntime, then: Callable[[], None]) -> None:
        """Re-bind settled completed Turns whose provider binding was never recorded, from
        the provider's own history (by order and content, fail closed), then continue. Any
        failure here only leaves those Turns unbound, as they were."""
        try:
            missing = self._missing_bindings()
            if not self._unanswered_asked:
                self._unanswered_asked = True
                missing += self._core.session_store.turns.unanswered_turns_missing_binding(
                    self._core.ws, self._core.sid
                )
        except HostError as exc:
            log.warning("session %s: re-bind check failed: %s", self._core.key, exc.message)
            # The store could not say: the next cold start asks about the unanswered Turns.
            self._unanswered_asked = False
            missing = []
        if not missing:
            then()
            return
        fut = self._core.ctx.workers.history(
            runtime.provider,
            HistoryRequest(self._core.key, home=runtime.home),
            self._core.ctx.timeouts.control_s,
        )

        def _done(f: Future[SessionHistory]) -> None:
            try:
                answer = f.result()
                history: list[Mapping[str, Any]] = [t.to_wire() for t in answer.turns]
                if not self._apply_rebind(set(missing), history, final=answer.final):
                    # Not final (a process that may hold a start was still alive: one dying
                    # a moment ago), or no Turn bound yet to tie the history to the thread:
                    # the next cold start asks about the unanswered Turns again.
                    self._unanswered_asked = False
            except Exception as exc:  # noqa: BLE001 - a failed re-bind leaves Turns unbound
                # No history (the worker died, the call timed out, the read raised): the next
                # cold start asks about the unanswered Turns again, as after one not final.
                self._unanswered_asked = False
                log.warning(
                    "session %s: re-bind from provider history failed (no history read; "
                    "asked again at the next cold start): %s",
                    self._core.key,
                    exc,
                )
            then()

        self._core.later(fut, _done)

    def _apply_rebind(
        self, missing: set[str], provider_turns: list[Mapping[str, Any]], *, final: bool = False
    ) -> bool:
        """Bind each missing Turn exactly one provider turn can be (`match_missing`); with a
        `final` history (no process that may hold a start the answering worker never got is
        alive), mark host-only each unanswered one it proves the provider never got
        (`prove_absent`). Whether the history could prove anything absent: final, with a
        Turn bound (False: the unanswered Turns are worth asking about again)."""
        self._session_row = None  # a re-bind writes the Session's Turns (and its row)
        self._all_bound = False  # what it left unbound (fail closed) the store says next time
        turns, _ = self._core.session_store.history.timeline(
            self._core.ws, self._core.sid, after_sequence=0, limit=100_000
        )
        canonical = [
            CanonicalTurn(
                t.turn_id,
                t.root_provider_turn_id,
                next((m.text for m in t.messages if m.kind == "user"), None),
                t.turn_id in missing,
                t.phase == TurnPhase.SETTLED and t.outcome != "completed",
            )
            for t in turns
        ]
        matches = match_missing(canonical, provider_turns)
        absent = prove_absent(canonical, provider_turns, matches) if final else []
        # A provider whose Turns carry a binding JSON (Claude's checkpoint) gives it with
        # its history; one the Turn already holds (its own write landed) is kept.
        bindings = {str(t.get("providerTurnId")): t.get("bindingJson") for t in provider_turns}
        held = {t.turn_id: t.provider_turn_binding_json for t in turns}
        for turn_id, provider_turn_id in matches.items():
            binding = bindings.get(provider_turn_id)
            self._core.session_store.turns.bind_provider_turn(
                self._core.ws,
                self._core.sid,
                turn_id,
                provider_turn_id,
                str(binding) if binding and held.get(turn_id) is None else None,
            )
            log.warning(
                "session %s: turn %s re-bound to provider turn %s from the provider's history "
                "(history final: %s)",
                self._core.key,
                turn_id,
                provider_turn_id,
                final,
            )
        for turn_id in absent:
            if self._core.session_store.turns.mark_host_only(
                self._core.ws, self._core.sid, turn_id
            ):
                log.warning(
                    "session %s: turn %s is not in the provider's final history: its start "
                    "never reached the provider; marked host-only",
                    self._core.key,
                    turn_id,
                )
        for turn_id in sorted(missing - matches.keys() - set(absent)):
            log.warning(
                "session %s: turn %s has no provider binding and none can be proven; left "
                "unbound (fail closed; history final: %s, %d provider turns)",
                self._core.key,
                turn_id,
                final,
                len(provider_turns),
            )
        return final and any(t.root_provider_turn_id for t in canonical)

    def stop_start(self, provider: str) -> None:
        """The runtime's `session.start` in progress was given up (its Turn interrupted, its
        Session deleted): ask the worker to end it now if its app-server is found stopped
        (`SessionStop.start_only`), which would otherwise hold it — and the Session's next
        start behind it — for the start's request limit. A healthy start goes on: its answer
        is recorded as the warm runtime the next Turn takes, never a second one. Not sent
        while a fork prepares the runtime (its start is the fork's to judge), nor while
        nothing started yet (queued for a slot)."""
        if self.preparing <= self.slot_waits or self.forks_preparing:
            return
        self._core.ctx.workers.stop_session(
            provider,
            SessionStop(self._core.key, start_only=True),
            self._core.ctx.timeouts.session_start_s,
        )

    def stop_runtime(self) -> None:
        """Stop the Session's provider runtime (it respawns at the next use). Not sent once the
        worker that ran it has died (the runtime went with it): the stop, retried until a new
        worker is up, reached that worker after the Session's next `session.start` there and
        stopped the new runtime, so the next Turn failed "not started in the worker"."""
        self._warm = None
        worker_pid = self._runtime_worker_pid
        if worker_pid is not None and not process_alive(worker_pid):
            return
        provider = self._core.session().provider
        self._core.ctx.workers.stop_session(
            provider, SessionStop(self._core.key), self._core.ctx.timeouts.control_s
        )


# -- the host's runtime slots ------------------------------------------------------------------

DEFAULT_MAX_RUNTIMES = 64
DEFAULT_MAX_STARTS = 4

Granted = Callable[[], None]
StopRuntime = Callable[[str, str], "Future[Any]"]
"""`stop(provider, key)`: ask the worker to stop that Session's runtime."""


def fork_share(limit: int) -> int:
    """How many of `limit` slots forks may hold: all but a quarter (at least one slot stays
    out of their reach once there are two)."""
    return max(1, limit - max(1, limit // 4))


@dataclass(slots=True)
class _Waiter:
    key: str
    granted: Granted
    fork: bool
    """Waiting for a slot for a fork only (a Turn of the same Session waiting too clears it)."""


class RuntimeSlots:
    def __init__(
        self,
        limit: int = DEFAULT_MAX_RUNTIMES,
        stop: StopRuntime | None = None,
        start_limit: int = DEFAULT_MAX_STARTS,
    ) -> None:
        self.limit = max(1, int(limit))
        self.fork_limit = fork_share(self.limit)
        self.start_limit = max(1, int(start_limit))
        self._stop = stop
        self._lock = threading.Lock()
        # provider -> key -> busy; insertion order is least-recently-used first.
        self._live: dict[str, OrderedDict[str, bool]] = {}
        # provider -> keys granted cold whose runtime start has not ended yet.
        self._starting: dict[str, set[str]] = {}
        # provider -> keys whose slot a fork holds (busy until `release`).
        self._forking: dict[str, set[str]] = {}
        self._waiters: dict[str, deque[_Waiter]] = {}
        self.evictions = 0
        self.queued_total = 0

    def set_stopper(self, stop: StopRuntime) -> None:
        self._stop = stop

    def acquire(self, provider: str, key: str, granted: Granted, *, fork: bool = False) -> None:
        """Call `granted()` once `key` holds one of `provider`'s slots (now or later); a
        `fork` takes a new slot only within the forks' share (`fork_limit`)."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            if key in live:
                live[key] = True
                live.move_to_end(key)
                if fork:
                    self._forking.setdefault(provider, set()).add(key)
                handoffs: list[tuple[str | None, Granted]] = [(None, granted)]
            else:
                waiters = self._waiters.setdefault(provider, deque())
                entry = next((w for w in waiters if w.key == key), None)
                if entry is not None:
                    # Already waiting (a fork and a turn of one Session): chain the
                    # callbacks; a Turn among them waits as a Turn, not in the forks' share.
                    entry.granted = _both(entry.granted, granted)
                    entry.fork = entry.fork and fork
                    handoffs = self._handoffs(provider, live)
                else:
                    entry = _Waiter(key, granted, fork)
                    waiters.append(entry)  # FIFO: nobody overtakes a waiter it may not skip
                    handoffs = self._handoffs(provider, live)
                    if any(w is entry for w in waiters):
                        self.queued_total += 1
        for victim, then in handoffs:
            self._grant_after_stop(provider, victim, then)

    def hold_warm(self, provider: str, key: str, *, fork: bool = False) -> bool:
        """Mark `key`'s slot busy if its runtime still holds one (it was neither evicted nor
        lost with its worker), and say so; never waits, never evicts (for a fork that
        reuses a warm runtime without `session.start`). False: acquire as usual."""
        with self._lock:
            live = self._live.get(provider)
            if live is None or key not in live or key in self._starting.get(provider, ()):
                return False
            live[key] = True
            live.move_to_end(key)
            if fork:
                self._forking.setdefault(provider, set()).add(key)
            return True

    def started(self, provider: str, key: str) -> None:
        """`key`'s runtime start has ended (ready or failed): its start permit goes to the
        next waiter."""
        with self._lock:
            starting = self._starting.get(provider)
            if starting is None or key not in starting:
                return
            starting.discard(key)
            handoffs = self._handoffs(provider, self._live.setdefault(provider, OrderedDict()))
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def release(self, provider: str, key: str) -> None:
        """`key` has nothing in progress: its runtime stays warm but may be evicted."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            if key in live:
                live[key] = False
                live.move_to_end(key)
            self._starting.get(provider, set()).discard(key)
            self._forking.get(provider, set()).discard(key)
            waiters = self._waiters.get(provider)
            if waiters:
                # A Session released while queued (its Turn was interrupted) waits no more.
                for entry in [w for w in waiters if w.key == key]:
                    waiters.remove(entry)
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def forget(self, provider: str, key: str) -> None:
        """`key`'s runtime is gone (Session deleted): free its slot at once."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            live.pop(key, None)
            self._starting.get(provider, set()).discard(key)
            self._forking.get(provider, set()).discard(key)
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def reset(self, provider: str) -> None:
        """The provider's worker died, and every runtime with it: idle slots are free."""
        with self._lock:
            live = self._live.setdefault(provider, OrderedDict())
            for key in [k for k, busy in live.items() if not busy]:
                del live[key]
                self._forking.get(provider, set()).discard(key)
            handoffs = self._handoffs(provider, live)
        for victim, granted in handoffs:
            self._grant_after_stop(provider, victim, granted)

    def status(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {
                provider: {
                    "live": len(live),
                    "busy": sum(1 for b in live.values() if b),
                    "queued": len(self._waiters.get(provider) or ()),
                    "queuedForks": sum(1 for w in self._waiters.get(provider) or () if w.fork),
                    "forks": len(self._forking.get(provider) or ()),
                    "limit": self.limit,
                    "forkLimit": self.fork_limit,
                    "starting": len(self._starting.get(provider) or ()),
                    "startLimit": self.start_limit,
                }
                for provider, live in self._live.items()
            }

    # -- under the lock ---------------------------------------------------------------------

    def _make_room(self, provider: str, live: OrderedDict[str, bool]) -> str | bool | None:
        """None: a free slot; a key: evict that idle runtime; False: every slot is busy."""
        if len(live) < self.limit:
            return None
        for key, busy in live.items():
            if not busy:
                del live[key]
                self.evictions += 1
                return key
        return False

    def _handoffs(
        self, provider: str, live: OrderedDict[str, bool]
    ) -> list[tuple[str | None, Granted]]:
        """Grant waiters in FIFO order while there is room and a start permit; a fork waiting
        for the forks' share is passed over (it keeps its place), anything else stops it."""
        out: list[tuple[str | None, Granted]] = []
        waiters = self._waiters.get(provider)
        if not waiters:
            return out
        starting = self._starting.setdefault(provider, set())
        forking = self._forking.setdefault(provider, set())
        kept: list[_Waiter] = []
        while waiters:
            waiter = waiters.popleft()
            key = waiter.key
            if key in live:
                # Became live while queued (granted through another path): warm, no permit.
                victim: str | bool | None = None
            elif waiter.fork and len(forking) >= self.fork_limit:
                kept.append(waiter)
                continue
            elif len(starting) >= self.start_limit:
                waiters.appendleft(waiter)
                break
            else:
                victim = self._make_room(provider, live)
                if victim is False:
                    waiters.appendleft(waiter)
                    break
                starting.add(key)
            live[key] = True
            if waiter.fork:
                forking.add(key)
            out.append((victim if isinstance(victim, str) else None, waiter.granted))
        waiters.extendleft(reversed(kept))
        return out

    # -- outside the lock -------------------------------------------------------------------

    def _grant_after_stop(self, provider: str, victim: str | None, granted: Granted) -> None:
        """Grant once the evicted runtime is stopped, so the worker never holds more than
        `limit` live runtimes of a provider."""
        if victim is None or self._stop is None:
            self._safe(granted)
            return
        try:
            fut = self._stop(provider, victim)
        except Exception:  # noqa: BLE001 - a stop that cannot be sent still frees the slot
            log.exception("stopping idle runtime %s failed", victim)
            self._safe(granted)
            return
        fut.add_done_callback(lambda _f: self._safe(granted))

    @staticmethod
    def _safe(granted: Granted) -> None:
        try:
            granted()
        except Exception:  # noqa: BLE001 - one Session's bug must not block the others
            log.exception("runtime slot callback failed")


def _both(first: Granted, then: Granted) -> Granted:
    def both() -> None:
        first()
        then()

    return both
