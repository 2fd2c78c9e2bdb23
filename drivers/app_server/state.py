"""The worker-side state of the generic app-server driver: one app-server process serving one
provider home (`Runtime`), one canonical Session (`SessionState`), a server→client request
awaiting the host's answer (`PendingRequest`), the source turns a fork last read
(`VerifiedTurns`), and the table of started Sessions the driver's parts share (`Sessions`)."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domain.errors import NotFound
from drivers.app_server.process import AppServerProcess, ServerRequest
from drivers.liveness import TreeWatch
from drivers.versions import GateResult

SETTLED_TURN_IDS_KEPT = 16
"""Settled provider turn ids a Session's `turns` map keeps (oldest out first)."""

# Runtime generations: every app-server this worker process starts gets the next one.
_GENERATIONS = itertools.count(1)


@dataclass(slots=True)
class Runtime:
    """One app-server process serving one provider home."""

    proc: AppServerProcess
    home: Path
    user_agent: str
    gate: GateResult
    # Never reused within the process: a respawned app-server is a new generation, so the host
    # re-attests it before the next fork (drivers/worker.py `runtime_generation`).
    generation: int = field(default_factory=lambda: next(_GENERATIONS))
    # Set when the worker killed it for staying stopped (SIGSTOP) or silent: the reason in words.
    stopped_error: str | None = None
    # The liveness request in flight while a Turn runs and the server says nothing, and when it
    # was sent (monotonic).
    probe: Future[dict[str, Any]] | None = None
    probe_sent: float = 0.0
    # Since when the liveness request could not leave without waiting (its stdin full, or
    # another writer waiting on it), None once one left.
    probe_unsent: float | None = None
    # Its process tree, watched for a stopped state (made at the first check).
    watch: TreeWatch | None = None

    @property
    def alive(self) -> bool:
        """Running and usable: not exited, and not killed for staying stopped (its exit may
        not have been seen yet; a Turn sent to it then would fail for nothing)."""
        return self.stopped_error is None and self.proc.alive


@dataclass(slots=True)
class PendingRequest:
    request: ServerRequest
    kind: str
    turn_id: str
    provider_turn_id: str


@dataclass(frozen=True, slots=True)
class VerifiedTurns:
    """The thread's turns as one `thread/read` on `proc` showed them, `(id, status)` in order,
    valid while the Session's `history_generation` is still `generation` (a fork of
    an unchanged source skips its re-read; any turn call or thread notification since then
    makes the next fork read again)."""

    proc: AppServerProcess
    generation: int
    turns: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class SessionState:
    """Worker-side state of one canonical Session (mutable; guarded by its locks)."""

    agent_session_id: str
    home: Path
    cwd: str
    thread_id: str
    model: str | None
    runtime: Runtime | None = None
    # Serializes start/resume/turn-start on this Session; never taken by the reader thread.
    op_lock: threading.Lock = field(default_factory=threading.Lock)
    # Guards the maps below; taken briefly by the reader thread too.
    state_lock: threading.Lock = field(default_factory=threading.Lock)
    awaiting_turn: str | None = None  # canonical turn id whose provider id is not known yet
    turns: dict[str, str] = field(default_factory=dict)  # provider turn id → canonical
    active: set[str] = field(default_factory=set)  # provider turn ids in progress
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    # provider turn id → the typed model failure that made us stop the provider's retries
    model_failures: dict[str, str] = field(default_factory=dict)
    # provider turn ids whose model has sent something of its reply (a delta, an item)
    streamed: set[str] = field(default_factory=set)
    retries: int = 0
    """The provider's own retries seen so far (each one's progress note has its own item id)."""
    last_used: float = field(default_factory=time.monotonic)
    # Bumped (under state_lock) by every call that may change the thread's turns and by every
    # notification about the thread: a `VerifiedTurns` of another generation is stale.
    history_generation: int = 0
    verified_turns: VerifiedTurns | None = None
    # When the idle reaper first saw this Session's app-server stopped during a Turn
    # (monotonic); None while it runs.
    stopped_since: float | None = None
    # The app-server being started for this Session (spawned, its `initialize` or its thread's
    # `thread/start` / `thread/resume` not answered yet): the stop and the liveness check look
    # at it as they look at a runtime (`AppServerDriver._operations_ended`, `_check_starting`).
    starting: AppServerProcess | None = None
    # Its process tree, watched by the idle reaper, and since when it was seen stopped.
    starting_watch: TreeWatch | None = None
    starting_stopped_since: float | None = None

    def forget_settled_turns(self) -> None:
        """Keep `turns` to the active ones and the newest `SETTLED_TURN_IDS_KEPT` others (a
        late notification of a just-settled turn still finds its Turn); the map grew by one
        entry per Turn for the life of the worker. Under `state_lock`."""
        extra = len(self.turns) - len(self.active) - SETTLED_TURN_IDS_KEPT
        if extra <= 0:
            return
        for provider_turn_id in list(self.turns):
            if extra <= 0:
                break
            if provider_turn_id not in self.active:
                del self.turns[provider_turn_id]
                extra -= 1

    def note_delta(self, provider_turn_id: str, streamed: bool) -> str | None:
        """A delta's bookkeeping under one hold of `state_lock`: the thread's history may have
        changed (as `history_changed`), and the canonical Turn of `provider_turn_id`, marked
        as having `streamed` when it did; None when the Turn is not mapped yet (the caller
        claims it: `TurnEvents.claim_turn`)."""
        with self.state_lock:
            self.history_generation += 1
            self.verified_turns = None
            canonical = self.turns.get(provider_turn_id)
            if canonical is not None and streamed:
                self.streamed.add(provider_turn_id)
            return canonical

    def history_changed(self) -> None:
        """Something may have changed the thread's turns: the last fork's read is stale."""
        with self.state_lock:
            self.history_generation += 1
            self.verified_turns = None


