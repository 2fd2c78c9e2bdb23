"""The driver worker process main: `python -m drivers.worker --provider P --connect ipc://…`.

It connects the worker end of the link, dispatches each request to the provider's
`ProviderDriver` on its request lanes (`RequestLane`: a queue and its threads, so turns stream
concurrently), streams turn events as `evt` messages, and exits when told to (SIGTERM) or when
its parent dies.
"""

from __future__ import annotations

# First, before the imports below make their dataclasses: the code of their functions is taken
# from the packages' cache (domain/dataclass_code.py), not compiled again in each worker.
from domain import dataclass_code

dataclass_code.install()

import argparse
import ctypes
import functools
import importlib
import io
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from domain.errors import HostError, InvalidRequest, RuntimeChanged, internal_error
from domain.redaction import Redactor
from domain.stop_signals import StopSignals
from domain.turn_events import TurnCompleted, TurnEvent
from domain.wake_one import WakeOneQueue
from domain.worker_messages import (
    ForkRequest,
    ForkResult,
    ResolveAdopt,
    ResolveRequest,
    history_page,
)
from drivers.base import SERVED_BY, ProviderDriver
from drivers.errors import UnknownProvider
from drivers.failpoints import Failpoints
from drivers.history_cursors import HeldHistory, HistoryCursors
from drivers.history_final import history_final
from drivers.turn_starts import TurnStarts
from drivers.worker_env import ENV_PARENT_PID, ENV_PROVIDER_CONFIG
from drivers.worker_gc import preload_then_freeze
from transport.worker_link import WorkerEnd

WORKER_VERSION = "1"
# This worker process's identity in a runtime generation: a restarted worker never repeats one.
INCARNATION = uuid.uuid4().hex[:12]
log = logging.getLogger("agenthost.worker")

# provider kind → module exposing `create_driver(config, failpoints)`; imported by a thread of
# its own once the worker has said hello (`WorkerServer.preload`), else on first use, so a
# worker's hello is not late and a provider whose driver is missing still answers typed errors.
DRIVER_MODULES: dict[str, str] = {
    "tutti-agent": "drivers.tutti_agent",
    "codex": "drivers.codex.driver",
    "claude-code": "drivers.claude.driver",
}

_PR_SET_PDEATHSIG = 1

# Lanes: a call that may block for long (spawning an app-server, a fork, an
# attestation) runs on the `slow` lane, so 64 of them cannot delay a warm Session's turn or
# an interrupt, which run on the `fast` lane; stopping runtimes has a lane of its own, so
# evictions under the runtime bound never wait behind either.
FAST_METHODS = frozenset(
    {
        "worker.ping",
        "turn.interrupt",
        "interaction.respond",
        "debug.failpoints",
        "debug.hit",
        "debug.emit",
    }
)
WARM_METHODS = frozenset({"session.start", "turn.start"})
"""Fast when the driver says the Session's runtime is live and idle (`is_warm`), else slow."""
LIFECYCLE_METHODS = frozenset({"session.stop"})
LANE_THREADS = {"fast": 16, "lifecycle": 8, "slow": 64}
FORK_SETTLE_S = 60.0
"""How long an unknown fork's resolution waits for that fork, still running here, to return."""


class ForkStillRunning(HostError):
    """An unknown fork's resolution found its fork still running in the worker."""

    code = "conflict"
    default_reason = "fork_still_running"


# The request lanes: a lane is a queue and up to N threads that take requests from it, handed
# to by the link thread itself (no dispatcher thread between the link and the lane, and no
# `ThreadPoolExecutor.submit` on the link thread).
#
# Why not an executor: `ThreadPoolExecutor.submit` takes a lock that every `fork()` in the
# process also takes (concurrent.futures registers it as an at-fork hook) and may start a
# thread; with dozens of app-servers being spawned a submit waited for seconds, which on the
# link thread stopped the heartbeats (measured at 200 Sessions). So requests went through a
# dispatcher thread that submitted: one more thread hand-off on every request's path. Here the
# link thread only takes the lane's own lock (held by a lane thread for a few bytecodes, never
# across a fork or a request) to hand the request to the idle thread that went idle last, or
# to queue it; a lane's threads are started by the lane's own threads: whenever one takes a
# request and leaves no other idle, it starts a spare (up to N) before running it.
#
# The lane's queue is a `domain.wake_one.WakeOneQueue`: each idle thread sleeps on its own
# lock, so a request wakes exactly one: with one `queue.SimpleQueue` all of them waited on, its
# `get` handed the queue's lock on as it returned and the lane's other idle thread woke too, at
# every request (a warm `turn.start` woke both of the fast lane's threads: ~5 wake-ups a Turn
# for one request).


