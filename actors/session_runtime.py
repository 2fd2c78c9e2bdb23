"""The Session's provider runtime: its lifecycle in the worker.

One concern: taking a runtime slot, starting (or reusing) the runtime with `session.start`
and recording what it reports, re-binding settled Turns from the provider's own history,
and stopping the runtime. Turns and fork sagas both prepare their runtime here
(`prepare_runtime` is part of the `ForkHost` port).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import pykka

from actors.fork_host import PreparedRuntime
from actors.fork_saga import attestation_key
from actors.messages import FollowUp
from actors.provider_errors import provider_error
from actors.rebind import CanonicalTurn, match_missing
from actors.session_base import SessionCore
from domain.errors import HostError
from domain.worker_messages import (
    HistoryRequest,
    SessionHistory,
    SessionStart,
    SessionStarted,
    SessionStop,
)
from storage.models import Session
from storage.sqlite import host_error_of

# One logger for every concern of the Session actor (operators filter on it).
log = logging.getLogger("actors.session_actor")


PF_EXITING = 0x4
"""The kernel's flag on a task that has begun to exit (`/proc/PID/stat` field 9)."""
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def process_alive(pid: int) -> bool:
    """Whether `pid` is a running process (not gone, not a zombie, not exiting, no SIGKILL
    waiting for it): the host's check that a runtime the worker named is still there, without
    a round trip. A process killed a moment ago is dead here from the moment its
    SIGKILL is pending, so the next fork or Turn on it takes the cold path instead of being
    refused by the worker — all but the kernel's own instant between taking the signal and
    marking the task exiting (a fork then is refused safely: `failed`, no child)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return alive_in_stat(stat)


def alive_in_stat(stat: bytes) -> bool:
    """`/proc/PID/stat`: not a zombie or dead, not exiting (`PF_EXITING` in its flags) and no
    SIGKILL pending (a fatal signal is queued on every thread of the process before `kill`
    returns). Left unseen: the instant between the kernel taking the SIGKILL and marking the
    task exiting."""
    fields = stat_fields(stat)
    if fields is None:
        return True  # an unreadable line is not evidence of an exit
    state, flags, pending = fields
    return state not in (b"Z", b"X", b"x") and not (flags & PF_EXITING or pending & _SIGKILL_BIT)


def stat_fields(stat: bytes) -> tuple[bytes, int, int] | None:
    """(state, flags, pending signals) of a `/proc/PID/stat` line: fields 3, 9 and 31 (the
    command, field 2, may hold spaces and parentheses: counted from its last `)`)."""
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return fields[3 - 3], int(fields[9 - 3]), int(fields[31 - 3])
    except (IndexError, ValueError):
        return None


class SessionRuntime:
    """Prepares, re-binds and stops the Session's provider runtime; owns its runtime slot, the
    warm runtime of the fork and Turn fast paths, and the Session row cache."""

    def __init__(self, core: SessionCore) -> None:
        self._core = core
        # The fork fast path: the runtime the last `session.start` reported with a
        # generation, and when (monotonic).
        self._warm: tuple[PreparedRuntime, float] | None = None
        # The Session row as this actor last read or wrote it, emptied by every message that
        # may write it (`forget_row`, called by the SessionActor and before durable writes).
        self._session_row: Session | None = None
        # The runtime this Session's last passed fork re-attestation proved.
        self.attested_runtime: tuple[str, ...] | None = None
        # Runtime slot: held while preparing or busy, released when neither.
        self.preparing = 0
        self._slot_provider: str | None = None

    def forget_row(self) -> None:
        self._session_row = None

    def release_slot_if_idle(self, busy: bool) -> None:
        """Give the provider's runtime slot back once the Session has nothing in progress."""
        if not busy and self.preparing == 0 and self._slot_provider is not None:
            self._core.ctx.runtime_slots.release(self._slot_provider, self._core.key)
            self._slot_provider = None

    def cached_session(self) -> Session:
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
            return bool(
                self._core.session_store.turns.turns_missing_binding(self._core.ws, self._core.sid)
            )
        except HostError:
            return True

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
            or (runtime.pid is not None and not process_alive(runtime.pid))
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
        self._slot_provider = session.provider

        def _ready(runtime: PreparedRuntime | HostError) -> None:
            self.preparing -= 1
            self._core.ctx.runtime_slots.started(session.provider, self._core.key)
            on_ready(runtime)

        def _prepare_now() -> None:
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
        so capability projection never has to spawn a process."""
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
        )
        fut = self._core.ctx.workers.start_session(
            session.provider, request, self._core.ctx.timeouts.session_start_s
        )

        def _done(f: Future[SessionStarted]) -> None:
            # The start itself has ended: its permit goes to the next cold Session now.
            self._core.ctx.runtime_slots.started(session.provider, self._core.key)
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
            )
            self._warm = None if prepared.generation is None else (prepared, time.monotonic())
            return prepared

        self._core.later(fut, _done)

    def _rebind_missing(self, runtime: PreparedRuntime, then: Callable[[], None]) -> None:
        """Re-bind settled completed Turns whose provider binding was never recorded, from
        the provider's own history (by order and content, fail closed), then continue. Any
        failure here only leaves those Turns unbound, as they were."""
        try:
            missing = self._core.session_store.turns.turns_missing_binding(
                self._core.ws, self._core.sid
            )
        except HostError as exc:
            log.warning("session %s: re-bind check failed: %s", self._core.key, exc.message)
            missing = []
        if not missing:
            then()
            return
        fut = self._core.ctx.workers.history(
            runtime.provider, HistoryRequest(self._core.key), self._core.ctx.timeouts.control_s
        )

        def _done(f: Future[SessionHistory]) -> None:
            try:
                history: list[Mapping[str, Any]] = [t.to_wire() for t in f.result().turns]
                self._apply_rebind(set(missing), history)
            except Exception as exc:  # noqa: BLE001 - a failed re-bind leaves Turns unbound
                log.warning(
                    "session %s: re-bind from provider history failed: %s", self._core.key, exc
                )
            then()

        self._core.later(fut, _done)

    def _apply_rebind(self, missing: set[str], provider_turns: list[Mapping[str, Any]]) -> None:
        self._session_row = None  # a re-bind writes the Session's Turns (and its row)
        turns, _ = self._core.session_store.history.timeline(
            self._core.ws, self._core.sid, after_sequence=0, limit=100_000
        )
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
            self._core.session_store.turns.bind_provider_turn(
                self._core.ws,
                self._core.sid,
                turn_id,
                provider_turn_id,
                str(binding) if binding and held.get(turn_id) is None else None,
            )
            log.warning(
                "session %s: turn %s re-bound to provider turn %s from the provider's history",
                self._core.key,
                turn_id,
                provider_turn_id,
            )
        for turn_id in sorted(missing - matches.keys()):
            log.warning(
                "session %s: turn %s has no provider binding and none can be proven; left "
                "unbound (fail closed)",
                self._core.key,
                turn_id,
            )

    def stop_runtime(self) -> None:
        """Stop the Session's provider runtime (it respawns at the next use)."""
        self._warm = None
        provider = self._core.session().provider
        self._core.ctx.workers.stop_session(
            provider, SessionStop(self._core.key), self._core.ctx.timeouts.control_s
        )
