"""The Claude Code provider driver: sessions and turns through the pinned `claude-agent-sdk`
(which runs the real bundled Claude Code CLI), and provider-owned forks via `fork_session`.

`ClaudeDriver` here owns the attested verdict and the sessions (each with its own
`CLAUDE_CONFIG_DIR` and private `HOME`, resumed only from its own provider session id). It is
composed of parts wired in its constructor: `Turns` (each turn's CLI process, turns.py) with its
event translator (`ClaudeEvents`, events.py), `Interactions` (interactions.py), the fork
strategy `ClaudeFork` (fork.py) and `ClaudeResolution` (`drivers.claude.resolution`); its
configuration and environment are env.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from domain.enums import ProviderStateBindingMode
from domain.errors import InvalidArgument, NotFound, SessionBusy
from domain.worker_messages import (
    ForkRequest,
    ForkResult,
    ResolveAdopt,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from drivers.base import SERVED_BY, Emit
from drivers.claude.env import (
    DRIVER_KIND,
    PINNED_SDK_VERSION,
    PRIVATE_HOME_DIR,
    QUIET_ENV,
    ClaudeDriverConfig,
    cli_version,
    sdk_version,
    session_env,
)
from drivers.claude.fork import ClaudeFork
from drivers.claude.interactions import Interactions
from drivers.claude.resolution import ClaudeResolution
from drivers.claude.state import SessionState, is_uuid, required
from drivers.claude.tied import TiedCli
from drivers.claude.turns import Turns
from drivers.claude_transcript import history_turns
from drivers.credentials import user_claude_credentials
from drivers.errors import DriverError, FailpointError
from drivers.failpoints import Failpoints
from drivers.runtime_marker import RUNTIME_VAR, RuntimeMarker, end_left_of

SWITCH_INTERVAL_S = 0.0005
"""The worker process's GIL switch interval under this driver (Python's default is 5 ms). The
SDK's loop thread parses the CLI's stream while the worker's link thread waits for the GIL to
send the deltas it was handed: at the default, a burst of stream lines held a delta back by up
to one interval at each hand-over (docs/performance.md, "Claude Code's deltas through the
worker")."""


class ClaudeDriver:
    """`ProviderDriver` for `claude-code`; one instance per worker process.

    Turns run on one private asyncio loop thread (the SDK is async); every other method is
    called from the worker's thread pool and is safe to call concurrently.
    """

    def __init__(self, config: ClaudeDriverConfig, failpoints: Failpoints) -> None:
        self._config = config
        self._failpoints = failpoints
        self._sessions: dict[str, SessionState] = {}
        self._sessions_lock = threading.Lock()
        self._markers: dict[str, RuntimeMarker] = {}
        """Each started Session's runtime marker, from its first start here to its stop."""
        # Where the person's login is, read from the worker's own environment now: a fork
        # points the process env at a Session's config dir while it calls the SDK's helpers
        # (`ClaudeFork._config_env`), and a Session started meanwhile read that dir's copy.
        self._login = user_claude_credentials()
        for key, value in QUIET_ENV.items():
            os.environ[key] = value
        # Process-wide: never raised (a process that asked for a shorter one keeps it).
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="claude-driver-loop", daemon=True
        )
        self._loop_thread.start()
        self.interactions = Interactions(self._loop)
        self.tied = TiedCli(self._cli, config.cli_path)
        self.turns = Turns(config, self._loop, self.interactions, self.tied)
        self.forks = ClaudeFork(failpoints, threading.Lock())
        self.resolution = ClaudeResolution(self.forks)

    def warm_up(self) -> None:
        """What a Session's start and its first Turn import, imported as the worker starts
        (`WorkerServer.preload`): the SDK, its query and its CLI transport (0.6–1.9 s and
        ~70,000 objects on this machine). Loaded here, the worker's start-up freeze
        (`drivers.worker_gc`) takes them out of every later collection, which otherwise walks
        them on the loop thread relaying a Turn's deltas; and a first `session.start` (whose
        CLI lookup imports the SDK) or Turn does not import them. And the script that ties
        every CLI to this worker is written (`TiedCli`: `setpriv`'s lookup, one small exec), so
        the first Turn does not write it."""
        import claude_agent_sdk  # noqa: F401
        from claude_agent_sdk._internal.transport import subprocess_cli  # noqa: F401

        self.tied.cli_path()

    def _user_agent(self) -> str:
        return f"claude-agent-sdk/{sdk_version()} (claude-code {cli_version()})"

    def _verdict(self) -> dict[str, Any]:
        """This driver's attested forkability verdict: the only source of the Host's
        capability (seed 000 §3.2), persisted with the runtime context at session start."""
        return {
            "driverKind": DRIVER_KIND,
            "driverVersion": sdk_version(),
            "userAgent": self._user_agent(),
            "bindingMode": ProviderStateBindingMode.PROVIDER_OWNED.value,
            # Structural capability only (seed §7 Claude 3): the pinned SDK; never a transcript.
            "forkThroughTurn": sdk_version() == PINNED_SDK_VERSION,
            # Full-Session fork: the same checkpoint cut at the newest settled Turn.
            "forkFullSession": sdk_version() == PINNED_SDK_VERSION,
            "binderAvailable": self._placement_available(),
        }

    def _runtime_context(self, provider_session_id: str) -> dict[str, Any]:
        return {
            **self._verdict(),
            # The only resume cursor a Claude session accepts is its own provider session id.
            "resumeCursor": {"resume": provider_session_id},
        }

    def _cli(self) -> str:
        return self._config.cli_path or str(
            Path(str(__import__("claude_agent_sdk").__file__)).parent / "_bundled" / "claude"
        )

    def runtime_generation(self, agent_session_id: str, home: str) -> str | None:
        """The SDK runs in this process, so what an attestation proves changes only
        with the Claude Code CLI it launches: its identity (inode, size, mtime) is the
        generation; an absent or non-executable CLI has none (re-attested, and refused there)."""
        with self._sessions_lock:
            session = self._sessions.get(agent_session_id)
        if session is None or str(session.config_dir) != home:
            return None
        return self._cli_generation()

    def _cli_generation(self) -> str | None:
        """The launched CLI's identity (inode, size, mtime); None: absent or not executable."""
        cli = self._cli()
        try:
            st = os.stat(cli)
        except OSError:
            return None
        if not os.access(cli, os.X_OK):
            return None
        return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    def attest(self, params: Mapping[str, Any]) -> dict[str, Any]:
        cli = self._cli()
        if not os.access(cli, os.X_OK):
            raise DriverError(f"Claude Code CLI is not executable: {cli}")
        verdict = self._verdict()
        # provider_owned needs no host binder: the driver itself places the child's transcript
        # in the child's own home before it answers `accepted`; that placement is what
        # `binderAvailable` reports. Failpoint `worker.binder.available` (`error`) makes the
        # re-attestation say it is unavailable (the fail-closed tests).
        try:
            self._failpoints.hit("worker.binder.available")
        except FailpointError:
            verdict["binderAvailable"] = False
        return verdict

    def _placement_available(self) -> bool:
        """Whether the child-transcript placement (`ClaudeFork.relocate_child`) can run here."""
        return hasattr(os, "replace") and hasattr(os, "fsync")

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        agent_session_id = required(params, "agentSessionId")
        home = Path(required(params, "home"))
        cwd = required(params, "cwd")
        if not os.path.isdir(cwd):
            raise InvalidArgument("cwd", f"cwd is not a directory: {cwd}")
        requested = provider_session_id = str(params.get("providerSessionId") or "")
        if provider_session_id and not is_uuid(provider_session_id):
            raise InvalidArgument("providerSessionId", "a Claude session id is a UUID")
        # A cursor inherited across a fork names the source's session: resuming it would
        # continue in the source's namespace. Only the canonical provider session id counts.
        cursor = (params.get("runtimeContext") or {}).get("resumeCursor") or {}
        dropped = bool(cursor) and cursor.get("resume") != provider_session_id
        if not provider_session_id:
            provider_session_id = str(uuid.uuid4())
        private_home = home / PRIVATE_HOME_DIR
        private_home.mkdir(parents=True, exist_ok=True)
        settings = params.get("settings") or {}
        claude_settings = settings.get("claudeSettings") if isinstance(settings, dict) else None
        session = SessionState(
            agent_session_id=agent_session_id,
            provider_session_id=provider_session_id,
            config_dir=home,
            private_home=private_home,
            cwd=cwd,
            model=str(params.get("model") or self._config.model or "") or None,
            claude_settings=json.dumps(claude_settings) if claude_settings else None,
            env=session_env(self._config, home, private_home, params.get("env") or {}, self._login),
        )
        with self._sessions_lock:
            # One marker from the Session's first start here to its stop, kept by every start
            # in between (a parked CLI's key holds the env: it stays the one to take).
            marker = self._markers.setdefault(agent_session_id, RuntimeMarker())
            session.env[RUNTIME_VAR] = marker.value
            old = self._sessions.get(agent_session_id)
            if not requested and old is not None and (old.config_dir, old.cwd) == (home, cwd):
                # A start naming no id, of a Session this worker holds in the same home: the
                # id this worker chose for it stays. Two preparations of a new Session (a
                # Turn's and a fork's, each sent before the host recorded the other's answer)
                # would otherwise claim two ids, and the host record the one whose answer came
                # last while a Turn writes the transcript of the other.
                provider_session_id = session.provider_session_id = old.provider_session_id
            if old is None or old.active is None:
                self._sessions[agent_session_id] = session
            elif (old.config_dir, old.cwd) == (home, cwd) and requested in (
                "",
                old.provider_session_id,
            ):
                # The host re-prepares a live runtime (fork.create does, while a turn may be
                # running or waiting on an Interaction) so it can answer with its own boundary
                # reason: the running turn keeps its session; the next start applies the rest.
                provider_session_id = old.provider_session_id
            else:
                raise SessionBusy(f"session {agent_session_id} has an active turn")
        # The CLI generation is read before the verdict: the worker stamps the start with it
        # only if it is still the live one after the call (drivers/worker.py `_stamped`), so a
        # new Session's second Turn starts without a `session.start` of its own.
        served = self._cli_generation()
        context = self._runtime_context(provider_session_id)
        if dropped:
            context["droppedResumeCursor"] = dict(cursor)
        result: dict[str, Any] = {
            "providerSessionId": provider_session_id,
            "runtimeContext": context,
        }
        if served is not None:
            result[SERVED_BY] = served
        return result

    def history(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.history {agentSessionId}` → `{turns: [{providerTurnId, userText,
        bindingJson}]}` from the session's own transcript, in its order: what the host
        re-binds a Turn whose binding it never recorded from."""
        session = self._session(required(params, "agentSessionId"))
        try:
            text = session.transcript.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return {"turns": []}  # no turn ever reached the CLI
        except OSError as exc:
            raise DriverError(f"provider history unreadable: {exc}") from exc
        return {"turns": history_turns(text)}

    def stop_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        agent_session_id = required(params, "agentSessionId")
        if params.get("startOnly"):
            # A Claude start spawns no server its stop could find stopped: nothing to end.
            return {}
        with self._sessions_lock:
            session = self._sessions.pop(agent_session_id, None)
            # Taken with the Session, at once: a start that comes while this stop waits for
            # its CLIs (the host's next Turn after a backstop's stop) gets a marker of its own,
            # and the end of what this runtime left below does not kill that start's CLI.
            marker = self._markers.pop(agent_session_id, None)
        active = None
        if session is not None:
            with session.lock:
                session.stopped = True
                active = session.active
            if active is not None:
                self.turns.cancel(active)
        # Answered once its CLI started ahead and its Turn's CLI have ended, killed if they
        # would not (within `turns.CLOSE_BOUND_S`): one still starting, or one that ignored
        # its close, wrote into the Session's home after the host, told it was stopped,
        # removed it (a delete).
        self.turns.forget(agent_session_id, active)
        # Then what its CLIs left (a Bash tool's `setsid … &`): ended before the answer, and
        # by its marker only — the Session's next start here has a new one.
        if marker is not None:
            marker.end_left()
        return {}

    def start_turn(self, params: Mapping[str, Any], emit: Emit) -> dict[str, Any]:
        return self.turns.start(self._session(required(params, "agentSessionId")), params, emit)

    def interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return self.turns.interrupt(self._session(required(params, "agentSessionId")), params)

    def respond_interaction(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(required(params, "agentSessionId"))
        return self.interactions.respond(session, params)

    def fork(self, request: ForkRequest) -> ForkResult:
        return self.forks.fork(request)

    def after_answer(self) -> None:
        """Run by the worker on a request's thread once its answer has left."""
        self.forks.after_answer()

    def _session(self, agent_session_id: str) -> SessionState:
        with self._sessions_lock:
            session = self._sessions.get(agent_session_id)
        if session is None:
            raise NotFound(f"session {agent_session_id} is not started in the Claude worker")
        return session

    # -- fork.resolve (drivers.claude.resolution.py) -----------------------------------------

    def inspect_fork(self, request: ResolveRequest) -> ResolveInspection:
        return self.resolution.inspect(request)

    def adopt_fork(self, request: ResolveAdopt) -> ForkResult:
        return self.resolution.adopt(request)

    def quarantine_fork(self, request: ResolveRequest) -> ResolveQuarantined:
        return self.resolution.quarantine(request)

    def close(self) -> None:
        with self._sessions_lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            if session.active is not None:
                self.turns.cancel(session.active)
        self.turns.close()
        self.forks.spares.close()  # the child homes made ahead and never used
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)
        self.tied.close()
        with self._sessions_lock:
            markers, self._markers = list(self._markers.values()), {}
        end_left_of(markers)  # the worker's shutdown is every Session's stop: one scan for all


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ClaudeDriver:
    """The worker's entry point for `--provider claude-code`."""
    return ClaudeDriver(ClaudeDriverConfig.from_mapping(config), failpoints)