class RequestLane:
    """Runs `handle(msg)` for each `put(msg)` on one of at most `size` threads."""

    def __init__(self, name: str, size: int, handle: Callable[[Any], None]) -> None:
        self.name = name
        self.size = max(1, size)
        self._handle = handle
        self._queue: WakeOneQueue[Any] = WakeOneQueue()
        self._lock = threading.Lock()  # the thread count
        self._threads = 0
        self._spawn()  # one waiting from the start: the first request starts nothing

    def put(self, msg: Any) -> None:
        """Hand one request to the thread idle last, else queue it (any thread; starts no
        thread)."""
        self._queue.put(msg)

    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    @property
    def idle(self) -> int:
        """Threads asleep with no request."""
        return self._queue.waiting

    def _spawn(self) -> None:
        with self._lock:
            if self._threads >= self.size:
                return
            self._threads += 1
            number = self._threads
        threading.Thread(target=self._run, name=f"req-{self.name}-{number}", daemon=True).start()

    def _run(self) -> None:
        get = self._queue.get
        while True:
            msg = get()
            if not self._queue.waiting and self._threads < self.size:
                # The next request finds a thread waiting (started here, never on the link).
                self._spawn()
            try:
                self._handle(msg)
            except Exception:  # noqa: BLE001 - one bad request must not stop the lane
                traceback.print_exc(file=sys.stderr)
            del msg


