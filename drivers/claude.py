"""The Claude Code provider driver: sessions and turns through the pinned `claude-agent-sdk`
(which runs the real bundled Claude Code CLI), and provider-owned forks via `fork_session`.

It owns the per-session `CLAUDE_CONFIG_DIR`/private `HOME`, the observed provider Turn identity
(the root user-message UUID) with its checkpoint binding, the Interactions raised by the CLI's
tool-permission requests (`can_use_tool`), and the fork dispositions of seed 000 §7.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from domain.errors import Conflict, InvalidArgument, NotFound, SessionBusy
from drivers.base import (
    DeliveryDisposition,
    Emit,
    ForkBinding,
    ForkChild,
    ForkRequest,
    ForkResult,
    ProviderStateBindingMode,
    TurnOutcome,
)
from drivers.claude_transcript import (
    contains_uuid,
    decode_binding,
    encode_binding,
    history_turns,
    legacy_checkpoint,
    parse_entries,
    split_turns,
    transcript_path,
)
from drivers.credentials import (
    ANTHROPIC_VAR,
    MODEL_AUTH_FAILED,
    MODEL_UNREACHABLE,
    classify_model_failure,
    copy_login,
    model_failure_text,
    truthy,
    user_claude_credentials,
)
from drivers.errors import DriverError, FailpointError
from drivers.failpoints import Failpoints

log = logging.getLogger(__name__)

DRIVER_KIND = "claude-code"
PINNED_SDK_VERSION = "0.2.189"
RECEIPT_SCHEMA_VERSION = 1
PRIVATE_HOME_DIR = "home"
"""The private HOME lives inside the session's provider home, so it dies with the session."""

# Flags that keep the CLI offline apart from the model endpoint (PROVIDERS.md): without them it
# generates titles, pings /api/hello and does DNS lookups.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}

# Streamed system messages that never reach the transcript: they are no checkpoint.
EPHEMERAL_SYSTEM_SUBTYPES = frozenset(
    {
        "init",
        "status",
        "hook_started",
        "hook_progress",
        "hook_response",
        "task_started",
        "task_progress",
        "task_notification",
        "task_updated",
        "api_retry",
        "files_persisted",
    }
)

# The canonical Message kind that marks a provider-native descendant lane in a Turn (the store's
# `storage.fork_snapshot.DESCENDANT_LANE_KIND`; a fork boundary holding one fails closed).
DESCENDANT_LANE_KIND = "descendant_lane"
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)

TURN_START_TIMEOUT_S = 120.0
RESPOND_TIMEOUT_S = 10.0

QUESTION_TOOL = "AskUserQuestion"
"""The CLI's ask-the-user tool: its permission request is a `question`, answered by allowing it
with `answers: {question text: answer}` added to its input (observed with CLI 2.1.332)."""
DECLINED_MESSAGE = "The user declined this tool use."


def is_uuid(value: str) -> bool:
    return bool(_UUID_RE.match(value))


def sdk_version() -> str:
    from claude_agent_sdk import __version__

    return str(__version__)


def cli_version() -> str:
    from claude_agent_sdk._cli_version import __cli_version__

    return str(__cli_version__)


@dataclass(frozen=True, slots=True)
class ClaudeDriverConfig:
    """`[providers.claude-code]` of agenthost.toml, as the worker receives it."""

    model_base_url: str | None = None
    model: str | None = None
    cli_path: str | None = None
    api_key: str | None = None
    """An in-file key (the less safe choice; the daemon requires the file to be 0600)."""
    api_key_env: str = ANTHROPIC_VAR
    """The daemon-env variable holding the key, read when a session's runtime is prepared."""
    use_user_login: bool = False
    """Use the user's own `claude` login (`~/.claude/.credentials.json`) instead of a key."""

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ClaudeDriverConfig:
        def opt(key: str) -> str | None:
            value = config.get(key)
            return str(value) if value else None

        return cls(
            model_base_url=opt("model_base_url"),
            model=opt("model"),
            cli_path=opt("cli_path"),
            api_key=opt("api_key"),
            api_key_env=opt("api_key_env") or ANTHROPIC_VAR,
            use_user_login=truthy(config.get("use_user_login", False)),
        )

    def api_key_value(self) -> str | None:
        """The key this daemon was given (never stored): the in-file one, else the named
        variable of the daemon's own environment."""
        return self.api_key or os.environ.get(self.api_key_env) or None


@dataclass(slots=True)
class _Pending:
    """One tool-permission request the CLI is blocked on, surfaced as an Interaction.

    `answer` lives on the driver's loop and is resolved only there; the CLI's control request
    waits on it, so cancelling it (interrupt, CLI death) unblocks the turn.
    """

    request_id: str
    kind: str  # "approval" | "question"
    tool: str
    tool_input: dict[str, Any]
    answer: asyncio.Future[Any]


