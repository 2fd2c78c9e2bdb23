"""The generic app-server driver: one live Codex-style app-server per active Session (its own
provider home, private HOME and TMPDIR), started or resumed on its thread, turns and
Interactions over its JSON-RPC, the attested forkability verdict, and idle or stopped
app-servers reaped.

`AppServerDriver` is built over an `AppServerProvider` (tutti-agent, Codex) and composed of
parts wired in its constructor: `Runtimes` (the provider's processes), `TurnEvents` (the
event translator on their reader threads), `ForkThroughTurn` (the fork strategy) and
`AppServerResolution` (`fork.resolve`). Its own concern is the Sessions and their Turns.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from domain.errors import Conflict, InvalidArgument, ProviderNotCalled, SessionBusy
from domain.worker_messages import (
    ForkRequest,
    ForkResult,
    ResolveAdopt,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from drivers.app_server.events import QUIET_PREFIXES, TurnEvents
from drivers.app_server.fork import (
    READABILITY_APP_SERVER,
    READABILITY_IN_WORKER,
    TURN_END_RECHECKS_S,
    ForkThroughTurn,
)
from drivers.app_server.items import thread_of, user_text
from drivers.app_server.process import (
    PROVIDER_PROTOCOL_ERROR,
    AppServerClosed,
    AppServerFailure,
    AppServerProcess,
    AppServerTimeout,
    JsonRpcError,
    QuietLines,
    pdeathsig_wrapper,
)
from drivers.app_server.provider import AppServerProvider
from drivers.app_server.resolution import AppServerResolution
from drivers.app_server.runtimes import Runtimes
from drivers.app_server.state import Runtime, Sessions, SessionState
from drivers.base import SERVED_BY, Emit
from drivers.binder import RolloutBinder
from drivers.credentials import credential_plan
from drivers.errors import DriverError, FailpointError
from drivers.failpoints import Failpoints
from drivers.liveness import (
    DEFAULT_STOPPED_LIMIT_S,
    PROVIDER_STOPPED,
    TreeWatch,
    stopped_at_stop_error,
    stopped_error,
    stopped_start_error,
    unresponsive_error,
)
from drivers.runtime_marker import end_left_of

PROVIDER_HISTORY_MISSING = "provider_history_missing"
"""The reason a Turn of a Session whose bound provider history is gone fails with."""
RESPAWN_REAP_S = 2.0
"""How long a Session's next app-server waits for what is left of its exited one to be
reaped once killed: a process frozen by its cgroup dies only when thawed (its SIGKILL
pending, it runs none of its own code meanwhile), and the Session's next Turn must not wait
for that."""
STOP_LOOK_S = 0.1
"""How often a Session's stop, waiting for the operation that holds the Session, looks whether
its app-server was stopped (`AppServerDriver._operations_ended`)."""


class AppServerDriver:
    """A `ProviderDriver` for one Codex-style app-server provider."""

    def __init__(
        self, config: Mapping[str, Any], failpoints: Failpoints, provider: AppServerProvider
    ) -> None:
        self.config = dict(config)
        self.provider = provider
        self.kind = provider.kind
        self.failpoints = failpoints
        self.binder = RolloutBinder(failpoints)
        self.request_timeout = float(self.config.get("request_timeout_s", 30.0))
        self.idle_timeout = float(self.config.get("idle_timeout_s", 300.0))
        self.stopped_limit = float(self.config.get("stopped_limit_s", DEFAULT_STOPPED_LIMIT_S))
        readability_proof = str(self.config.get("readability_proof") or READABILITY_IN_WORKER)
        if readability_proof not in (READABILITY_IN_WORKER, READABILITY_APP_SERVER):
            raise InvalidArgument(
                "readability_proof",
                f"readability_proof must be {READABILITY_IN_WORKER} or {READABILITY_APP_SERVER}",
            )
        self._sessions = Sessions(provider.kind)
        # Pairs the provider's `open_session` with the Session it opens, and a stop's pop with
        # its `close_session`: a stop never forgets the params of a start that raced it.
        self._opening = threading.Lock()
        # A write to an app-server that takes none of it (its stdin full: a wedged server) is
        # given up, the server killed, past this; longer than a busy server's liveness check
        # (`stopped_limit_s` after its first unanswered or unsent request), which then fails
        # the Turn in its own words first — this bound is for writes with no Turn to watch.
        self.write_limit = float(self.config.get("write_limit_s", 2 * self.stopped_limit))
        self.runtimes = Runtimes(provider, self.request_timeout, self.write_limit)
        self.events = TurnEvents(
            provider.kind,
            self.config,
            credential_plan(provider.kind, self.config),
            lambda session, provider_turn_id: self._interrupt(session, provider_turn_id),
        )
        self.forks = ForkThroughTurn(
            provider,
            self.runtimes,
            self._sessions,
            self.binder,
            failpoints,
            fork_timeout=float(self.config.get("fork_timeout_s", 60.0)),
            verify_bound_child=bool(self.config.get("verify_bound_child", True)),
            readability_proof=readability_proof,
        )
        self.resolution = AppServerResolution(
            self.runtimes, self._sessions, self.binder, provider.binding_mode, failpoints
        )
        self._attest_cache: dict[str, dict[str, Any]] = {}  # launch fingerprint → verdict
        # `begin_turn`'s requests waiting for their answer → (runtime, deadline)
        self._turn_starts: dict[Future[dict[str, Any]], tuple[Runtime, float]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._tick = max(0.05, min(5.0, self.idle_timeout / 4, self.stopped_limit / 4))
        self._reaper = threading.Thread(target=self._reap_idle, name="idle-reaper", daemon=True)
        self._reaper.start()

    @property
    def spawns(self) -> int:
        """App-servers this driver started."""
        return self.runtimes.spawns

    def command(self) -> list[str]:
        """The provider's app-server command line."""
        return self.provider.command()

    def warm_up(self) -> None:
        """Called once as the worker starts (`WorkerServer.preload`): the provider's lazy
        imports of a first runtime start and fork, if it has any (`warm_up`), and the
        host's parent-death wrapper looked up (`pdeathsig_wrapper`: one small exec)."""
        pdeathsig_wrapper()
        warm_up = getattr(self.provider, "warm_up", None)
        if warm_up is not None:
            warm_up()

    # ------------------------------------------------------------------ attestation

    def _verdict(self, runtime: Runtime) -> dict[str, Any]:
        """This driver's attested forkability verdict (brand, version gate, binder): the only
        source of the Host's capability (seed 000 §3.2), persisted with the runtime context."""
        return {
            "driverKind": self.kind,
            "driverVersion": runtime.gate.version,
            "userAgent": runtime.user_agent,
            "bindingMode": self.provider.binding_mode.value,
            # Measured, not assumed: the saga refuses a host_copy fork unless this is `True`.
            "binderAvailable": self.binder.available(),
            "forkThroughTurn": runtime.gate.fork_through_turn,
            # Full-Session fork is the same exact-prefix fork at the newest settled Turn.
            "forkFullSession": runtime.gate.fork_through_turn,
        }

    def attest(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The dispatch-time re-attestation; failpoint `worker.binder.available` armed with
        `error` makes it report the binder unavailable (the fail-closed tests)."""
        verdict = dict(self._probe(params))
        try:
            if self.failpoints.armed:
                self.failpoints.hit("worker.binder.available")
        except FailpointError:
            verdict["binderAvailable"] = False
        return verdict

    def _probe(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A live runtime attests itself; otherwise a transient one is probed. With
        `cache_attestations`, a probe's answer is reused only for the exact same launch
        (seed 000 §6.3: a launch whose program cannot be fingerprinted is always re-probed)."""
        home = Path(str(params.get("home") or ""))
        if not str(home) or not home.is_absolute():
            raise InvalidArgument("home", "home must be an absolute path")
        live = self._sessions.live_runtime_for_home(home)
        if live is not None:
            if self.provider.fork_copies_source:
                # A re-attestation comes right before a fork's dispatch: the source's rollout
                # starts its validation now (`RolloutBinder.start_ahead`; the fork joins it).
                thread_id = self._sessions.thread_of_runtime(live)
                if thread_id:
                    self.binder.start_ahead(home, thread_id)
            return self._verdict(live)
        cwd = str(params.get("cwd") or "")
        fingerprint = (
            self.runtimes.launch_fingerprint(home, cwd)
            if self.provider.cache_attestations
            else None
        )
        if fingerprint is not None:
            with self._lock:
                cached = self._attest_cache.get(fingerprint)
            if cached is not None:
                return dict(cached)
        with self.runtimes.home(home):
            # A Session runtime that started while this waited for the home attests itself.
            live = self._sessions.live_runtime_for_home(home)
            if live is not None:
                return self._verdict(live)
            with self.runtimes.transient(home, cwd) as runtime:
                result = self._verdict(runtime)
        if fingerprint is not None:
            with self._lock:
                self._attest_cache[fingerprint] = dict(result)
        return result

    # ------------------------------------------------------------------ the worker's hooks

    def is_warm(self, method: str, params: Mapping[str, Any]) -> bool:
        """True when `method` will not spawn or wait: the Session's app-server is live, on the
        same home and thread, and no other operation holds it (the worker's fast lane)."""
        session = self._sessions.get(str(params.get("agentSessionId") or ""))
        if session is None or session.op_lock.locked():
            return False
        runtime = session.runtime
        if runtime is None or not runtime.alive:
            return False
        if method == "session.start":
            wanted = str(params.get("providerSessionId") or "")
            home = str(params.get("home") or "")
            return str(session.home) == home and (not wanted or wanted == session.thread_id)
        return method == "turn.start"

    def _live_runtime(self, agent_session_id: str, home: str) -> Runtime | None:
        """The Session's live app-server runtime on `home`, or None (none is live, or it
        serves another home)."""
        session = self._sessions.get(agent_session_id)
        if session is None or str(session.home) != home:
            return None
        runtime = session.runtime
        if runtime is None or not runtime.alive:
            return None
        return runtime

    def runtime_generation(self, agent_session_id: str, home: str) -> int | None:
        """The generation of the Session's live app-server on `home` (None: none is live, or
        it serves another home); the worker stamps its attestations with it."""
        runtime = self._live_runtime(agent_session_id, home)
        return None if runtime is None else runtime.generation

    def runtime_pid(self, agent_session_id: str, home: str) -> int | None:
        """The pid of the Session's live app-server on `home` (the host checks it is alive
        before reusing that runtime for a fork without `session.start`)."""
        runtime = self._live_runtime(agent_session_id, home)
        return None if runtime is None else runtime.proc.pid

    @property
    def provider_homes(self) -> int:
        """Homes whose Session params the provider keeps (`worker.ping`)."""
        return self.provider.homes_kept()

    @property
    def runtime_idle_s(self) -> float:
        """How long an idle app-server lives before `_reap_idle` stops it."""
        return self.idle_timeout

    # ------------------------------------------------------------------ Sessions and Turns

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        sid = str(params.get("agentSessionId") or "")
        home_text = str(params.get("home") or "")
        if not home_text or not Path(home_text).is_absolute():
            raise InvalidArgument("home", "home must be an absolute path")
        home = Path(home_text)
        cwd = str(params.get("cwd") or "")
        wanted = str(params.get("providerSessionId") or "")
        model = params.get("model")
        with self._opening:
            self.provider.open_session(home, params)
            if not sid:
                raise InvalidArgument("agentSessionId", "agentSessionId is required")
            session, stale = self._sessions.open(
                sid, home, cwd, wanted, model if isinstance(model, str) else None
            )
            if stale is not None and not self._sessions.on_home(stale.home):
                self.provider.close_session(stale.home)
        if stale is not None and stale.runtime is not None:
            stale.runtime.proc.close()
        with session.op_lock:
            self._check_history(session, params)
            runtime = self._ensure_runtime(session)
            self._check_turn_end(session, params)
        context = self._verdict(runtime)
        context.update(self.provider.session_context(home, session.thread_id))
        return {
            "providerSessionId": session.thread_id,
            "runtimeContext": context,
            # The runtime whose verdict this is: the worker stamps a start that spawned it
            # too, while it is still the live one (drivers/worker.py `_stamped`).
            SERVED_BY: runtime.generation,
        }

    def stop_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        if params.get("startOnly"):
            # The host gave up the start in progress (its Turn interrupted, its Session
            # deleted): an app-server found stopped while it waits is killed and the start
            # fails now; a healthy one is left to finish, its runtime kept for the next Turn.
            session = self._sessions.get(str(params.get("agentSessionId") or ""))
            if session is not None:
                with self._operations_ended(session):
                    pass
            return {}
        with contextlib.ExitStack() as held:
            with self._opening:
                session = self._sessions.pop(str(params.get("agentSessionId") or ""))
                if session is None:
                    return {}
                # The home marked closing where the Session leaves the table: a start of the
                # same home from here on (it opens a new Session) waits until the close below
                # is done, never spawning beside the app-server being closed.
                held.enter_context(self.runtimes.closing(session.home, session))
                # Its next start opens it again first: nothing kept for the worker's life.
                if not self._sessions.on_home(session.home):
                    self.provider.close_session(session.home)
            # A start or turn start in progress finishes first: otherwise the app-server it is
            # spawning is attached to a Session nobody holds any more and lives on, uncounted
            # (the host's runtime bound was exceeded that way under load).
            # Closed with its home held (after the `op_lock`, the lock order): a transient of
            # the home meanwhile spawns once this one exited, never beside it.
            with self._operations_ended(session):
                runtime, session.runtime = session.runtime, None
                if runtime is not None:
                    held.enter_context(self.runtimes.home(session.home, owner=session))
            if runtime is not None:
                runtime.proc.close()
        return {}

    @contextlib.contextmanager
    def _operations_ended(self, session: SessionState) -> Iterator[None]:
        """Hold the Session's `op_lock` for its stop, once the operation holding it (a start,
        a Turn's start waiting for `turn/start`'s answer) has ended. While it waits, the
        Session's app-server is looked at every `STOP_LOOK_S`: one found stopped (SIGSTOP,
        SIGTSTP, a debugger) would answer that operation never, and hold the stop, and the
        Session's next start behind it, for the request's whole limit (`request_timeout_s`),
        so it is ended at once (`_end_runtime`, `provider_stopped` in words) and the operation
        fails now: a runtime found stopped holds no Session beyond its stop. So is the
        app-server being started for the Session (`starting`: spawned, its `initialize` or its
        thread's opening not answered), killed with every request waiting on it failed."""
        lock = session.op_lock
        if not lock.acquire(blocking=False):
            proc: AppServerProcess | None = None
            watch: TreeWatch | None = None
            while not lock.acquire(timeout=STOP_LOOK_S):
                runtime = session.runtime
                if runtime is not None and not runtime.alive:
                    runtime = None  # exited: its successor may be starting
                current = session.starting if runtime is None else runtime.proc
                if current is not proc:
                    proc = current
                    pid = None if proc is None else proc.pid
                    watch = None if pid is None else TreeWatch(pid)
                if proc is None or watch is None or not proc.alive:
                    continue
                stopped = watch.stopped(time.monotonic())
                if stopped is None:
                    continue
                error = stopped_at_stop_error(self.kind, watch.pid, stopped)
                if runtime is not None:
                    self._end_runtime(session, runtime, error)
                else:
                    proc.abort(error)  # its start fails now, in these words
        try:
            yield
        finally:
            lock.release()

    def start_turn(self, params: Mapping[str, Any], emit: Emit) -> dict[str, Any]:
        self.events.emit = emit
        session = self._session(params)
        turn_id = str(params.get("turnId") or "")
        if not turn_id:
            raise InvalidArgument("turnId", "turnId is required")
        with session.op_lock:
            self._check_history(session, params)
            runtime = self._ensure_runtime(session)
            self._check_turn_end(session, params)
            with session.state_lock:
                if session.active or session.awaiting_turn is not None:
                    raise SessionBusy(f"a turn is already active on {session.agent_session_id}")
                session.awaiting_turn = turn_id
            session.history_changed()
            fut = runtime.proc.request_async("turn/start", _turn_start_params(session, params))
            return self._turn_started(
                session,
                runtime,
                turn_id,
                lambda: runtime.proc.answer("turn/start", fut, timeout=self.request_timeout),
            )

    def begin_turn(self, params: Mapping[str, Any], emit: Emit, answer: TurnAnswer) -> bool:
        """`start_turn` for a warm Session, on a thread that must never block (the worker's
        link thread): writes `turn/start` and returns True, or returns False having sent
        nothing (the thread's history generation at most bumped, as the lane's start bumps it
        again), for `start_turn` on a lane to do it as ever — when the Session has no live
        runtime, another operation holds it, a Turn is active or awaited, or the request
        cannot leave without waiting (`AppServerProcess.try_request_async`). The Session's
        operation lock is held from here to the answer, as `start_turn` holds it; the answer
        (or a failure) completes on the thread that completes the request — the app-server's
        reader, the idle reaper at `request_timeout_s` — and is told to `answer(result,
        error)` after the lock is released, exactly one of the two None."""
        session = self._sessions.get(str(params.get("agentSessionId") or ""))
        turn_id = str(params.get("turnId") or "")
        if session is None or not turn_id or not session.op_lock.acquire(blocking=False):
            return False
        fut = None
        try:
            runtime = session.runtime
            if runtime is None or not runtime.alive:
                return False
            if self._history_gone(session, params, search=False) is not False:
                return False  # gone (`start_turn` fails it, typed), or not known without a walk
            if self._turn_end_missing(session, params, search=False) is not False:
                return False  # cut (`start_turn` fails it, typed), or not known from a tail
            with session.state_lock:
                if session.active or session.awaiting_turn is not None:
                    return False  # `start_turn` refuses it, typed
                session.awaiting_turn = turn_id
            self.events.emit = emit
            session.history_changed()
            fut = runtime.proc.try_request_async("turn/start", _turn_start_params(session, params))
            if fut is None:
                with session.state_lock:
                    session.awaiting_turn = None
                return False
        finally:
            if fut is None:
                session.op_lock.release()
        with self._lock:
            self._turn_starts[fut] = (runtime, time.monotonic() + self.request_timeout)
        fut.add_done_callback(
            functools.partial(self._turn_answered, session, runtime, turn_id, answer)
        )
        return True

    def _turn_answered(
        self,
        session: SessionState,
        runtime: Runtime,
        turn_id: str,
        answer: TurnAnswer,
        fut: Future[dict[str, Any]],
    ) -> None:
        """`begin_turn`'s request completed (on the thread that completed it)."""
        with self._lock:
            self._turn_starts.pop(fut, None)
        try:
            result = self._turn_started(session, runtime, turn_id, lambda: fut.result(0))
        except Exception as exc:  # noqa: BLE001 - answered, typed, by the worker
            session.op_lock.release()
            answer(None, exc)
        else:
            session.op_lock.release()
            answer(result, None)

    def _turn_started(
        self,
        session: SessionState,
        runtime: Runtime,
        turn_id: str,
        wait: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        """A `turn/start`'s answer (`wait()`) made the Turn's start (`turn_id`, the canonical
        one): its provider id claimed (`turn.started` sent), or the Session no longer awaiting
        it and the failure typed. An answer that names no turn, for a Turn no notification
        named either, is a protocol break: nothing could ever claim or end that Turn, and the
        Session would refuse every later Turn while it waits — the app-server is killed
        (`break_protocol`) and the start fails `provider_protocol_error` in its words."""
        try:
            result = wait()
        except JsonRpcError as exc:
            with session.state_lock:
                session.awaiting_turn = None
            raise DriverError(f"turn/start rejected: {exc.rpc_message}") from exc
        except AppServerFailure as exc:
            with session.state_lock:
                session.awaiting_turn = None
            raise DriverError(
                f"turn/start failed: {runtime.stopped_error or exc}",
                reason="provider_unavailable",
            ) from exc
        turn = result.get("turn")
        provider_turn_id = str(turn.get("id") or "") if isinstance(turn, Mapping) else ""
        if not provider_turn_id:
            with session.state_lock:
                if session.awaiting_turn == turn_id:
                    session.awaiting_turn = None
                else:  # claimed by its notification, which overtook this answer
                    provider_turn_id = next(
                        (p for p, c in session.turns.items() if c == turn_id), ""
                    )
            if not provider_turn_id:
                words = runtime.proc.break_protocol("answered turn/start without a turn id")
                raise DriverError(f"turn/start failed: {words}", reason=PROVIDER_PROTOCOL_ERROR)
        self.events.claim_turn(session, provider_turn_id)
        session.last_used = time.monotonic()
        return {"providerTurnId": provider_turn_id}

    def _history_gone(
        self, session: SessionState, params: Mapping[str, Any], *, search: bool
    ) -> bool | None:
        """Whether the Session's provider history is gone though the host bound Turns of it
        (`boundHistory`): False when not bound, or the provider keeps no such check."""
        gone = getattr(self.provider, "history_gone", None)
        if gone is None or params.get("boundHistory") is not True or not session.thread_id:
            return False
        result: bool | None = gone(session.home, session.thread_id, search=search)
        return result

    def _check_history(self, session: SessionState, params: Mapping[str, Any]) -> None:
        """Refuse a start of a Session whose bound history is gone before the app-server gets
        anything: a live server would run the Turn on the conversation it holds in memory
        into a removed file, nobody told; a new one cannot resume the thread at all."""
        if self._history_gone(session, params, search=True):
            raise ProviderNotCalled(
                f"{PROVIDER_HISTORY_MISSING}: {self.kind} thread {session.thread_id} has Turns "
                f"the host bound, but its rollout is not in its home {session.home}; a Turn "
                "would not be kept (or could not resume the conversation), so none was "
                "started. Put the rollout back, or start a new Session"
            )

    def _turn_end_missing(
        self, session: SessionState, params: Mapping[str, Any], *, search: bool
    ) -> bool | None:
        """Whether the Session's provider history lacks the end of the last Turn the host
        bound and settled `completed` (`boundTurnId`): False when none is named, or the
        provider keeps no such check."""
        missing = getattr(self.provider, "turn_end_missing", None)
        turn = params.get("boundTurnId")
        if missing is None or not isinstance(turn, str) or not turn or not session.thread_id:
            return False
        result: bool | None = missing(session.home, session.thread_id, turn, search=search)
        return result

    def _check_turn_end(self, session: SessionState, params: Mapping[str, Any]) -> None:
        """Refuse a start of a Session whose history was cut back before the last Turn the
        host bound and settled (a valid prefix, so nothing reads it as torn) before the
        app-server gets a Turn: a live server would run it on the conversation it holds in
        memory, a new one on the shorter history, and either way the store's Turn is not in
        the provider's history. A miss is looked at again over about a second
        (`TURN_END_RECHECKS_S`): a server may still be writing the Turn's last lines."""
        for wait in (0.0, *TURN_END_RECHECKS_S):
            if wait:
                time.sleep(wait)
            if not self._turn_end_missing(session, params, search=True):
                return
        raise ProviderNotCalled(
            f"{PROVIDER_HISTORY_MISSING}: {self.kind} thread {session.thread_id}'s history in "
            f"its home {session.home} does not hold the end of Turn {params['boundTurnId']}, "
            "which the host bound and settled (its rollout cut back?); a Turn would run on a "
            "history without it, so none was started. Put the rollout back, or start a new "
            "Session"
        )

    def _expire_turn_starts(self, now: float) -> None:
        """`begin_turn`'s requests unanswered past `request_timeout_s` fail as `start_turn`'s
        wait does (`AppServerTimeout`), on the reaper's tick."""
        with self._lock:
            late = [(f, r) for f, (r, deadline) in self._turn_starts.items() if deadline <= now]
            for fut, _runtime in late:
                del self._turn_starts[fut]
        for fut, runtime in late:
            runtime.proc.expire(
                fut, AppServerTimeout(f"turn/start: no answer in {self.request_timeout:.1f} s")
            )

    def history(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.history {agentSessionId}` → `{turns: [{providerTurnId, status, userText}]}`
        in the provider's order: what the host needs to re-bind a Turn whose provider binding
        it never recorded, by order and content."""
        session = self._session(params)
        with session.op_lock:
            runtime = self._ensure_runtime(session)
        try:
            turns = self.runtimes.history_turns(runtime, session.thread_id)
        except AppServerFailure as exc:
            raise DriverError(f"provider history unreadable: {exc}") from exc
        return {
            "turns": [
                {
                    "providerTurnId": str(t.get("id") or ""),
                    "status": str(t.get("status") or ""),
                    "userText": user_text(t),
                }
                for t in turns
            ]
        }

    def interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]:
        self._interrupt(self._session(params), str(params.get("providerTurnId") or ""))
        return {}

    def _interrupt(self, session: SessionState, provider_turn_id: str) -> None:
        """`turn/interrupt`. A provider that answers "no active turn" until a just-started
        Turn runs (`interrupt_waits_for_start`) is asked again while that Turn is still ours
        and unfinished: the answer means "not yet"."""
        deadline = time.monotonic() + self.request_timeout
        while True:
            try:
                self._interrupt_once(session, provider_turn_id)
                return
            except Conflict as exc:
                with session.state_lock:
                    unfinished = provider_turn_id in session.active
                if (
                    not self.provider.interrupt_waits_for_start
                    or "no active turn" not in exc.message
                    or not unfinished
                    or time.monotonic() > deadline
                ):
                    raise
                time.sleep(0.05)

    def _interrupt_once(self, session: SessionState, provider_turn_id: str) -> None:
        runtime = session.runtime
        if runtime is None or not runtime.alive:
            raise Conflict("no live runtime for this session", reason="turn_not_active")
        session.history_changed()
        try:
            runtime.proc.request(
                "turn/interrupt",
                {"threadId": session.thread_id, "turnId": provider_turn_id},
                timeout=self.request_timeout,
            )
        except JsonRpcError as exc:
            raise Conflict(f"turn/interrupt rejected: {exc.rpc_message}") from exc
        except AppServerFailure as exc:
            raise DriverError(f"turn/interrupt failed: {exc}") from exc

    def respond_interaction(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        request_id = str(params.get("requestId") or "")
        response = params.get("response")
        if not isinstance(response, Mapping):
            raise InvalidArgument("response", "response must be a map")
        with session.state_lock:
            pending = session.pending.get(request_id)
        if pending is None:
            raise Conflict(
                f"interaction {request_id} is not pending", reason="interaction_not_pending"
            )
        if pending.kind == "approval":
            decision = response.get("decision")
            if decision not in ("approve", "decline"):
                raise InvalidArgument("response.decision", "decision must be approve or decline")
            result: dict[str, Any] = {"decision": "accept" if decision == "approve" else "decline"}
        else:
            text = response.get("text")
            if not isinstance(text, str):
                raise InvalidArgument("response.text", "a question needs a text answer")
            questions = pending.request.params.get("questions") or []
            ids = [str(q.get("id")) for q in questions if isinstance(q, Mapping)] or ["answer"]
            result = {"answers": {qid: {"answers": [text]} for qid in ids}}
        runtime = session.runtime
        if runtime is None:
            raise Conflict("no live runtime for this session", reason="interaction_not_pending")
        # Taken before it is sent, under the lock it was found with: of two answers at once
        # only one reaches the provider (it takes the first response to its request), the
        # other is refused — never both accepted while the provider kept one of them.
        with session.state_lock:
            if session.pending.get(request_id) is not pending:
                raise Conflict(
                    f"interaction {request_id} is not pending", reason="interaction_not_pending"
                )
            del session.pending[request_id]
        session.history_changed()
        try:
            runtime.proc.respond(pending.request.id, result)
        except AppServerClosed as exc:
            raise DriverError(f"cannot answer interaction: {exc}") from exc
        return {}

    # ------------------------------------------------------------------ fork and fork.resolve

    def fork(self, request: ForkRequest) -> ForkResult:
        return self.forks.fork(request)

    def inspect_fork(self, request: ResolveRequest) -> ResolveInspection:
        return self.resolution.inspect(request)

    def adopt_fork(self, request: ResolveAdopt) -> ForkResult:
        return self.resolution.adopt(request)

    def quarantine_fork(self, request: ResolveRequest) -> ResolveQuarantined:
        return self.resolution.quarantine(request)

    def after_answer(self) -> None:
        """Nothing is left for after a fork's answer (`ProviderDriver.after_answer`)."""

    def close(self) -> None:
        self._closed.set()
        markers = []
        for session in self._sessions.clear():
            if session.runtime is not None:
                session.runtime.proc.close(1.0, end_left=False)
                markers.append(session.runtime.proc.marker)
        end_left_of(markers)  # one `/proc` scan for every runtime, not one each

    # ------------------------------------------------------------------ runtime plumbing

    def _session(self, params: Mapping[str, Any]) -> SessionState:
        return self._sessions.require(str(params.get("agentSessionId") or ""))

    def _ensure_runtime(self, session: SessionState) -> Runtime:
        """The Session's live app-server, (re)spawned and its thread started or resumed."""
        runtime = session.runtime
        if runtime is not None and runtime.alive:
            return runtime
        if runtime is not None:
            # Its process exited, but not necessarily all of it: a launcher's child may still
            # hold the home and the thread's writer lock (`AppServerProcess.kill_tree`).
            runtime.proc.end(
                "app-server exited; what was left of it was killed", reap_s=RESPAWN_REAP_S
            )
        # Spawned and its thread opened with the home held: a transient app-server of the
        # home (a probe, a fork's source, a resolve's read) exits first, or waits for this one.
        with self.runtimes.home(session.home, owner=session):
            return self._open_runtime(session)

    def _open_runtime(self, session: SessionState) -> Runtime:
        """Spawn the Session's app-server and open its thread on it. From the moment its
        process exists to the thread's answer it is the Session's `starting` one: a stop, or
        the liveness check, that finds it stopped kills it (`AppServerProcess.abort`) and the
        start fails at once, `provider_stopped`, not at its request's limit."""
        try:
            return self._open_thread(session)
        finally:
            session.starting = session.starting_watch = session.starting_stopped_since = None

    def _open_thread(self, session: SessionState) -> Runtime:
        runtime = self._spawn_for(session)
        try:
            if session.thread_id:
                # Only the thread's id is read from the answer: not its turns (a 10,000-Turn
                # thread's are a 5 MB answer to build, send and decode, and a history of long
                # Turns one line past the reader's bound: the resume failed, the server killed).
                params: dict[str, Any] = {"threadId": session.thread_id, "excludeTurns": True}
                result = runtime.proc.request("thread/resume", params, timeout=self.request_timeout)
            else:
                params = {"cwd": session.cwd} if session.cwd else {}
                if session.model:
                    params["model"] = session.model
                result = runtime.proc.request("thread/start", params, timeout=self.request_timeout)
        except JsonRpcError as exc:
            runtime.proc.close()
            raise DriverError(
                f"cannot open thread {session.thread_id or '(new)'}: {exc.rpc_message}",
                reason="provider_session_unavailable",
            ) from exc
        except AppServerFailure as exc:
            runtime.proc.close()
            if runtime.proc.aborted is not None:
                raise DriverError(runtime.proc.aborted, reason=PROVIDER_STOPPED) from exc
            raise DriverError(f"app-server failed: {exc}", reason="provider_unavailable") from exc
        thread = thread_of(result)
        thread_id = str(thread.get("id") or "")
        if not thread_id or (session.thread_id and thread_id != session.thread_id):
            runtime.proc.close()
            raise DriverError(f"app-server opened thread {thread_id!r}, not {session.thread_id!r}")
        session.thread_id = thread_id
        session.runtime = runtime
        session.last_used = time.monotonic()
        return runtime

    def _spawn_for(self, session: SessionState) -> Runtime:
        """A new app-server serving `session`, its reader thread wired to the event translator,
        and the ancestors its home must have loaded (a Codex fork child's) loaded."""
        events = self.events
        spawned: list[Runtime] = []

        def exited(reason: str) -> None:
            # A runtime the worker killed (`stopped_error`) had its Turns failed then; its
            # exit may land much later (a frozen process dies once thawed), when the Session's
            # Turns run on its successor: they are not this runtime's to fail.
            if spawned and spawned[0].stopped_error is not None:
                return
            events.on_exit(session, reason)

        runtime = self.runtimes.spawn(
            session.home,
            session.cwd,
            marked=True,
            # A partial, not a lambda: one Python frame fewer for each line the reader hands on.
            on_notification=functools.partial(events.on_notification, session),
            on_server_request=lambda request: events.on_server_request(session, request),
            on_exit=exited,
            quiet=QuietLines(QUIET_PREFIXES, functools.partial(events.on_quiet_line, session)),
            started=functools.partial(setattr, session, "starting"),
        )
        spawned.append(runtime)
        ancestors = self.provider.session_ancestors(session.home)
        try:
            self.runtimes.project(runtime, ancestors)
        except AppServerFailure as exc:
            runtime.proc.close()
            if runtime.proc.aborted is not None:
                raise DriverError(runtime.proc.aborted, reason=PROVIDER_STOPPED) from exc
            raise DriverError(
                f"cannot load the lineage of {session.thread_id}: {exc}",
                reason="provider_session_unavailable",
            ) from exc
        return runtime

    def _reap_idle(self) -> None:
        """Stop app-servers of Sessions idle past `idle_timeout_s`; they respawn on next use.
        On the same tick, fail the Turns of an app-server stopped, or running but silent to
        the liveness request, past `stopped_limit_s`."""
        while not self._closed.wait(self._tick):
            now = time.monotonic()
            self._expire_turn_starts(now)
            for session in self._sessions.all():
                self._check_starting(session, now)
                runtime = session.runtime
                if runtime is None or not runtime.alive:
                    continue
                if self._check_stopped(session, runtime, now):
                    continue
                if self._check_silent(session, runtime, now):
                    continue
                with session.state_lock:
                    busy = bool(session.active or session.pending or session.awaiting_turn)
                idle_for = now - max(session.last_used, runtime.proc.last_activity)
                if busy or idle_for < self.idle_timeout:
                    continue
                if not session.op_lock.acquire(blocking=False):
                    continue
                # Closed with its home held, as `stop_session` does; a home some other thread
                # holds (a resolve reading on this runtime) is reaped on a later tick.
                with contextlib.ExitStack() as held:
                    try:
                        if not held.enter_context(self.runtimes.home_if_free(session.home)):
                            continue
                        session.runtime = None
                    finally:
                        session.op_lock.release()
                    runtime.proc.close()

    def _check_stopped(self, session: SessionState, runtime: Runtime, now: float) -> bool:
        """The app-server (or a process under it) stopped for `stopped_limit_s`: it can never
        finish a Turn, and no exit or timeout would say so before the host's inactivity limit
        (half an hour by default); a stopped idle one would take the next Turn or fork down
        with it. Fail its Turns, naming the process, and kill it (the next use starts a new
        one). True when it was killed."""
        pid = runtime.proc.pid
        if pid is not None and runtime.watch is None:
            runtime.watch = TreeWatch(pid)
        stopped = None if runtime.watch is None else runtime.watch.stopped(now)
        if pid is None or stopped is None:
            session.stopped_since = None
            return False
        if session.stopped_since is None:
            session.stopped_since = now
        if now - session.stopped_since < self.stopped_limit:
            return False
        error = stopped_error(self.kind, "app-server", pid, stopped, now - session.stopped_since)
        session.stopped_since = None
        self._end_runtime(session, runtime, error)
        return True

    def _check_starting(self, session: SessionState, now: float) -> None:
        """The app-server being started for the Session (or a process under it) stopped for
        `stopped_limit_s`: it answers neither its `initialize` nor its thread's opening, and
        nothing but the start's own request limit (`request_timeout_s`) would end the wait,
        with the Session's operations held behind it. It is killed, and its start fails
        `provider_stopped` at once, as a running one's Turns do (`_check_stopped`)."""
        proc = session.starting
        pid = None if proc is None else proc.pid
        if proc is None or pid is None or not proc.alive:
            session.starting_watch = session.starting_stopped_since = None
            return
        watch = session.starting_watch
        if watch is None or watch.pid != pid:
            watch = session.starting_watch = TreeWatch(pid)
            session.starting_stopped_since = None
        stopped = watch.stopped(now)
        if stopped is None:
            session.starting_stopped_since = None
            return
        since = session.starting_stopped_since
        if since is None:
            session.starting_stopped_since = now
            return
        if now - since < self.stopped_limit:
            return
        words = f"stopped for {now - since:.0f} s before it answered"
        proc.abort(stopped_start_error(self.kind, pid, stopped, words))

    def _check_silent(self, session: SessionState, runtime: Runtime, now: float) -> bool:
        """A running app-server that says nothing while its Session has a Turn is asked the
        provider's liveness request (a wedged one is not stopped: its process state says
        nothing). No answer, and nothing else read from it, for `stopped_limit_s` after the
        request: its Turns fail `provider_unresponsive` and it is killed, as a stopped one is.
        True when it was killed."""
        probe = self.provider.liveness_probe
        pid = runtime.proc.pid
        if probe is None or pid is None:
            return False
        if session.stopped_since is not None:
            # Seen stopped (`_check_stopped`, just before): its silence is the stop's, and the
            # stop is what its Turns fail with (`provider_stopped`) once its own limit passes —
            # not a probe sent an instant before the SIGSTOP, whose limit would end first.
            runtime.probe = runtime.probe_unsent = None
            return False
        pending = runtime.probe
        if pending is not None:
            if pending.done() or runtime.proc.last_read > runtime.probe_sent:
                runtime.probe = None  # it answered (or said something else): alive
                return False
            if now - runtime.probe_sent < self.stopped_limit:
                return False
            runtime.probe = None
            self._kill_unresponsive(session, runtime, pid, probe, now)
            return True
        with session.state_lock:
            # A `turn/start` written or being written is waited on as a Turn is (its write
            # waits on a server that stopped reading).
            busy = bool(session.active or session.awaiting_turn is not None)
        if not busy or now - runtime.proc.last_read < self._tick:
            runtime.probe_unsent = None
            return False
        try:
            # Never a write that can wait: this thread checks every Session, and a server that
            # stopped reading fills its stdin (a writer then waits on it, holding the write
            # lock). A request that cannot leave is one it does not answer, from the first try.
            sent = runtime.proc.try_request_async(probe, {})
        except AppServerFailure:
            return False  # gone: its exit fails the Turns
        if sent is None:
            unsent = runtime.probe_unsent
            if unsent is None or runtime.proc.last_read > unsent:
                runtime.probe_unsent = now
                return False
            if now - unsent < self.stopped_limit:
                return False
            runtime.probe_unsent = None
            self._kill_unresponsive(session, runtime, pid, probe, now)
            return True
        runtime.probe_unsent = None
        runtime.probe, runtime.probe_sent = sent, now
        sent.add_done_callback(lambda f: f.exception())  # observed, never raised
        return False

    def _kill_unresponsive(
        self, session: SessionState, runtime: Runtime, pid: int, probe: str, now: float
    ) -> None:
        """Fail the Turns of an app-server silent past `stopped_limit_s` to its liveness
        request, `provider_unresponsive`, and kill it."""
        error = unresponsive_error(
            self.kind, "app-server", pid, probe, now - runtime.proc.last_read
        )
        self._end_runtime(session, runtime, error)

    def _end_runtime(self, session: SessionState, runtime: Runtime, error: str) -> None:
        """Fail the Turns of an app-server that can never finish them (stopped, or silent to
        the liveness request) with `error`, and kill it. Killed before its Turns are failed,
        so the host's next Turn finds it gone (its pid check) and starts a new one; every
        request still waiting for its answer fails with `error` as it is killed
        (`AppServerProcess.abort`): a `turn/start` it never answered holds its Session's
        operation lock, and the Session's next Turn must not wait out that request's limit."""
        # A `turn/start` waiting on it fails with this reason, not a bare "closed"; its exit,
        # whenever it lands, fails nothing (`_spawn_for`'s `exited`).
        runtime.stopped_error = error
        active = self.events.take_active(session)
        runtime.proc.abort(error)
        self.events.send_failed(session, active, error)


TurnAnswer = Callable[[dict[str, Any] | None, BaseException | None], None]
"""How `AppServerDriver.begin_turn` tells its caller a Turn's start: `(result, None)` or
`(None, error)`."""


def _turn_start_params(session: SessionState, params: Mapping[str, Any]) -> dict[str, Any]:
    text = str(params.get("text") or "")
    return {
        "threadId": session.thread_id,
        "input": [{"type": "text", "text": text, "text_elements": []}],
    }