class Sessions:
    """The Sessions started in this worker, by canonical id: one table shared by the driver's
    parts (turns, fork, resolution), each entry guarded by its own locks."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._by_id: dict[str, SessionState] = {}
        self._lock = threading.Lock()

    def get(self, agent_session_id: str) -> SessionState | None:
        with self._lock:
            return self._by_id.get(agent_session_id)

    def __getitem__(self, agent_session_id: str) -> SessionState:
        with self._lock:
            return self._by_id[agent_session_id]

    def require(self, agent_session_id: str) -> SessionState:
        session = self.get(agent_session_id)
        if session is None:
            raise NotFound(
                f"session {agent_session_id!r} is not started in the {self._kind} worker"
            )
        return session

    def open(
        self, agent_session_id: str, home: Path, cwd: str, wanted: str, model: str | None
    ) -> tuple[SessionState, SessionState | None]:
        """The Session to start on `home` (and thread `wanted`, if named): the current one when
        it matches, else a new one that replaces it; the replaced one is returned second (its
        app-server is the caller's to close)."""
        with self._lock:
            session = self._by_id.get(agent_session_id)
            if (
                session is not None
                and session.home == home
                and (not wanted or session.thread_id == wanted)
            ):
                return session, None
            fresh = SessionState(agent_session_id, home, cwd, wanted, model)
            self._by_id[agent_session_id] = fresh
            return fresh, session

    def pop(self, agent_session_id: str) -> SessionState | None:
        with self._lock:
            return self._by_id.pop(agent_session_id, None)

    def on_home(self, home: Path) -> bool:
        """Whether a Session started here runs on `home`."""
        with self._lock:
            return any(session.home == home for session in self._by_id.values())

    def all(self) -> list[SessionState]:
        with self._lock:
            return list(self._by_id.values())

    def clear(self) -> list[SessionState]:
        with self._lock:
            sessions = list(self._by_id.values())
            self._by_id.clear()
            return sessions

    def thread_of_runtime(self, runtime: Runtime) -> str | None:
        """The thread of the Session `runtime` serves, or None."""
        with self._lock:
            for session in self._by_id.values():
                if session.runtime is runtime:
                    return session.thread_id
        return None

    def live_runtime_for_home(self, home: Path) -> Runtime | None:
        """A live app-server of some Session on `home` (it attests and reads for that home)."""
        with self._lock:
            for session in self._by_id.values():
                runtime = session.runtime
                if session.home == home and runtime is not None and runtime.alive:
                    return runtime
        return None