@dataclass(slots=True)
class _Turn:
    """The one active turn of a session (mutable: filled in as the CLI streams)."""

    turn_id: str
    emit: Emit
    started: Future[str] = field(default_factory=Future)
    provider_turn_id: str | None = None
    checkpoint: str | None = None
    task: Future[None] | None = None
    transport: Any = None
    interrupted: bool = False
    transcript_offset: int = 0
    pending: dict[str, _Pending] = field(default_factory=dict)  # guarded by the session lock
    lanes: set[str] = field(default_factory=set)  # sidechain lanes already recorded
    # Streaming (include_partial_messages): the API message being streamed, its block kinds,
    # and how many blocks of each API message the settled AssistantMessages have shown.
    model_failure: str | None = None
    """A typed model failure (auth/unreachable) that made us stop the CLI's retries."""
    stream_message_id: str | None = None
    stream_blocks: dict[int, str] = field(default_factory=dict)
    settled_blocks: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Session:
    agent_session_id: str
    provider_session_id: str
    config_dir: Path
    private_home: Path
    cwd: str
    model: str | None
    claude_settings: str | None
    env: dict[str, str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: _Turn | None = None

    @property
    def transcript(self) -> Path:
        return transcript_path(self.config_dir, self.cwd, self.provider_session_id)


class ClaudeDriver:
    """`ProviderDriver` for `claude-code`; one instance per worker process.

    Turns run on one private asyncio loop thread (the SDK is async); every other method is
    called from the worker's thread pool and is safe to call concurrently.
    """

    def __init__(self, config: ClaudeDriverConfig, failpoints: Failpoints) -> None:
        self._config = config
        self._failpoints = failpoints
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        # os.environ is process-wide and the SDK's session helpers read CLAUDE_CONFIG_DIR
        # from it: every helper call that needs a particular config dir holds this lock.
        self._env_lock = threading.Lock()
        for key, value in QUIET_ENV.items():
            os.environ[key] = value
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="claude-driver-loop", daemon=True
        )
        self._loop_thread.start()

    # ---- attestation and sessions -------------------------------------------------------

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
            # Full-Session fork (issue 21): the same checkpoint cut at the newest settled Turn.
            "forkFullSession": sdk_version() == PINNED_SDK_VERSION,
            "binderAvailable": self._placement_available(),
        }

    def _runtime_context(self, provider_session_id: str) -> dict[str, Any]:
        return {
            **self._verdict(),
            # The only resume cursor a Claude session accepts is its own provider session id.
            "resumeCursor": {"resume": provider_session_id},
        }

    def attest(self, params: Mapping[str, Any]) -> dict[str, Any]:
        cli = self._config.cli_path or str(
            Path(str(__import__("claude_agent_sdk").__file__)).parent / "_bundled" / "claude"
        )
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
        """Whether the child-transcript placement (`_relocate_child`) can run here."""
        return hasattr(os, "replace") and hasattr(os, "fsync")

    def _session_env(
        self, config_dir: Path, private_home: Path, extra: Mapping[str, Any]
    ) -> dict[str, str]:
        env = dict(QUIET_ENV)
        env.update({"HOME": str(private_home), "CLAUDE_CONFIG_DIR": str(config_dir)})
        if self._config.use_user_login:
            # The user's own login, copied into this session's config dir; an exported key
            # would take precedence over it in the CLI, so none is passed.
            copy_login(
                user_claude_credentials(),
                config_dir / ".credentials.json",
                provider="claude-code",
            )
            env["ANTHROPIC_API_KEY"] = ""
        else:
            key = self._config.api_key_value()
            # A real key passes through untouched. Without one the CLI still needs a value to
            # start: a placeholder that the endpoint refuses (→ model_auth_failed, fast).
            env["ANTHROPIC_API_KEY"] = key or "unset-no-credential"
        if self._config.model_base_url:
            env["ANTHROPIC_BASE_URL"] = self._config.model_base_url
        env.update({str(k): str(v) for k, v in extra.items()})
        # The session's own dirs always win over anything passed in.
        env.update({"HOME": str(private_home), "CLAUDE_CONFIG_DIR": str(config_dir)})
        return env

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        agent_session_id = _required(params, "agentSessionId")
        home = Path(_required(params, "home"))
        cwd = _required(params, "cwd")
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
        session = _Session(
            agent_session_id=agent_session_id,
            provider_session_id=provider_session_id,
            config_dir=home,
            private_home=private_home,
            cwd=cwd,
            model=str(params.get("model") or self._config.model or "") or None,
            claude_settings=json.dumps(claude_settings) if claude_settings else None,
            env=self._session_env(home, private_home, params.get("env") or {}),
        )
        with self._sessions_lock:
            old = self._sessions.get(agent_session_id)
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
        context = self._runtime_context(provider_session_id)
        if dropped:
            context["droppedResumeCursor"] = dict(cursor)
        return {"providerSessionId": provider_session_id, "runtimeContext": context}

    def stop_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        agent_session_id = _required(params, "agentSessionId")
        with self._sessions_lock:
            session = self._sessions.pop(agent_session_id, None)
        if session is not None and session.active is not None:
            self._cancel(session.active)
        return {}

    def _session(self, agent_session_id: str) -> _Session:
        with self._sessions_lock:
            session = self._sessions.get(agent_session_id)
        if session is None:
            raise NotFound(f"session {agent_session_id} is not started in the Claude worker")
        return session

    # ---- turns ---------------------------------------------------------------------------

    def start_turn(self, params: Mapping[str, Any], emit: Emit) -> dict[str, Any]:
        session = self._session(_required(params, "agentSessionId"))
        turn = _Turn(turn_id=_required(params, "turnId"), emit=emit)
        text = str(params.get("text") or "")
        with session.lock:
            # Two concurrent turns on one Claude session both succeed and branch the
            # transcript (PROVIDERS.md): one at a time, enforced here.
            if session.active is not None:
                raise SessionBusy(f"session {session.agent_session_id} already has an active turn")
            session.active = turn
        turn.task = asyncio.run_coroutine_threadsafe(
            self._run_turn(session, turn, text), self._loop
        )
        try:
            provider_turn_id = turn.started.result(timeout=TURN_START_TIMEOUT_S)
        except FutureTimeout:
            self._cancel(turn)
            raise DriverError("Claude Code did not echo the user message in time") from None
        return {"providerTurnId": provider_turn_id}

    def history(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.history {agentSessionId}` → `{turns: [{providerTurnId, userText,
        bindingJson}]}` from the session's own transcript, in its order: what the host
        re-binds a Turn whose binding it never recorded from (issue 15 defect 1)."""
        session = self._session(_required(params, "agentSessionId"))
        try:
            text = session.transcript.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return {"turns": []}  # no turn ever reached the CLI
        except OSError as exc:
            raise DriverError(f"provider history unreadable: {exc}") from exc
        return {"turns": history_turns(text)}

    def interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(_required(params, "agentSessionId"))
        turn = session.active
        wanted = params.get("providerTurnId")
        if turn is None or (wanted and turn.provider_turn_id not in (None, wanted)):
            raise NotFound("no such active turn", reason="turn_not_found")
        self._cancel(turn)
        return {}

    def respond_interaction(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(_required(params, "agentSessionId"))
        request_id = str(params.get("requestId") or "")
        response = params.get("response")
        if not isinstance(response, Mapping):
            raise InvalidArgument("response", "response must be a map")
        with session.lock:
            turn = session.active
            pending = turn.pending.get(request_id) if turn is not None else None
        if pending is None:
            raise Conflict(
                f"interaction {request_id} is not pending", reason="interaction_not_pending"
            )
        result = _permission_result(pending, response)
        # Resolved on the loop (which owns the future); a request the CLI cancelled or a turn
        # that ended meanwhile is not pending any more, and the caller must hear so.
        resolved = asyncio.run_coroutine_threadsafe(_resolve(pending.answer, result), self._loop)
        try:
            delivered = resolved.result(timeout=RESPOND_TIMEOUT_S)
        except FutureTimeout:
            raise DriverError("the Claude driver loop did not take the answer in time") from None
        if not delivered:
            raise Conflict(
                f"interaction {request_id} is not pending", reason="interaction_not_pending"
            )
        return {}

    async def _can_use_tool(
        self, session: _Session, turn: _Turn, tool: str, tool_input: dict[str, Any], context: Any
    ) -> Any:
        """The SDK's `can_use_tool` callback: raises an Interaction and waits for its answer.

        Runs on the loop thread while the CLI blocks on the permission control request.
        """
        # The host binds an Interaction to a Turn it knows has started at the provider (an
        # interrupt of an unstarted Turn never reaches us): observe the root first.
        self._scan_root(session, turn)
        request_id = str(getattr(context, "tool_use_id", None) or f"claude-{uuid.uuid4()}")
        kind = "question" if tool == QUESTION_TOOL else "approval"
        pending = _Pending(
            request_id, kind, tool, dict(tool_input), asyncio.get_running_loop().create_future()
        )
        with session.lock:
            turn.pending[request_id] = pending
        try:
            turn.emit(
                session.agent_session_id,
                {
                    "type": "interaction.requested",
                    "turnId": turn.turn_id,
                    "requestId": request_id,
                    "kind": kind,
                    "input": _interaction_input(tool, tool_input, context),
                },
            )
            return await pending.answer
        finally:
            with session.lock:
                turn.pending.pop(request_id, None)

    def _cancel(self, turn: _Turn) -> None:
        turn.interrupted = True
        self._loop.call_soon_threadsafe(self._terminate, turn)

    def _terminate(self, turn: _Turn) -> None:
        """Stops the turn's CLI process (on the loop thread, which owns it).

        Killing the process, not cancelling the task: a bare asyncio cancel skips the SDK's
        terminate escalation and leaves the close waiting for the in-flight model call.
        """
        process = getattr(turn.transport, "_process", None)
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        elif turn.task is not None:
            turn.task.cancel()  # not spawned yet: nothing to kill

    def _options(self, session: _Session, turn: _Turn) -> Any:
        from claude_agent_sdk import ClaudeAgentOptions

        async def can_use_tool(tool: str, tool_input: dict[str, Any], context: Any) -> Any:
            return await self._can_use_tool(session, turn, tool, tool_input, context)

        exists = _resumable(session.transcript)
        return ClaudeAgentOptions(
            cwd=session.cwd,
            env=dict(session.env),
            # Resume only from this session's own id, and only once its transcript exists in
            # its own home; a first turn claims the id instead (no source namespace, ever).
            resume=session.provider_session_id if exists else None,
            session_id=None if exists else session.provider_session_id,
            setting_sources=[],
            model=session.model,
            cli_path=self._config.cli_path,
            settings=session.claude_settings,
            # Echo user messages with the UUIDs the CLI persisted: the observed identity.
            extra_args={"replay-user-messages": None},
            # Every tool permission the CLI would ask a person for becomes an Interaction.
            can_use_tool=can_use_tool,
            # Raw stream events: text arrives as it is generated (`message.delta`).
            include_partial_messages=True,
        )

    async def _run_turn(self, session: _Session, turn: _Turn, text: str) -> None:
        from claude_agent_sdk import query
        from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

        outcome = TurnOutcome.FAILED
        error: str | None = None
        try:
            turn.transcript_offset = session.transcript.stat().st_size
        except FileNotFoundError:
            turn.transcript_offset = 0
        watcher = asyncio.ensure_future(self._watch_root(session, turn))
        try:
            options = self._options(session, turn)
            # Our own transport handle (the SDK's default one, pinned version) so an interrupt
            # can stop exactly this turn's CLI process; aclosing stops it on any exit. The
            # transport gets what `query()` would give its own: permission prompts over stdio
            # (the control protocol); `query()` keeps `can_use_tool` and no prompt tool name,
            # or the SDK refuses the pair.
            turn.transport = SubprocessCLITransport(
                prompt=text, options=replace(options, permission_prompt_tool_name="stdio")
            )
            async with contextlib.aclosing(  # type: ignore[type-var] # the SDK's iterator closes
                query(prompt=text, options=options, transport=turn.transport)
            ) as messages:
                async for message in messages:
                    result = self._on_message(session, turn, message)
                    if result is not None:
                        outcome, error = result
            if turn.provider_turn_id is None and error is None:
                error = "Claude Code ended the turn without persisting the user message"
                outcome = TurnOutcome.FAILED
        except asyncio.CancelledError:
            outcome, error = TurnOutcome.INTERRUPTED, None
        except Exception as exc:  # the CLI failed (or was stopped): the worker lives on
            outcome, error = TurnOutcome.FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            watcher.cancel()
            self._drop_pending(session, turn)
        self._finish_turn(session, turn, outcome, error)

    def _drop_pending(self, session: _Session, turn: _Turn) -> None:
        """No answer can reach a CLI that is gone: cancel what it was waiting on (the host
        supersedes the open Interactions when the Turn settles)."""
        with session.lock:
            pending = list(turn.pending.values())
            turn.pending.clear()
        for item in pending:
            item.answer.cancel()

    def _finish_turn(
        self, session: _Session, turn: _Turn, outcome: TurnOutcome, error: str | None
    ) -> None:
        if turn.model_failure is not None:
            error = turn.model_failure
        if turn.provider_turn_id is None:
            # No observed identity: the host learns it from start_turn's failure.
            if not turn.started.done():
                turn.started.set_exception(DriverError(error or "turn did not start"))
            with session.lock:
                session.active = None
            return
        self._reconcile_checkpoint(session, turn)
        with session.lock:
            # Cleared before `turn.completed` so the host's next turn.start is never busy.
            session.active = None
        event: dict[str, Any] = {
            "type": "turn.completed",
            "turnId": turn.turn_id,
            "providerTurnId": turn.provider_turn_id,
            "outcome": TurnOutcome.INTERRUPTED.value if turn.interrupted else outcome.value,
        }
        if error and not turn.interrupted:
            event["error"] = error
        if turn.model_failure is not None and not turn.interrupted:
            event["outcome"], event["error"] = TurnOutcome.FAILED.value, turn.model_failure
        turn.emit(session.agent_session_id, event)

    def _reconcile_checkpoint(self, session: _Session, turn: _Turn) -> None:
        """A streamed checkpoint the transcript does not hold would make fork fail later;
        replace it with the transcript's own last message of this turn."""
        try:
            text = session.transcript.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        assert turn.provider_turn_id is not None
        if turn.checkpoint and contains_uuid(text, turn.checkpoint):
            return
        recomputed = legacy_checkpoint(text, turn.provider_turn_id)
        if recomputed and recomputed != turn.checkpoint:
            self._set_checkpoint(session, turn, recomputed)

    def _observe_root(self, session: _Session, turn: _Turn, root_uuid: str) -> None:
        """Records the observed root user-message UUID: the provider Turn identity."""
        if turn.provider_turn_id is not None:
            return
        turn.provider_turn_id = root_uuid
        turn.emit(
            session.agent_session_id,
            {"type": "turn.started", "turnId": turn.turn_id, "providerTurnId": root_uuid},
        )
        turn.started.set_result(root_uuid)
        self._set_checkpoint(session, turn, root_uuid)

    async def _watch_root(self, session: _Session, turn: _Turn) -> None:
        """Finds the turn's root user message in the transcript as soon as the CLI writes it.

        The CLI persists the prompt before it calls the model but echoes it only with the
        reply, so the transcript is the earliest place the observed UUID appears.
        """
        while not self._scan_root(session, turn):
            await asyncio.sleep(0.02)

    def _scan_root(self, session: _Session, turn: _Turn) -> bool:
        """One look for the root user message past the turn's start offset; True once known."""
        if turn.provider_turn_id is not None:
            return True
        try:
            with open(session.transcript, "rb") as fh:
                fh.seek(turn.transcript_offset)
                tail = fh.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return False
        root = next((e for e in parse_entries(tail) if e.is_root_user), None)
        if root is None:
            return False
        self._observe_root(session, turn, root.uuid)
        return True

    def _set_checkpoint(self, session: _Session, turn: _Turn, message_uuid: str) -> None:
        if turn.checkpoint == message_uuid:
            return
        turn.checkpoint = message_uuid
        turn.emit(
            session.agent_session_id,
            {
                "type": "turn.binding",
                "turnId": turn.turn_id,
                "bindingJson": encode_binding(message_uuid),
            },
        )

    def _on_message(
        self, session: _Session, turn: _Turn, message: Any
    ) -> tuple[TurnOutcome, str | None] | None:
        """Maps one SDK message to turn events; returns the outcome on the ResultMessage."""
        from claude_agent_sdk import (
            AssistantMessage,
            ResultMessage,
            StreamEvent,
            SystemMessage,
            TextBlock,
            ThinkingBlock,
            ToolResultBlock,
            ToolUseBlock,
            UserMessage,
        )

        sid = session.agent_session_id
        if isinstance(message, StreamEvent):
            if message.parent_tool_use_id is None:
                self._on_stream_event(session, turn, message.event)
            return None
        lane = getattr(message, "parent_tool_use_id", None)
        if isinstance(message, (UserMessage, AssistantMessage)) and lane is not None:
            # A sidechain (a Task sub-agent's own conversation): not on the main chain, so not
            # in the canonical history — but recorded once per lane, so a fork boundary that
            # holds it fails closed (seed 000 §4 `descendant_lane_in_boundary`).
            self._record_lane(sid, turn, str(lane))
            return None
        if isinstance(message, UserMessage):
            if not message.uuid:
                return None  # unpersisted: not on the main chain
            blocks = message.content if isinstance(message.content, list) else []
            results = [b for b in blocks if isinstance(b, ToolResultBlock)]
            if turn.provider_turn_id is None and not results:
                self._observe_root(session, turn, message.uuid)
            for result in results:
                turn.emit(
                    sid,
                    {
                        "type": "item",
                        "turnId": turn.turn_id,
                        "item": {
                            "kind": "tool_result",
                            "text": _text_of(result.content),
                            "payload": {
                                "providerToolUseId": result.tool_use_id,
                                "providerMessageUuid": message.uuid,
                            },
                        },
                    },
                )
            if turn.provider_turn_id is not None:
                self._set_checkpoint(session, turn, message.uuid)
        elif isinstance(message, AssistantMessage):
            for block in message.content:
                item: dict[str, Any] | None = None
                if isinstance(block, TextBlock):
                    item = {"kind": "assistant", "text": block.text, "payload": {}}
                elif isinstance(block, ThinkingBlock):
                    item = {"kind": "reasoning", "text": block.thinking, "payload": {}}
                elif isinstance(block, ToolUseBlock):
                    item = {
                        "kind": "tool_call",
                        "text": block.name,
                        "payload": {"providerToolUseId": block.id, "input": block.input},
                    }
                # The CLI settles an API message block by block, in stream order: the n-th block
                # seen for a message id is the stream's content block n (the delta item).
                api_id = str(message.message_id or "")
                index = turn.settled_blocks.get(api_id, 0)
                turn.settled_blocks[api_id] = index + 1
                if item is not None:
                    # provider* keys: the store leaves provider identities untouched when it clones
                    # a Turn (a bare `messageId` would read as a canonical typed reference).
                    item["payload"].update(
                        {
                            "providerMessageUuid": message.uuid,
                            "providerApiMessageId": message.message_id,
                            "providerItemId": f"{api_id}:{index}",
                        }
                    )
                    turn.emit(sid, {"type": "item", "turnId": turn.turn_id, "item": item})
            if message.uuid and turn.provider_turn_id is not None:
                self._set_checkpoint(session, turn, message.uuid)
        elif isinstance(message, SystemMessage):
            if message.subtype == "api_retry":
                self._on_api_retry(turn, message.data)
            msg_uuid = message.data.get("uuid")
            if (
                message.subtype not in EPHEMERAL_SYSTEM_SUBTYPES
                and isinstance(msg_uuid, str)
                and turn.provider_turn_id is not None
            ):
                # A trailing system message (e.g. a Stop hook notice) extends the turn.
                self._set_checkpoint(session, turn, msg_uuid)
        elif isinstance(message, ResultMessage):
            if message.is_error:
                errors = getattr(message, "errors", None) or []
                text = str(message.result or "; ".join(map(str, errors)) or message.subtype)
                return TurnOutcome.FAILED, model_failure_text(
                    "claude-code", self._config.model_base_url, text
                )
            return TurnOutcome.COMPLETED, None
        return None

    @staticmethod
    def _record_lane(sid: str, turn: _Turn, parent_tool_use_id: str) -> None:
        if parent_tool_use_id in turn.lanes:
            return
        turn.lanes.add(parent_tool_use_id)
        item = {
            "kind": DESCENDANT_LANE_KIND,
            "text": None,
            "payload": {
                "descendantLane": True,
                "providerLane": "claude_sidechain",
                "providerParentToolUseId": parent_tool_use_id,
            },
        }
        turn.emit(sid, {"type": "item", "turnId": turn.turn_id, "item": item})

    def _on_api_retry(self, turn: _Turn, data: Mapping[str, Any]) -> None:
        """The CLI retries a refused credential or an unreachable endpoint for minutes: a
        retry whose cause is one of those fails the turn now, naming it."""
        if turn.model_failure is not None:
            return
        status = data.get("error_status")
        detail = json.dumps({k: v for k, v in data.items() if k != "uuid"}, default=str)
        # Classified on the error's own words (numbers such as retry_delay_ms could look like
        # a status), plus the HTTP status.
        reason = classify_model_failure(str(data.get("error") or ""))
        if status in (401, 403):
            reason = MODEL_AUTH_FAILED
        elif status is None and int(data.get("attempt") or 0) >= 2:
            # No HTTP answer at all, twice: the endpoint refuses or does not route (the CLI
            # reports it as `error: "unknown"`; a blip gets one retry).
            reason = MODEL_UNREACHABLE
            detail = f"no HTTP answer (connection failed), retry {data.get('attempt')}: {detail}"
        if reason is None:
            return
        turn.model_failure = (
            f"{reason}: claude-code model endpoint "
            f"{self._config.model_base_url or '(the default Anthropic API)'}: {detail}"
        )
        self._terminate(turn)  # on the loop thread already (messages are read there)

    def _on_stream_event(self, session: _Session, turn: _Turn, event: Mapping[str, Any]) -> None:
        """Raw API stream events → `message.delta` (text and thinking as they arrive)."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            turn.stream_message_id = str(message.get("id") or "")
            turn.stream_blocks = {}
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            turn.stream_blocks[int(event.get("index") or 0)] = str(block.get("type") or "")
        elif kind == "content_block_delta" and turn.stream_message_id is not None:
            delta = event.get("delta") or {}
            index = int(event.get("index") or 0)
            if delta.get("type") == "text_delta":
                text, item_kind = delta.get("text"), "assistant"
            elif delta.get("type") == "thinking_delta":
                text, item_kind = delta.get("thinking"), "reasoning"
            else:
                return
            if isinstance(text, str) and text:
                turn.emit(
                    session.agent_session_id,
                    {
                        "type": "message.delta",
                        "turnId": turn.turn_id,
                        "itemId": f"{turn.stream_message_id}:{index}",
                        "kind": item_kind,
                        "delta": text,
                    },
                )

    # ---- fork ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _config_env(self, config_dir: str, home: str) -> Iterator[None]:
        """Points the process env at one session's config dir for an in-process SDK helper."""
        with self._env_lock, claude_config_env(config_dir, home):
            yield

    def fork(self, request: ForkRequest) -> ForkResult:
        try:
            plan = self._plan_fork(request)
        except _NotStarted as exc:
            return ForkResult.not_started(str(exc))
        try:
            self._failpoints.hit("worker.fork.before_provider_call")
        except Exception as exc:
            return ForkResult.not_started(f"before provider call: {exc}")
        # From here on the SDK may have written a child: every failure is `unknown`, and
        # nothing is ever retried (at most one provider fork call per operation, law 1).
        try:
            child_id = self._call_fork_session(request, plan)
        except Exception as exc:
            return ForkResult.unknown(f"fork_session failed: {type(exc).__name__}: {exc}")
        try:
            self._failpoints.hit("worker.fork.after_provider_call")
            self._relocate_child(request, child_id)
            return self._verify_child(request, plan, child_id)
        except Exception as exc:
            return ForkResult.unknown(
                f"child {child_id} unverified: {type(exc).__name__}: {exc}",
                child=ForkChild(child_id, request.source.provider_session_id, ()),
            )

    def _plan_fork(self, request: ForkRequest) -> _ForkPlan:
        src, tgt = request.source, request.target
        if request.driver_kind and request.driver_kind != DRIVER_KIND:
            raise _NotStarted(f"driver kind {request.driver_kind!r} is not {DRIVER_KIND}")
        if request.driver_version and request.driver_version != sdk_version():
            raise _NotStarted(
                f"driver version changed: frozen {request.driver_version}, now {sdk_version()}"
            )
        if not is_uuid(src.provider_session_id):
            raise _NotStarted(
                f"source provider session id is not a UUID: {src.provider_session_id!r}"
            )
        if not request.provider_turn_ids:
            raise _NotStarted("no provider turn ids: the boundary is unbound")
        if not all(is_uuid(t) for t in request.provider_turn_ids):
            raise _NotStarted("a provider turn id is not an observed Claude UUID")
        if not tgt.home or not src.home or not src.cwd:
            raise _NotStarted("source home, source cwd and target home are required")
        if os.path.realpath(src.home) == os.path.realpath(tgt.home):
            raise _NotStarted("the child needs its own home")
        source_path = transcript_path(src.home, src.cwd, src.provider_session_id)
        if not source_path.is_file():
            raise _NotStarted(f"unknown session {src.provider_session_id}: no transcript")
        bindings = request.extra.get("providerTurnBindings") or []
        boundary_binding = bindings[-1] if len(bindings) == len(request.provider_turn_ids) else None
        checkpoint = decode_binding(boundary_binding if isinstance(boundary_binding, str) else None)
        legacy = checkpoint is None
        text = source_path.read_text(encoding="utf-8", errors="replace")
        if checkpoint is not None and not _holds_message(text, checkpoint):
            # Law 1: fork_session is called at most once per operation, so a checkpoint the
            # transcript does not hold is recomputed *before* that call, never after a refusal.
            checkpoint = None
        if checkpoint is None:
            # A Turn bound before bindings existed (or a stale binding): the transcript's own
            # checkpoint of the boundary Turn.
            checkpoint = legacy_checkpoint(text, request.provider_turn_ids[-1])
            if checkpoint is None:
                raise _NotStarted("boundary turn is not a root user message of the transcript")
        return _ForkPlan(source_path=source_path, checkpoint=checkpoint, legacy=legacy)

    def _call_fork_session(self, request: ForkRequest, plan: _ForkPlan) -> str:
        from claude_agent_sdk import fork_session

        src = request.source
        home = str(Path(src.home) / PRIVATE_HOME_DIR)
        title = request.title or None
        with self._config_env(src.home, home):
            # Exactly one call: any failure from here on (even the SDK's "Message … not
            # found") is `unknown` to the saga and is never retried (seed 000 §7, law 1).
            result = fork_session(
                src.provider_session_id,
                directory=src.cwd,
                up_to_message_id=plan.checkpoint,
                title=title,
            )
        return str(result.session_id)

    def _relocate_child(self, request: ForkRequest, child_id: str) -> None:
        """Moves the child transcript from the source's config dir into the child's own home.

        fork_session writes next to the source; the child must resume from its own home alone.
        Crash-durable: copy to a temp file, fsync, rename, fsync the directory, then unlink.
        """
        src, tgt = request.source, request.target
        written = transcript_path(src.home, src.cwd, child_id)
        dest = transcript_path(tgt.home, src.cwd, child_id)
        data = written.read_bytes()
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            raise FileExistsError(f"child transcript already in target home: {dest}")
        # This move is Claude's provider-state binding: the same crash points as the host_copy
        # binder's copy (PROTOCOL.md), so every worker.bind.* cell of the crash matrix is reached.
        self._failpoints.hit("worker.bind.before_copy")
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, dest)
        _fsync_dir(dest.parent)
        self._failpoints.hit("worker.bind.after_copy")  # copied, not yet removed from the source
        written.unlink()
        _fsync_dir(written.parent)

    def _verify_child(self, request: ForkRequest, plan: _ForkPlan, child_id: str) -> ForkResult:
        """Reads only the child (from the target home): identity, readability, turn mapping."""
        from claude_agent_sdk import get_session_info, get_session_messages

        src, tgt = request.source, request.target
        child = ForkChild(child_id, src.provider_session_id, ())
        if not is_uuid(child_id) or child_id == src.provider_session_id:
            return ForkResult.unknown(f"child id {child_id!r} is not a new UUID", child=child)
        with self._config_env(tgt.home, str(Path(tgt.home) / PRIVATE_HOME_DIR)):
            info = get_session_info(child_id, directory=src.cwd)
            messages = get_session_messages(child_id, directory=src.cwd)
        if info is None or not messages:
            return ForkResult.unknown(
                f"child {child_id} is not readable from its home", child=child
            )
        text = transcript_path(tgt.home, src.cwd, child_id).read_text(encoding="utf-8")
        turns = split_turns(parse_entries(text))
        roots_from = tuple(t.root_forked_from for t in turns)
        if roots_from != request.provider_turn_ids:
            return ForkResult.unknown(
                f"child turns map to {list(roots_from)}, "
                f"expected {list(request.provider_turn_ids)}",
                child=child,
            )
        boundary = turns[-1]
        if boundary.checkpoint_forked_from != plan.checkpoint:
            return ForkResult.unknown("child does not end at the source checkpoint", child=child)
        child = ForkChild(child_id, src.provider_session_id, tuple(t.root_uuid for t in turns))
        turn_bindings = {
            source_turn: {
                "rootProviderTurnId": t.root_uuid,
                "bindingJson": encode_binding(t.checkpoint_uuid),
            }
            for source_turn, t in zip(request.provider_turn_ids, turns, strict=True)
        }
        receipt_body = {
            "schemaVersion": RECEIPT_SCHEMA_VERSION,
            "sourceSessionId": src.provider_session_id,
            "childSessionId": child_id,
            "sourceBoundaryTurnId": request.provider_turn_ids[-1],
            "sourceCanonicalTurnId": request.source_turn_id,
            "childBoundaryTurnId": boundary.root_uuid,
            "sourceCheckpointMessageId": plan.checkpoint,
            "childCheckpointMessageId": boundary.checkpoint_uuid,
        }
        receipt = dict(receipt_body)
        receipt["hash"] = receipt_hash(receipt_body)
        receipt["legacyCheckpoint"] = plan.legacy
        return ForkResult(
            DeliveryDisposition.ACCEPTED,
            child=child,
            binding=ForkBinding(ProviderStateBindingMode.PROVIDER_OWNED, receipt, turn_bindings),
        )

    def close(self) -> None:
        with self._sessions_lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            if session.active is not None:
                self._cancel(session.active)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)


@dataclass(slots=True)
class _ForkPlan:
    source_path: Path
    checkpoint: str
    legacy: bool


class _NotStarted(Exception):
    """A fork precondition failed before any provider call."""


def receipt_hash(body: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of the receipt fields (sorted keys, no spaces)."""
    canonical = json.dumps(dict(body), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def claude_config_env(config_dir: str, home: str) -> Iterator[None]:
    """Sets `CLAUDE_CONFIG_DIR` and `HOME` in `os.environ` for the block (the SDK's in-process
    session helpers read them there), then restores them. Not locked: callers serialise."""
    saved = {k: os.environ.get(k) for k in ("CLAUDE_CONFIG_DIR", "HOME")}
    os.environ["CLAUDE_CONFIG_DIR"] = config_dir
    os.environ["HOME"] = home
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _resumable(transcript: Path) -> bool:
    """Whether the CLI can resume this transcript: it holds a conversation message.

    A CLI SIGKILLed before it flushed a first turn can leave only its queue bookkeeping
    (observed: two `queue-operation` lines); resuming that fails with "No conversation found",
    every turn after. Such a file holds nothing to keep: it is moved aside (never deleted) and
    the next turn claims the session id afresh, as a first turn does.
    """
    try:
        with open(transcript, encoding="utf-8", errors="replace") as fh:
            # Stops at the first message (the third line of a normal transcript): every turn
            # start asks, and transcripts grow without bound.
            if any(e.type in ("user", "assistant") for line in fh for e in parse_entries(line)):
                return True
    except FileNotFoundError:
        return False
    aside = transcript.with_name(f".{transcript.name}.no-messages-{time.time_ns()}")
    os.rename(transcript, aside)
    log.warning("transcript %s holds no message (a CLI died early); moved to %s", transcript, aside)
    return False


def _required(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(key, f"{key} is required")
    return value


async def _resolve(answer: asyncio.Future[Any], result: Any) -> bool:
    """Hands an answer to a waiting permission request; False if it stopped waiting."""
    if answer.done():
        return False
    answer.set_result(result)
    return True


def _holds_message(text: str, message_uuid: str) -> bool:
    """Whether a transcript has an entry whose own `uuid` is `message_uuid` (a scan of the
    text, no JSON parse: the fork's O(1)-ish pre-check of a bound checkpoint)."""
    return re.search(r'"uuid"\s*:\s*"' + re.escape(message_uuid) + '"', text) is not None


def _interaction_input(tool: str, tool_input: Mapping[str, Any], context: Any) -> dict[str, Any]:
    """The Interaction `input` of one permission request: the tool, its input and a human text
    (the Bash command, the question, the plan, else the CLI's own prompt sentence)."""
    out: dict[str, Any] = {"tool": tool, "input": dict(tool_input)}
    for key, attr in (
        ("title", "title"),
        ("description", "description"),
        ("displayName", "display_name"),
        ("blockedPath", "blocked_path"),
        ("decisionReason", "decision_reason"),
    ):
        value = getattr(context, attr, None)
        if isinstance(value, str) and value:
            out[key] = value
    questions = _questions(tool_input)
    if tool == QUESTION_TOOL:
        out["questions"] = questions
        text = questions[0] if questions else ""
    else:
        text = next(
            (
                v
                for v in (
                    tool_input.get("command"),
                    tool_input.get("plan"),
                    out.get("title"),
                    out.get("description"),
                )
                if isinstance(v, str) and v
            ),
            tool,
        )
    out["text"] = text
    return out


def _questions(tool_input: Mapping[str, Any]) -> list[str]:
    """The question texts of an `AskUserQuestion` input, in order."""
    raw = tool_input.get("questions")
    items = raw if isinstance(raw, list) else []
    return [str(q["question"]) for q in items if isinstance(q, Mapping) and "question" in q]


def _permission_result(pending: _Pending, response: Mapping[str, Any]) -> Any:
    """An Interaction response → the SDK's permission result (same rules as the app-server
    drivers: an approval takes `{decision}`, a question `{text}`)."""
    from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

    if pending.kind == "approval":
        decision = response.get("decision")
        if decision not in ("approve", "decline"):
            raise InvalidArgument("response.decision", "decision must be approve or decline")
        if decision == "approve":
            return PermissionResultAllow()
        return PermissionResultDeny(message=DECLINED_MESSAGE)
    text = response.get("text")
    if not isinstance(text, str):
        raise InvalidArgument("response.text", "a question needs a text answer")
    # One answer text answers every question of the request (the Interaction shows the first).
    answers = {question: text for question in _questions(pending.tool_input)}
    return PermissionResultAllow(updated_input={**pending.tool_input, "answers": answers})


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ClaudeDriver:
    """The worker's entry point for `--provider claude-code`."""
    return ClaudeDriver(ClaudeDriverConfig.from_mapping(config), failpoints)