def install_parent_death_signal(expected_parent: int | None) -> None:
    """Ask Linux to SIGTERM us when the spawning thread dies, and close the race where the parent
    died before we asked; other platforms rely on the parent-pid poller alone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(3)


class WorkerServer:
    """Routes link requests to the driver and answers each with exactly one `res`."""

    def __init__(
        self,
        provider: str,
        config: Mapping[str, Any],
        failpoints: Failpoints,
        *,
        max_threads: int = LANE_THREADS["slow"],
    ) -> None:
        self.provider = provider
        self.config = dict(config)
        self.redactor = Redactor.of_config(self.config)
        """A `model_base_url`'s user and password, taken out of every event, answer and log line
        this worker sends (a provider's own error text may quote the URL)."""
        self.failpoints = failpoints
        self.link: WorkerEnd | None = None
        self._driver: ProviderDriver | None = None
        self._driver_lock = threading.Lock()
        sizes = {**LANE_THREADS, "slow": max_threads}
        self.turn_starts_here = 0
        """Warm `turn.start`s started on the link thread (`_start_turn_here`; `worker.ping`)."""
        self._turn_starts = TurnStarts()
        """The `turn.start`s this worker received that have not ended, recorded on the link
        thread in the link's order, before each is dispatched (`_history`'s finality: a start
        the host sent before a history request reached this worker before it)."""
        self._history_cursors = HistoryCursors()
        self._lanes = {lane: RequestLane(lane, n, self._handle) for lane, n in sizes.items()}
        self._forking: dict[str, threading.Event] = {}
        """The forks this worker's driver is running, by target (`_fork`), each set once it
        returned: an unknown operation's inspect, adopt or quarantine waits for its fork
        (`_settled`)."""
        self._forking_lock = threading.Lock()
        self._methods: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
            "runtime.attest": lambda p: self._stamped(p, self.driver().attest),
            "session.start": self._start_session,
            "session.stop": self._stop_session,
            "turn.interrupt": self._interrupt_turn,
            "session.history": self._history,
            "interaction.respond": self._respond_interaction,
            "fork": self._fork,
            # fork.resolve: inspect / adopt / quarantine an unknown fork's children.
            ResolveRequest.INSPECT: lambda p: (
                self.driver().inspect_fork(self._settled(ResolveRequest.from_wire(p))).to_wire()
            ),
            ResolveAdopt.METHOD: lambda p: self._adopt(ResolveAdopt.from_wire(p)),
            ResolveRequest.QUARANTINE: lambda p: (
                self.driver().quarantine_fork(self._settled(ResolveRequest.from_wire(p))).to_wire()
            ),
            "debug.failpoints": self._set_failpoints,
            "worker.ping": self._ping,
            "debug.sleep": self._sleep,
            "debug.hog": self._hog,
            "debug.hit": self._hit,
            "debug.emit": self._emit_events,
        }

    # -- the runtime generation: re-attest only a runtime that changed ---------------------------

    def runtime_generation(self, agent_session_id: str, home: str) -> str | None:
        """The generation of the Session's live runtime in this worker: this worker process's
        incarnation and the driver's own runtime counter (`runtime_generation(agent_session_id,
        home)`, a new value whenever it (re)spawns or re-attaches the runtime). None when the
        driver has none or no runtime is live: the host then re-attests before every fork."""
        hook = getattr(self.driver(), "runtime_generation", None)
        if hook is None:
            return None
        value = hook(agent_session_id, home)
        return None if value is None else f"{INCARNATION}:{value}"

    def _start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.start`: the driver's start, stamped. Failpoint `worker.session.after_start`:
        the driver has put the Session's runtime in place, its answer not yet sent."""
        result = self._stamped(params, self.driver().start_session)
        self.failpoints.hit("worker.session.after_start")
        return result

    def _stop_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.stop`: the driver's stop. Failpoint `worker.session.before_stop`: a stop in
        the worker, before the driver stops anything (`hang`: one the host's bound on it does
        not see answered)."""
        self.failpoints.hit("worker.session.before_stop")
        return self.driver().stop_session(params)

    def _stamped(
        self,
        params: Mapping[str, Any],
        method: Callable[[Mapping[str, Any]], dict[str, Any]],
    ) -> dict[str, Any]:
        """`session.start` / `runtime.attest` answer with the generation of the runtime whose
        verdict they carry; the host skips the next fork's re-attestation while it holds. Only
        a generation seen both before and after the call is stamped (generations are never
        reused), or one the driver names as the runtime that gave the verdict (`SERVED_BY`,
        a start that spawned its runtime) and still live after the call, so the verdict cannot
        come from a runtime replaced meanwhile. A call that spawned the runtime and names none
        carries none (the next Turn starts it again, the next fork attests it)."""
        sid, home = str(params.get("agentSessionId") or ""), str(params.get("home") or "")
        before = self.runtime_generation(sid, home)
        result = method(params)
        served = result.pop(SERVED_BY, None)
        after = self.runtime_generation(sid, home)
        if after is not None and (
            after == before or (served is not None and after == f"{INCARNATION}:{served}")
        ):
            result = {**result, "runtimeGeneration": after, **self._liveness(sid, home)}
        return result

    def _liveness(self, agent_session_id: str, home: str) -> dict[str, Any]:
        """What lets the host reuse a stamped runtime for the next fork without another
        `session.start`: the pid of the process that is the runtime (the host sees
        its death without a round trip) and how long the driver keeps an idle runtime (the
        host's reuse window stays well inside it). A driver without the hooks gives neither;
        the worker still refuses a fork whose generation is no longer the live one."""
        driver = self.driver()
        # This worker's own pid: the runtime lives in it or under it (tied), so a worker
        # killed a moment ago makes the runtime gone to the host at once (its SIGKILL pending),
        # before its app-server has taken the parent-death signal.
        out: dict[str, Any] = {"workerPid": os.getpid()}
        pid_of = getattr(driver, "runtime_pid", None)
        pid = pid_of(agent_session_id, home) if pid_of is not None else None
        if isinstance(pid, int) and pid > 0:
            out["runtimePid"] = pid
        idle = getattr(driver, "runtime_idle_s", None)
        if isinstance(idle, (int, float)) and idle > 0:
            out["runtimeIdleS"] = float(idle)
        return out

    def _fork(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A fork whose request names the runtime generation its verdict came from is handed
        to the driver only while that runtime is still the live one; otherwise the provider is
        never called and the answer is `not_started` (the host records `failed`)."""
        request = ForkRequest.from_wire(params)
        expected = request.runtime_generation
        if expected is not None:
            current = self.runtime_generation(request.source.agent_session_id, request.source.home)
            if current != expected:
                return ForkResult.not_started(
                    f"runtime changed since its attestation ({expected} -> {current})"
                ).to_wire()
        key, done = request.target.agent_session_id, threading.Event()
        with self._forking_lock:
            self._forking[key] = done
        try:
            return self.driver().fork(request).to_wire()
        finally:
            with self._forking_lock:
                if self._forking.get(key) is done:
                    del self._forking[key]
            done.set()

    def _settled(self, request: ResolveRequest) -> ResolveRequest:
        """`request` once no fork of its target runs in this worker. The host's deadline for a
        fork may pass while the driver still forks (binds, proves, or waits on the provider):
        the operation is `unknown` and may be resolved at once, and a child its fork writes a
        moment after an abandon looked would be no operation's. So the resolution waits for the
        fork to return — its child, if any, is then where inspect and quarantine look — for
        at most `FORK_SETTLE_S`; past it, `ForkStillRunning`: nothing is resolved, and a
        later resolve tries again."""
        with self._forking_lock:
            running = self._forking.get(request.target.agent_session_id)
        if running is not None and not running.wait(FORK_SETTLE_S):
            raise ForkStillRunning(
                f"the fork of operation {request.operation_id} still runs in the worker"
                f" after {FORK_SETTLE_S:.0f} s; resolve it again later"
            )
        return request

    def _adopt(self, request: ResolveAdopt) -> dict[str, Any]:
        self._settled(request.scope)
        return self.driver().adopt_fork(request).to_wire()

    def _start_turn(self, req_id: int, params: Mapping[str, Any]) -> dict[str, Any]:
        """A Turn the host sends to the warm runtime it last prepared, without `session.start`,
        names that runtime's generation: it is handed to the driver only
        while that runtime is still the live one; otherwise it is refused (`RuntimeChanged`)
        before the provider sees anything, and the host prepares the runtime and sends it
        again. (A runtime that dies after this check is respawned by the driver, as it would
        be after a `session.start`.) A failure before the driver is handed it is a refused
        start (`TurnStarts`: it has ended)."""
        self.failpoints.hit("worker.turn.before_start")
        expected = params.get("runtimeGeneration")
        if expected is not None:
            current = self.runtime_generation(
                str(params.get("agentSessionId") or ""), str(params.get("home") or "")
            )
            if current != expected:
                raise RuntimeChanged(
                    f"runtime changed since the host prepared it ({expected} -> {current})"
                )
        driver = self.driver()
        self._turn_starts.handed(req_id)
        return driver.start_turn(params, self.emit)

    def driver(self) -> ProviderDriver:
        with self._driver_lock:
            if self._driver is None:
                module_name = DRIVER_MODULES.get(self.provider)
                if module_name is None:
                    raise UnknownProvider(f"no driver for provider {self.provider!r}")
                try:
                    module = importlib.import_module(module_name)
                except ImportError as exc:
                    raise UnknownProvider(
                        f"driver for provider {self.provider!r} is not available: {exc}"
                    ) from exc
                self._driver = module.create_driver(self.config, self.failpoints)
            return self._driver

    def preload(self) -> None:
        """Load the driver (and what its first runtime start and fork import: the driver's
        `warm_up`) as the worker starts, on a thread of its own, so the first request does
        not wait for the imports. A driver that cannot load is left for the first request to
        report, typed, as before: nothing is logged here beyond a debug line."""
        try:
            driver = self.driver()
            warm_up = getattr(driver, "warm_up", None)
            if warm_up is not None:
                warm_up()
        except Exception as exc:  # noqa: BLE001 - the first request reports it
            log.debug("driver of %s not preloaded: %s", self.provider, exc)

    def emit(self, agent_session_id: str, event: TurnEvent) -> None:
        """Send one turn event: a driver hands a typed `TurnEvent`, serialised here, at the edge
        of the worker (`to_wire`, the map of internals.md key for key); the host reads it back
        with `turn_event_from_wire` once, at its end of the link."""
        if type(event) is TurnCompleted:
            # The Turn's provider turn is over: its start has ended once answered.
            self._turn_starts.ended(agent_session_id, event.turn_id)
        if self.link is None:
            return
        wire = event.to_wire()
        if self.redactor.active:
            wire = self.redactor.value(wire)
        self.link.send_event(agent_session_id, wire)

    def on_request(self, msg: dict[str, Any]) -> None:
        """Called on the link thread, which also sends the heartbeats: never block it. It
        picks the lane and puts the request there (`RequestLane.put`, a lock-free C call that
        starts no thread: the lanes' comment says why that matters), so a request reaches
        its lane's thread in one hand-off."""
        try:
            if msg.get("method") == "debug.failpoints":
                # Armed before any later request is dispatched: a fault-injection test arms a
                # point, then sends the call it must hit, and the lanes' threads would
                # otherwise race the two.
                self._handle(msg)
                return
            if msg.get("method") == "turn.start":
                params = msg.get("params")
                if isinstance(params, dict):
                    self._turn_starts.received(msg.get("id"), params)
                if self._start_turn_here(msg):
                    return
            self._lanes[self.lane_of(msg)].put(msg)
        except Exception:  # noqa: BLE001 - one bad request must not stop the link
            traceback.print_exc(file=sys.stderr)

    def _start_turn_here(self, msg: Mapping[str, Any]) -> bool:
        """A warm `turn.start` started on the link thread itself, with no lane between the
        link and the provider: the driver's `begin_turn` writes the provider's request without
        waiting (or declines, having done nothing), and its answer is sent from the thread
        that completes it (the app-server's reader). False — the lane runs it, as ever — when
        the driver has no `begin_turn`, any failpoint is armed (each fires where it always
        has, on the lane), the runtime is not the one the host named, or the driver declines.
        Two hand-offs fewer a Turn: link → lane, and the answer's reader → lane."""
        driver = self._driver  # never import a driver on the link thread
        begin = getattr(driver, "begin_turn", None)
        req_id, params = msg.get("id"), msg.get("params")
        if (
            begin is None
            or self.failpoints.armed
            or not isinstance(req_id, int)
            or not isinstance(params, dict)
        ):
            return False
        self.failpoints.hit("worker.turn.before_start")  # nothing armed: no action (a stamp)
        expected = params.get("runtimeGeneration")
        if expected is not None and expected != self.runtime_generation(
            str(params.get("agentSessionId") or ""), str(params.get("home") or "")
        ):
            return False  # refused on the lane, typed (`RuntimeChanged`)
        answer = functools.partial(self._answer, req_id, "turn.start")
        self._turn_starts.handed(req_id)  # before `begin`: its answer may come before it returns
        try:
            if not begin(params, self.emit, answer):
                self._turn_starts.handed(req_id, False)  # it sent nothing
                return False
        except Exception:  # noqa: BLE001 - it raises only before it wrote: the lane runs it
            traceback.print_exc(file=sys.stderr)
            self._turn_starts.handed(req_id, False)
            return False
        self.turn_starts_here += 1
        return True

    def lane_of(self, msg: Mapping[str, Any]) -> str:
        method = msg.get("method")
        if method in FAST_METHODS:
            return "fast"
        if method in LIFECYCLE_METHODS:
            return "lifecycle"
        if method in WARM_METHODS:
            driver = self._driver  # never import a driver on the link thread
            is_warm = getattr(driver, "is_warm", None)
            params = msg.get("params")
            if is_warm is not None and isinstance(params, Mapping):
                try:
                    if is_warm(str(method), params):
                        return "fast"
                except Exception:  # noqa: BLE001 - a wrong guess only costs the slow lane
                    traceback.print_exc(file=sys.stderr)
        return "slow"

    def _handle(self, msg: dict[str, Any]) -> None:
        assert self.link is not None
        req_id = msg.get("id")
        method = msg.get("method")
        params = msg.get("params")
        if not isinstance(req_id, int):
            return  # cannot be answered; the host times it out
        try:
            if not isinstance(method, str) or not isinstance(params, dict):
                raise InvalidRequest("malformed worker request", reason="malformed_request")
            if method == "turn.start":
                # Not in `_methods`: its start is told apart by its request id (`TurnStarts`).
                result = self._start_turn(req_id, params)
            else:
                handler = self._methods.get(method)
                if handler is None:
                    raise InvalidRequest(
                        f"unknown worker method {method!r}", reason="unknown_method"
                    )
                result = handler(params)
        except Exception as exc:  # noqa: BLE001 - answered, typed
            self._answer(req_id, method, None, exc)
        else:
            self._answer(req_id, method, result, None)
        if method == "fork":
            # Work the driver left for after the answer (the next fork's home made ahead).
            self.driver().after_answer()

    def _answer(
        self,
        req_id: int,
        method: object,
        result: Mapping[str, Any] | None,
        error: BaseException | None,
    ) -> None:
        """Send a request's one answer: its result, or its failure typed."""
        assert self.link is not None
        if method == "turn.start":
            self._turn_starts.answered(req_id, error)
        shown = self.redactor.value if self.redactor.active else _same
        if error is None:
            self.link.send_result(req_id, shown(result or {}))
        elif isinstance(error, HostError):
            self.link.send_error(req_id, shown(error.to_wire()))
        else:  # a driver bug must still answer, typed (law 7)
            # Its text and traceback go to the worker's log (the daemon's run dir) under a
            # reference id; the answer, which may reach a client, carries only the reference.
            failure = internal_error(error, f"{self.provider} worker method {method}", logger=log)
            self.link.send_error(req_id, shown(failure.to_wire()))

    def _history(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The provider's own turn history, for drivers that can read it (app-servers).

        `final`: the history holds every Turn the provider will ever have of a start —
        judged before the read: every `turn.start` of the Session this worker received has
        ended (`TurnStarts`: answered and its provider turn over, or refused; the link is
        ordered, so every start the host sent before this request is counted), and no process
        outside this worker that may hold one it never received is alive (`history_final`: an
        earlier worker of the provider, a provider process of the Session's `home`; it waits a
        moment for those already exiting — a Claude Code CLI a killed worker parked). Without
        `home`, or unsure, it is not final.

        Paged (`history_page`): the Turns from `afterIndex` (default 0) that fit a page, and
        `nextIndex` when more follow — a long history answered whole would pass the link's
        frame bound, and a frame past it never reaches the host. The read is held for the next
        pages under the `historyCursor` the answer names (`HistoryCursors`: a short time, a
        few at once): one `session.history` reads the provider once. A page asked with a
        cursor no longer held is answered from a new read."""
        after = params.get("afterIndex", 0)
        if type(after) is not int or after < 0:
            raise InvalidRequest("afterIndex must be a non-negative integer")
        cursor = params.get("historyCursor")
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidRequest("historyCursor must be a string")
        held = self._history_cursors.take(cursor) if cursor else None
        if held is None:
            held = self._read_history(params)
            cursor = None
        page, next_index = history_page(held.turns, after)
        out = {**held.answer, "turns": page, "final": held.final}
        if next_index is None:
            if cursor:
                self._history_cursors.drop(cursor)
            return out
        out["nextIndex"] = next_index
        out["historyCursor"] = cursor or self._history_cursors.hold(held)
        return out

    def _read_history(self, params: Mapping[str, Any]) -> HeldHistory:
        """The driver's history of the Session, and its `final` judged before the read."""
        # `error`/`kill` here: the host's re-bind at a cold start gets no history this time.
        self.failpoints.hit("worker.history.before_read")
        history = getattr(self.driver(), "history", None)
        if history is None:
            raise InvalidRequest(
                f"{self.provider} cannot list its history", reason="history_unsupported"
            )
        sid, home = str(params.get("agentSessionId") or ""), str(params.get("home") or "")
        final = (
            bool(home)
            and not self._turn_starts.open(sid)
            and history_final(self.provider, home)
            # Asked again: the judge may have waited for processes already exiting.
            and not self._turn_starts.open(sid)
        )
        answer = history(params)
        raw = answer.get("turns")
        turns: Sequence[Mapping[str, Any]] = raw if isinstance(raw, list) else []
        rest = {k: v for k, v in answer.items() if k != "turns"}
        return HeldHistory(answer=rest, turns=turns, final=final)

    def _interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]:
        interrupted = self.driver().interrupt_turn(params)
        # `sleep` here lets the provider's end of the Turn reach the host before this reply.
        self.failpoints.hit("worker.turn.after_interrupt")
        return interrupted

    def _respond_interaction(self, params: Mapping[str, Any]) -> dict[str, Any]:
        answered = self.driver().respond_interaction(params)
        # `sleep` here lets the provider's end of the Turn reach the host before this reply.
        self.failpoints.hit("worker.interaction.after_answer")
        return answered

    def _set_failpoints(self, params: Mapping[str, Any]) -> dict[str, Any]:
        points = params.get("points")
        if not isinstance(points, dict):
            raise InvalidRequest("points must be a map")
        # False from the supervisor: it cleared the shared `once:` markers as it armed.
        clear = params.get("clearMarkers", True)
        if not isinstance(clear, bool):
            raise InvalidRequest("clearMarkers must be a boolean")
        try:
            armed = {str(k): str(v) for k, v in points.items()}
            return {"points": self.failpoints.set(armed, clear_markers=clear)}
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc

    def _ping(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "provider": self.provider,
            "version": WORKER_VERSION,
            # Whether the driver is loaded (by `preload` as the worker started, or by a request).
            "driverLoaded": self._driver is not None,
            "turnStartsHere": self.turn_starts_here,
            # What the provider keeps per Session home (None: the driver keeps nothing so).
            "providerHomes": getattr(self._driver, "provider_homes", None),
        }

    def _sleep(self, params: Mapping[str, Any]) -> dict[str, Any]:
        ms = int(params.get("ms", 0))
        time.sleep(ms / 1000)
        return {"sleptMs": ms}

    def _hog(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Burn CPU while holding the GIL for `ms` (tests of the watchdog: a busy worker whose
        heartbeat thread is starved must not be taken for a hung one)."""
        ms = int(params.get("ms", 0))
        previous = sys.getswitchinterval()
        sys.setswitchinterval(ms / 1000 + 1.0)  # no other thread runs until we are done
        try:
            deadline = time.monotonic() + ms / 1000
            spins = 0
            while time.monotonic() < deadline:
                spins += 1
        finally:
            sys.setswitchinterval(previous)
        return {"spins": spins}

    def _hit(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Hit a named failpoint, so tests can exercise kill/error/sleep/once on a live worker."""
        self.failpoints.hit(str(params.get("name", "")))
        return {"pid": os.getpid()}

    def _emit_events(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Stream the given events for a session (tests of the event path without a provider)."""
        sid = str(params.get("agentSessionId", ""))
        events = params.get("events") or []
        if self.link is not None:
            # Sent as given, untyped: this exercises the link itself (order, before the result).
            for event in events:
                self.link.send_event(sid, dict(event))
        return {"emitted": len(events)}

    def close(self) -> None:
        with self._driver_lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            try:
                driver.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)


def _watch_parent(parent: int, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        if os.getppid() != parent:
            stop.set()
            return


def _same(value: Any) -> Any:
    return value


class RedactingStream(io.TextIOBase):
    """A text stream that writes what it is given with a `Redactor`'s secrets taken out."""

    def __init__(self, inner: TextIO, redactor: Redactor) -> None:
        self._inner = inner
        self._redactor = redactor

    def write(self, text: str) -> int:
        self._inner.write(self._redactor.text(text))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def fileno(self) -> int:
        return self._inner.fileno()

    def writable(self) -> bool:
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drivers.worker")
    parser.add_argument("--provider", required=True)
    parser.add_argument("--connect", required=True)
    args = parser.parse_args(argv)

    parent_env = os.environ.get(ENV_PARENT_PID)
    parent = int(parent_env) if parent_env and parent_env.isdigit() else os.getppid()
    install_parent_death_signal(parent)

    stop = threading.Event()
    # `domain.stop_signals`: the handlers only record the signal (one taking the Event's lock
    # could deadlock with the main thread inside `stop.wait()`); a signal wakes the loop at once.
    stops = StopSignals((signal.SIGTERM, signal.SIGINT))
    threading.Thread(target=_watch_parent, args=(parent, stop), daemon=True).start()

    config = json.loads(os.environ.get(ENV_PROVIDER_CONFIG) or "{}")
    server = WorkerServer(args.provider, config, Failpoints.from_env())
    if server.redactor.active:
        # Every log line and traceback this worker writes (its stderr is the daemon's log).
        sys.stderr = RedactingStream(sys.stderr, server.redactor)
    link = WorkerEnd(
        args.connect, provider=args.provider, version=WORKER_VERSION, on_request=server.on_request
    )
    server.link = link
    link.start()
    # After the hello is on its way: the driver loads while the host has nothing to ask yet.
    threading.Thread(
        target=preload_then_freeze, args=(server.preload,), name="driver-preload", daemon=True
    ).start()
    stops.wait(stop.is_set, 0.2)
    server.close()
    link.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Request threads may be blocked in a provider call or a `hang` failpoint; do not wait.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
