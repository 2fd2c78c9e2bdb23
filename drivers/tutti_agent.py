"""The tutti-agent driver: one live `tutti-agent app-server` per active Session (its own
`TUTTI_AGENT_HOME`, private HOME and TMPDIR), turns streamed as the turn events of internals.md,
and the through-turn fork of seed 000 §7/§7.1 with the `host_copy` rollout binder.

`AppServerDriver` holds everything a Codex-style app-server shares (the Codex driver subclasses
it); `TuttiAgentDriver` fixes the command, the home variable and the version gate.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from domain.errors import Conflict, HostError, InvalidArgument, NotFound, SessionBusy
from drivers.app_server import (
    AppServerClosed,
    AppServerFailure,
    AppServerProcess,
    AppServerTimeout,
    JsonRpcError,
    ServerRequest,
    private_env,
)
from drivers.base import (
    DeliveryDisposition,
    Emit,
    ForkBinding,
    ForkChild,
    ForkRequest,
    ForkResult,
    ProviderDriver,
    ProviderStateBindingMode,
    TurnOutcome,
)
from drivers.binder import BinderError, RolloutBinder
from drivers.credentials import (
    classify_model_failure,
    credential_plan,
    file_key_env,
    model_failure_text,
)
from drivers.errors import DriverError, FailpointError
from drivers.failpoints import Failpoints
from drivers.readability import ReaderNotApplicable, prove_tutti_child
from drivers.versions import TUTTI_AGENT_GATE, GateResult, VersionGate

CLIENT_NAME = "agenthost"
CLIENT_VERSION = "0.1.0"

APPROVAL_METHODS = frozenset(
    {
        "item/commandExecution/requestApproval",
        "item/fileChange/requestApproval",
        "item/permissions/requestApproval",
        "execCommandApproval",
        "applyPatchApproval",
    }
)
QUESTION_METHODS = frozenset({"item/tool/requestUserInput"})
_DELTA_METHODS = {
    "item/agentMessage/delta": "assistant",
    "item/reasoning/summaryTextDelta": "reasoning",
    "item/reasoning/textDelta": "reasoning",
}
READABILITY_IN_WORKER = "in_worker"
"""The bound child is proven readable by the provider's own reader inside the worker."""
READABILITY_APP_SERVER = "app_server"
"""... by a fresh app-server spawned on the target home (the fallback)."""
_OUTCOMES = {
    "completed": TurnOutcome.COMPLETED,
    "interrupted": TurnOutcome.INTERRUPTED,
    "failed": TurnOutcome.FAILED,
}


@dataclass(slots=True)
class _Runtime:
    """One app-server process serving one provider home."""

    proc: AppServerProcess
    home: Path
    user_agent: str
    gate: GateResult


@dataclass(slots=True)
class _Pending:
    request: ServerRequest
    kind: str
    turn_id: str
    provider_turn_id: str


@dataclass(slots=True)
class _Session:
    """Worker-side state of one canonical Session (mutable; guarded by its locks)."""

    agent_session_id: str
    home: Path
    cwd: str
    thread_id: str
    model: str | None
    runtime: _Runtime | None = None
    # Serializes start/resume/turn-start on this Session; never taken by the reader thread.
    op_lock: threading.Lock = field(default_factory=threading.Lock)
    # Guards the maps below; taken briefly by the reader thread too.
    state_lock: threading.Lock = field(default_factory=threading.Lock)
    awaiting_turn: str | None = None  # canonical turn id whose provider id is not known yet
    turns: dict[str, str] = field(default_factory=dict)  # provider turn id → canonical
    active: set[str] = field(default_factory=set)  # provider turn ids in progress
    pending: dict[str, _Pending] = field(default_factory=dict)
    # provider turn id → the typed model failure that made us stop the provider's retries
    model_failures: dict[str, str] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)


def _text_of(item: Mapping[str, Any], key: str) -> str:
    parts = item.get(key)
    if isinstance(parts, str):
        return parts
    out: list[str] = []
    for part in parts or []:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return "\n".join(out)


# App-server ThreadItem types that open a provider-native descendant lane (a sub-agent thread
# or a collaboration with another agent): recorded with `descendantLane: true`, so a fork
# boundary that holds one fails closed (seed 000 §4 `descendant_lane_in_boundary`).
DESCENDANT_LANE_ITEM_TYPES = frozenset({"collabAgentToolCall", "collabToolCall", "subAgent"})


def map_item(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A completed app-server ThreadItem → the `item` payloads of internals.md turn events."""
    kind = item.get("type")
    item_id = item.get("id")
    base = {"providerItemId": item_id, "providerItemType": kind}
    if kind in DESCENDANT_LANE_ITEM_TYPES:
        lane = {**base, "descendantLane": True, "item": dict(item)}
        return [{"kind": str(kind), "text": None, "payload": lane}]
    if kind == "userMessage":
        text = "\n".join(
            str(c.get("text", ""))
            for c in item.get("content") or []
            if isinstance(c, Mapping) and c.get("type") == "text"
        )
        return [{"kind": "user", "text": text, "payload": base}]
    if kind == "agentMessage":
        return [{"kind": "assistant", "text": str(item.get("text") or ""), "payload": base}]
    if kind == "reasoning":
        text = "\n".join(t for t in (_text_of(item, "summary"), _text_of(item, "content")) if t)
        return [{"kind": "reasoning", "text": text, "payload": base}]
    if kind == "commandExecution":
        call = {**base, "command": item.get("command"), "cwd": item.get("cwd")}
        result = {
            **base,
            "status": item.get("status"),
            "exitCode": item.get("exitCode"),
        }
        return [
            {"kind": "tool_call", "text": str(item.get("command") or ""), "payload": call},
            {
                "kind": "tool_result",
                "text": str(item.get("aggregatedOutput") or ""),
                "payload": result,
            },
        ]
    if kind in ("dynamicToolCall", "mcpToolCall"):
        call = {**base, "tool": item.get("tool"), "arguments": item.get("arguments")}
        output = _text_of(item, "contentItems") if kind == "dynamicToolCall" else ""
        if kind == "mcpToolCall" and item.get("result") is not None:
            output = json.dumps(item.get("result"))
        result = {**base, "status": item.get("status"), "success": item.get("success")}
        return [
            {"kind": "tool_call", "text": str(item.get("tool") or ""), "payload": call},
            {"kind": "tool_result", "text": output, "payload": result},
        ]
    return [{"kind": str(kind or "unknown"), "text": None, "payload": {**base, "item": dict(item)}}]


def _turn_ids(turns: Any) -> list[str]:
    return [str(t.get("id")) for t in turns or [] if isinstance(t, Mapping)]


class AppServerDriver:
    """A `ProviderDriver` for Codex-style app-servers; subclasses set the class attributes."""

    kind: ClassVar[str] = ""
    home_var: ClassVar[str] = ""
    gate: ClassVar[VersionGate]
    binding_mode: ClassVar[ProviderStateBindingMode] = ProviderStateBindingMode.HOST_COPY

    def __init__(self, config: Mapping[str, Any], failpoints: Failpoints) -> None:
        self.config = dict(config)
        self.failpoints = failpoints
        self.binder = RolloutBinder(failpoints)
        self.request_timeout = float(self.config.get("request_timeout_s", 30.0))
        self.fork_timeout = float(self.config.get("fork_timeout_s", 60.0))
        self.idle_timeout = float(self.config.get("idle_timeout_s", 300.0))
        self.verify_bound_child = bool(self.config.get("verify_bound_child", True))
        self.readability_proof = str(
            self.config.get("readability_proof") or READABILITY_IN_WORKER
        )
        if self.readability_proof not in (READABILITY_IN_WORKER, READABILITY_APP_SERVER):
            raise InvalidArgument(
                "readability_proof",
                f"readability_proof must be {READABILITY_IN_WORKER} or {READABILITY_APP_SERVER}",
            )
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._emit: Emit | None = None
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap_idle, name="idle-reaper", daemon=True)
        self._reaper.start()

    # ------------------------------------------------------------------ process

    def command(self) -> list[str]:
        raise NotImplementedError

    def extra_env(self, home: Path) -> dict[str, str]:
        env = self.config.get("env") or {}
        return {str(k): str(v) for k, v in env.items()}

    def prepare_home(self, home: Path) -> None:
        """Provider-specific files in a fresh home (Codex writes its config.toml here)."""

    def endpoint(self) -> str | None:
        """The model endpoint named in a model failure."""
        base = self.config.get("model_base_url")
        return str(base) if base else None

    def _spawn(self, home: Path, cwd: str | None, session: _Session | None) -> _Runtime:
        home.mkdir(parents=True, exist_ok=True)
        self.prepare_home(home)
        env = private_env(None, self.home_var, home, self.extra_env(home))
        proc = AppServerProcess(
            self.command(),
            env=env,
            cwd=cwd if cwd and Path(cwd).is_dir() else str(home),
            on_notification=(
                (lambda m, p: self._on_notification(session, m, p)) if session else None
            ),
            on_server_request=(lambda r: self._on_server_request(session, r)) if session else None,
            on_exit=(lambda reason: self._on_exit(session, reason)) if session else None,
            stderr_path=home / ".app-server.log",
        )
        try:
            proc.start()
            init = proc.initialize(CLIENT_NAME, CLIENT_VERSION, timeout=self.request_timeout)
        except AppServerFailure as exc:
            proc.close(1.0)
            raise DriverError(
                f"{self.kind} app-server failed to start: {exc} {proc.stderr_tail()}".strip(),
                reason="provider_start_failed",
            ) from exc
        user_agent = str(init.get("userAgent") or "")
        return _Runtime(proc, home, user_agent, self.gate.check(user_agent))

    def _verdict(self, runtime: _Runtime) -> dict[str, Any]:
        """This driver's attested forkability verdict (brand, version gate, binder): the only
        source of the Host's capability (seed 000 §3.2), persisted with the runtime context."""
        return {
            "driverKind": self.kind,
            "driverVersion": runtime.gate.version,
            "userAgent": runtime.user_agent,
            "bindingMode": self.binding_mode.value,
            # Measured, not assumed: the saga refuses a host_copy fork unless this is `True`.
            "binderAvailable": self.binder.available(),
            "forkThroughTurn": runtime.gate.fork_through_turn,
            # Full-Session fork is the same exact-prefix fork at the newest settled Turn.
            "forkFullSession": runtime.gate.fork_through_turn,
        }

    def _attestation(self, runtime: _Runtime) -> dict[str, Any]:
        return self._verdict(runtime)

    # ------------------------------------------------------------------ port methods

    def attest(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The dispatch-time re-attestation; failpoint `worker.binder.available` armed with
        `error` makes it report the binder unavailable (the fail-closed tests)."""
        verdict = dict(self._probe(params))
        try:
            self.failpoints.hit("worker.binder.available")
        except FailpointError:
            verdict["binderAvailable"] = False
        return verdict

    def _probe(self, params: Mapping[str, Any]) -> dict[str, Any]:
        home = Path(str(params.get("home") or ""))
        if not str(home) or not home.is_absolute():
            raise InvalidArgument("home", "home must be an absolute path")
        live = self._live_runtime_for_home(home)
        if live is not None:
            return self._attestation(live)
        runtime = self._spawn(home, str(params.get("cwd") or ""), None)
        try:
            return self._attestation(runtime)
        finally:
            runtime.proc.close()

    def is_warm(self, method: str, params: Mapping[str, Any]) -> bool:
        """True when `method` will not spawn or wait: the Session's app-server is live, on the
        same home and thread, and no other operation holds it (the worker's fast lane)."""
        sid = str(params.get("agentSessionId") or "")
        with self._lock:
            session = self._sessions.get(sid)
        if session is None or session.op_lock.locked():
            return False
        runtime = session.runtime
        if runtime is None or not runtime.proc.alive:
            return False
        if method == "session.start":
            wanted = str(params.get("providerSessionId") or "")
            home = str(params.get("home") or "")
            return str(session.home) == home and (not wanted or wanted == session.thread_id)
        return method == "turn.start"

    def start_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        sid = str(params.get("agentSessionId") or "")
        home_text = str(params.get("home") or "")
        if not sid:
            raise InvalidArgument("agentSessionId", "agentSessionId is required")
        if not home_text or not Path(home_text).is_absolute():
            raise InvalidArgument("home", "home must be an absolute path")
        home = Path(home_text)
        cwd = str(params.get("cwd") or "")
        wanted = str(params.get("providerSessionId") or "")
        model = params.get("model")
        with self._lock:
            session = self._sessions.get(sid)
            if session is None or session.home != home or (wanted and session.thread_id != wanted):
                stale = session
                session = _Session(
                    sid, home, cwd, wanted, model if isinstance(model, str) else None
                )
                self._sessions[sid] = session
            else:
                stale = None
        if stale is not None and stale.runtime is not None:
            stale.runtime.proc.close()
        with session.op_lock:
            runtime = self._ensure_runtime(session)
        return {"providerSessionId": session.thread_id, "runtimeContext": self._verdict(runtime)}

    def stop_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        sid = str(params.get("agentSessionId") or "")
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            return {}
        # A start or turn start in progress finishes first: otherwise the app-server it is
        # spawning is attached to a Session nobody holds any more and lives on, uncounted
        # (the host's runtime bound was exceeded that way under load, issue 14 §6).
        with session.op_lock:
            runtime, session.runtime = session.runtime, None
        if runtime is not None:
            runtime.proc.close()
        return {}

    def start_turn(self, params: Mapping[str, Any], emit: Emit) -> dict[str, Any]:
        self._emit = emit
        session = self._session(params)
        turn_id = str(params.get("turnId") or "")
        if not turn_id:
            raise InvalidArgument("turnId", "turnId is required")
        text = str(params.get("text") or "")
        with session.op_lock:
            runtime = self._ensure_runtime(session)
            with session.state_lock:
                if session.active or session.awaiting_turn is not None:
                    raise SessionBusy(f"a turn is already active on {session.agent_session_id}")
                session.awaiting_turn = turn_id
            try:
                result = runtime.proc.request(
                    "turn/start",
                    {
                        "threadId": session.thread_id,
                        "input": [{"type": "text", "text": text, "text_elements": []}],
                    },
                    timeout=self.request_timeout,
                )
            except JsonRpcError as exc:
                with session.state_lock:
                    session.awaiting_turn = None
                raise DriverError(f"turn/start rejected: {exc.rpc_message}") from exc
            except AppServerFailure as exc:
                with session.state_lock:
                    session.awaiting_turn = None
                raise DriverError(
                    f"turn/start failed: {exc}", reason="provider_unavailable"
                ) from exc
            provider_turn_id = str((result.get("turn") or {}).get("id") or "")
            self._claim_turn(session, provider_turn_id)
            session.last_used = time.monotonic()
        return {"providerTurnId": provider_turn_id}

    def history(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`session.history {agentSessionId}` → `{turns: [{providerTurnId, status, userText}]}`
        in the provider's order: what the host needs to re-bind a Turn whose provider binding
        it never recorded (issue 15 defect 1), by order and content."""
        session = self._session(params)
        with session.op_lock:
            runtime = self._ensure_runtime(session)
        try:
            turns = self._thread_turns(runtime, session.thread_id)
        except AppServerFailure as exc:
            raise DriverError(f"provider history unreadable: {exc}") from exc
        return {
            "turns": [
                {
                    "providerTurnId": str(t.get("id") or ""),
                    "status": str(t.get("status") or ""),
                    "userText": _user_text(t),
                }
                for t in turns
            ]
        }

    def interrupt_turn(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        provider_turn_id = str(params.get("providerTurnId") or "")
        runtime = session.runtime
        if runtime is None or not runtime.proc.alive:
            raise Conflict("no live runtime for this session", reason="turn_not_active")
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
        return {}

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
        try:
            runtime.proc.respond(pending.request.id, result)
        except AppServerClosed as exc:
            raise DriverError(f"cannot answer interaction: {exc}") from exc
        with session.state_lock:
            session.pending.pop(request_id, None)
        return {}

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            if session.runtime is not None:
                session.runtime.proc.close(1.0)

    # ------------------------------------------------------------------ fork (seed §7, §7.1)

    def fork(self, request: ForkRequest) -> ForkResult:
        prefix = list(request.provider_turn_ids)
        source_id = request.source.provider_session_id
        if not prefix or not source_id:
            return ForkResult.not_started("fork needs a source thread and a provider turn prefix")
        if request.driver_kind != self.kind:
            return ForkResult.not_started(f"driver kind {request.driver_kind!r} is not {self.kind}")
        source_home = Path(request.source.home)
        runtime, transient = self._fork_runtime(request)
        if runtime is None:
            return ForkResult.not_started("source runtime could not be prepared")
        try:
            return self._fork_on(runtime, request, source_id, prefix)
        finally:
            if transient:
                runtime.proc.close()
            _ = source_home

    def _fork_runtime(self, request: ForkRequest) -> tuple[_Runtime | None, bool]:
        session = self._sessions.get(request.source.agent_session_id)
        home = Path(request.source.home)
        if (
            session is not None
            and session.home == home
            and session.runtime is not None
            and session.runtime.proc.alive
        ):
            return session.runtime, False
        try:
            return self._spawn(home, request.source.cwd, None), True
        except HostError:
            return None, False

    def _fork_on(
        self, runtime: _Runtime, request: ForkRequest, source_id: str, prefix: list[str]
    ) -> ForkResult:
        # Exact driver identity: a runtime that changed since prepare must not be dispatched.
        if runtime.gate.version != request.driver_version:
            return ForkResult.not_started(
                f"driver version {runtime.gate.version!r} != frozen {request.driver_version!r}"
            )
        if not runtime.gate.fork_through_turn:
            return ForkResult.not_started(f"{self.kind} {runtime.gate.version} cannot fork")
        # Before any mutation: the source must show the frozen ordered prefix, settled.
        try:
            source_turns = self._thread_turns(runtime, source_id)
        except AppServerFailure as exc:
            return ForkResult.not_started(f"source thread unreadable: {exc}")
        ids = [str(t.get("id")) for t in source_turns]
        if ids[: len(prefix)] != prefix:
            return ForkResult.not_started("source thread does not show the frozen turn prefix")
        if source_turns[len(prefix) - 1].get("status") == "inProgress":
            return ForkResult.not_started("the boundary turn is still in progress")
        try:
            self.failpoints.hit("worker.fork.before_provider_call")
        except FailpointError as exc:
            return ForkResult.not_started(str(exc))

        try:
            response = runtime.proc.request(
                "thread/fork",
                {"threadId": source_id, "lastTurnId": prefix[-1]},
                timeout=self.fork_timeout,
            )
        except JsonRpcError as exc:
            return ForkResult.rejected(f"thread/fork rejected: {exc.rpc_message}")
        except AppServerClosed as exc:
            if not exc.sent:
                return ForkResult.not_started(f"thread/fork not sent: {exc}")
            return ForkResult.unknown(f"app-server lost after thread/fork was sent: {exc}")
        except AppServerTimeout as exc:
            return ForkResult.unknown(str(exc))

        try:
            self.failpoints.hit("worker.fork.after_provider_call")
        except FailpointError as exc:
            return ForkResult.unknown(str(exc))

        thread = _thread_of(response)
        child_id = str(thread.get("id") or "")
        forked_from = str(thread.get("forkedFromId") or "")
        if not child_id or child_id == source_id:
            return ForkResult.unknown(f"unverifiable child id {child_id!r}")
        if forked_from != source_id:
            child = ForkChild(child_id, forked_from, ())
            return ForkResult.unknown(f"forkedFromId {forked_from!r} != source", child)
        child_turns = _turn_ids(thread.get("turns"))
        if not child_turns:
            try:
                child_turns = [str(t.get("id")) for t in self._list_turns(runtime, child_id)]
            except AppServerFailure as exc:
                return ForkResult.unknown(
                    f"child turns unreadable: {exc}", ForkChild(child_id, forked_from, ())
                )
        child = ForkChild(child_id, forked_from, tuple(child_turns))
        if child_turns != prefix:
            return ForkResult.unknown(
                f"child turns {child_turns} are not exactly the frozen prefix {prefix}", child
            )

        # The binder runs before accepted; any failure now is unknown (law 1, seed §7).
        try:
            receipt = self.binder.bind(
                Path(request.source.home), Path(request.target.home), child_id
            )
        except (BinderError, FailpointError, OSError) as exc:
            return ForkResult.unknown(f"provider-state binding failed: {exc}", child)
        proof = "none"
        if self.verify_bound_child:
            problem, proof = self._prove_readable(
                runtime, Path(request.target.home), child_id, source_id, prefix
            )
            if problem is not None:
                return ForkResult.unknown(
                    f"bound child not readable from its home: {problem}", child
                )
        # The source server loaded the child; release it so a long-lived server does not
        # accumulate threads (and never writes to the child from the source home).
        with contextlib.suppress(AppServerFailure):
            runtime.proc.request("thread/unsubscribe", {"threadId": child_id}, timeout=5.0)
        wire = receipt.to_wire()
        wire["verifiedReadable"] = self.verify_bound_child
        wire["readabilityProof"] = proof
        wire["sourceCanonicalTurnId"] = request.source_turn_id
        return ForkResult(
            DeliveryDisposition.ACCEPTED,
            child=child,
            binding=ForkBinding(self.binding_mode, wire),
        )

    def _prove_readable(
        self, runtime: _Runtime, home: Path, child_id: str, source_id: str, prefix: list[str]
    ) -> tuple[str | None, str]:
        """(problem or None, how it was proven): the provider's own history reader in this
        worker (no process spawned) where it can judge the child, else a fresh app-server on
        the target home (`readability_proof = "app_server"` forces the latter)."""
        if self.readability_proof == READABILITY_IN_WORKER:
            try:
                return (
                    self._read_child_in_worker(runtime, home, child_id, source_id, prefix),
                    READABILITY_IN_WORKER,
                )
            except ReaderNotApplicable:
                pass
        return self._verify_readable(home, child_id, prefix), READABILITY_APP_SERVER

    def _read_child_in_worker(
        self, runtime: _Runtime, home: Path, child_id: str, source_id: str, prefix: list[str]
    ) -> str | None:
        """The child's readability from `home` alone, judged by tutti_agent's own reader."""
        return prove_tutti_child(home, child_id, source_id, prefix, runtime.gate.version)

    def _verify_readable(self, home: Path, child_id: str, prefix: list[str]) -> str | None:
        """Prove the child reads from the target home alone (lineage included)."""
        try:
            runtime = self._spawn(home, None, None)
        except HostError as exc:
            return str(exc)
        try:
            turns = [str(t.get("id")) for t in self._thread_turns(runtime, child_id)]
        except AppServerFailure as exc:
            return str(exc)
        finally:
            runtime.proc.close()
        if turns != prefix:
            return f"target home shows turns {turns}"
        return None

    def _thread_turns(self, runtime: _Runtime, thread_id: str) -> list[Mapping[str, Any]]:
        result = runtime.proc.request(
            "thread/read",
            {"threadId": thread_id, "includeTurns": True},
            timeout=self.request_timeout,
        )
        thread = _thread_of(result)
        turns = [t for t in thread.get("turns") or [] if isinstance(t, Mapping)]
        # Paginated histories may omit turns from thread/read: list them instead.
        return turns or self._list_turns(runtime, thread_id)

    def _list_turns(self, runtime: _Runtime, thread_id: str) -> list[Mapping[str, Any]]:
        turns: list[Mapping[str, Any]] = []
        cursor: str | None = None
        for _ in range(10_000):
            params: dict[str, Any] = {"threadId": thread_id, "sortDirection": "asc", "limit": 100}
            if cursor:
                params["cursor"] = cursor
            page = runtime.proc.request("thread/turns/list", params, timeout=self.request_timeout)
            turns.extend(t for t in page.get("data") or [] if isinstance(t, Mapping))
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return turns

    # ------------------------------------------------------------------ runtime plumbing

    def _session(self, params: Mapping[str, Any]) -> _Session:
        sid = str(params.get("agentSessionId") or "")
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise NotFound(f"session {sid!r} is not started in the {self.kind} worker")
        return session

    def _live_runtime_for_home(self, home: Path) -> _Runtime | None:
        with self._lock:
            for session in self._sessions.values():
                runtime = session.runtime
                if session.home == home and runtime is not None and runtime.proc.alive:
                    return runtime
        return None

    def _ensure_runtime(self, session: _Session) -> _Runtime:
        """The Session's live app-server, (re)spawned and its thread started or resumed."""
        runtime = session.runtime
        if runtime is not None and runtime.proc.alive:
            return runtime
        runtime = self._spawn(session.home, session.cwd, session)
        try:
            if session.thread_id:
                params: dict[str, Any] = {"threadId": session.thread_id}
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
            raise DriverError(f"app-server failed: {exc}", reason="provider_unavailable") from exc
        thread = _thread_of(result)
        thread_id = str(thread.get("id") or "")
        if not thread_id or (session.thread_id and thread_id != session.thread_id):
            runtime.proc.close()
            raise DriverError(f"app-server opened thread {thread_id!r}, not {session.thread_id!r}")
        session.thread_id = thread_id
        session.runtime = runtime
        session.last_used = time.monotonic()
        return runtime

    def _claim_turn(self, session: _Session, provider_turn_id: str) -> str | None:
        """Map a provider turn id to its canonical turn (first sight wins: the notification may
        overtake the `turn/start` response). Emits `turn.started` once."""
        emit_started = False
        with session.state_lock:
            canonical = session.turns.get(provider_turn_id)
            if canonical is None and session.awaiting_turn is not None and provider_turn_id:
                canonical = session.awaiting_turn
                session.awaiting_turn = None
                session.turns[provider_turn_id] = canonical
                session.active.add(provider_turn_id)
                emit_started = True
        if emit_started and canonical is not None:
            self._send(
                session,
                {"type": "turn.started", "turnId": canonical, "providerTurnId": provider_turn_id},
            )
            binding = {
                "schemaVersion": 1,
                "threadId": session.thread_id,
                "providerTurnId": provider_turn_id,
            }
            self._send(
                session,
                {
                    "type": "turn.binding",
                    "turnId": canonical,
                    "bindingJson": json.dumps(binding, sort_keys=True),
                },
            )
        return canonical

    def _send(self, session: _Session, event: dict[str, Any]) -> None:
        emit = self._emit
        if emit is not None:
            emit(session.agent_session_id, event)

    def _on_notification(
        self, session: _Session | None, method: str, params: Mapping[str, Any]
    ) -> None:
        if session is None or params.get("threadId", session.thread_id) != session.thread_id:
            return
        session.last_used = time.monotonic()
        if method == "turn/started":
            turn = params.get("turn") or {}
            self._claim_turn(session, str(turn.get("id") or ""))
        elif method == "item/completed":
            provider_turn_id = str(params.get("turnId") or "")
            canonical = self._claim_turn(session, provider_turn_id)
            item = params.get("item")
            if canonical is None or not isinstance(item, Mapping):
                return
            for mapped in map_item(item):
                self._send(session, {"type": "item", "turnId": canonical, "item": mapped})
        elif method == "error":
            self._on_model_error(session, params)
        elif method in _DELTA_METHODS:
            # Streamed text of an item still being generated: not durable, the completed
            # item is the record (the daemon publishes it as `message.delta`).
            canonical = self._claim_turn(session, str(params.get("turnId") or ""))
            delta = params.get("delta")
            if canonical is None or not isinstance(delta, str) or not delta:
                return
            self._send(
                session,
                {
                    "type": "message.delta",
                    "turnId": canonical,
                    "itemId": str(params.get("itemId") or ""),
                    "kind": _DELTA_METHODS[method],
                    "delta": delta,
                },
            )
        elif method == "turn/completed":
            turn = params.get("turn") or {}
            provider_turn_id = str(turn.get("id") or "")
            canonical = self._claim_turn(session, provider_turn_id)
            if canonical is None:
                return
            outcome = _OUTCOMES.get(str(turn.get("status")), TurnOutcome.FAILED)
            event: dict[str, Any] = {
                "type": "turn.completed",
                "turnId": canonical,
                "providerTurnId": provider_turn_id,
                "outcome": outcome.value,
            }
            error = turn.get("error")
            if isinstance(error, Mapping) and error.get("message"):
                event["error"] = model_failure_text(
                    self.kind, self.endpoint(), str(error["message"])
                )
            with session.state_lock:
                failure = session.model_failures.pop(provider_turn_id, None)
            if failure is not None:
                # We stopped the provider's retries: the turn failed, it was not interrupted.
                event["outcome"] = TurnOutcome.FAILED.value
                event["error"] = failure
            with session.state_lock:
                session.active.discard(provider_turn_id)
                for key in [
                    k for k, p in session.pending.items() if p.provider_turn_id == provider_turn_id
                ]:
                    del session.pending[key]  # superseded by the turn's end
            self._send(session, event)

    def _on_model_error(self, session: _Session, params: Mapping[str, Any]) -> None:
        """Codex keeps retrying an endpoint that refuses connections (seconds apart, for
        minutes). A retried error that names an unreachable model or a refused credential
        fails the turn now: the failure is recorded, then the turn is interrupted."""
        if not params.get("willRetry"):
            return  # a final error arrives with turn/completed
        error = params.get("error")
        detail = json.dumps(error) if isinstance(error, Mapping) else str(error or "")
        if classify_model_failure(detail) is None:
            return
        message = str(error.get("message") or detail) if isinstance(error, Mapping) else detail
        extra = error.get("additionalDetails") if isinstance(error, Mapping) else None
        if extra:
            message = f"{message} ({extra})"
        provider_turn_id = str(params.get("turnId") or "")
        with session.state_lock:
            if provider_turn_id not in session.active or provider_turn_id in session.model_failures:
                return
            session.model_failures[provider_turn_id] = model_failure_text(
                self.kind, self.endpoint(), message
            )
        # Not on the reader thread: it must stay free to read the interrupt's answer.
        threading.Thread(
            target=self._stop_retrying,
            args=(session, provider_turn_id),
            name="model-failure-interrupt",
            daemon=True,
        ).start()

    def _stop_retrying(self, session: _Session, provider_turn_id: str) -> None:
        with contextlib.suppress(HostError):
            self.interrupt_turn(
                {"agentSessionId": session.agent_session_id, "providerTurnId": provider_turn_id}
            )

    def _on_server_request(self, session: _Session | None, request: ServerRequest) -> None:
        if session is None:
            return
        runtime = session.runtime
        if request.method in APPROVAL_METHODS:
            kind = "approval"
        elif request.method in QUESTION_METHODS:
            kind = "question"
        else:
            if runtime is not None:
                with contextlib.suppress(AppServerClosed):
                    runtime.proc.respond_error(request.id, -32601, f"unsupported {request.method}")
            return
        params = request.params
        provider_turn_id = str(params.get("turnId") or "")
        canonical = self._claim_turn(session, provider_turn_id)
        if canonical is None:
            return
        request_id = str(params.get("itemId") or f"rpc-{request.id}")
        input_: dict[str, Any] = {"method": request.method}
        for key in ("command", "cwd", "reason", "questions", "itemId"):
            if key in params:
                input_[key] = params[key]
        if kind == "question":
            questions = params.get("questions") or []
            first = questions[0] if questions and isinstance(questions[0], Mapping) else {}
            input_["text"] = str(first.get("question") or "")
        elif "command" in params:
            command = params["command"]
            input_["text"] = command if isinstance(command, str) else shlex.join(command)
        with session.state_lock:
            session.pending[request_id] = _Pending(request, kind, canonical, provider_turn_id)
        self._send(
            session,
            {
                "type": "interaction.requested",
                "turnId": canonical,
                "requestId": request_id,
                "kind": kind,
                "input": input_,
            },
        )

    def _on_exit(self, session: _Session | None, reason: str) -> None:
        """The app-server died: every turn it was running ends as failed (nobody else will)."""
        if session is None:
            return
        with session.state_lock:
            active = [(p, session.turns.get(p)) for p in session.active]
            session.active.clear()
            session.pending.clear()
            awaiting = session.awaiting_turn
        for provider_turn_id, canonical in active:
            if canonical is not None:
                self._send(
                    session,
                    {
                        "type": "turn.completed",
                        "turnId": canonical,
                        "providerTurnId": provider_turn_id,
                        "outcome": TurnOutcome.FAILED.value,
                        "error": f"{self.kind} app-server exited: {reason}",
                    },
                )
        _ = awaiting  # turn/start raises to its caller; no event is owed

    def _reap_idle(self) -> None:
        """Stop app-servers of Sessions idle past `idle_timeout_s`; they respawn on next use."""
        while not self._closed.wait(min(5.0, max(0.05, self.idle_timeout / 4))):
            now = time.monotonic()
            with self._lock:
                sessions = list(self._sessions.values())
            for session in sessions:
                runtime = session.runtime
                if runtime is None or not runtime.proc.alive:
                    continue
                with session.state_lock:
                    busy = bool(session.active or session.pending or session.awaiting_turn)
                idle_for = now - max(session.last_used, runtime.proc.last_activity)
                if busy or idle_for < self.idle_timeout:
                    continue
                if not session.op_lock.acquire(blocking=False):
                    continue
                try:
                    session.runtime = None
                finally:
                    session.op_lock.release()
                runtime.proc.close()


class TuttiAgentDriver(AppServerDriver):
    kind = "tutti-agent"
    home_var = "TUTTI_AGENT_HOME"
    gate = TUTTI_AGENT_GATE

    def command(self) -> list[str]:
        configured = self.config.get("command")
        if isinstance(configured, str) and configured.strip():
            base = shlex.split(configured)
        elif isinstance(configured, Sequence) and not isinstance(configured, str) and configured:
            base = [str(part) for part in configured]
        else:
            # The console script installed next to the interpreter running this worker.
            base = [str(Path(sys.executable).parent / "tutti-agent")]
        argv = [*base, "app-server"]
        if self.config.get("model_base_url"):
            argv += ["--model-base-url", str(self.config["model_base_url"])]
            argv += ["--wire-api", str(self.config.get("wire_api") or "responses")]
            # Only the variable's name: the app-server reads the key at each request.
            plan = credential_plan(self.kind, self.config)
            if plan.variable:
                argv += ["--api-key-env", plan.variable]
        if self.config.get("model"):
            argv += ["--model", str(self.config["model"])]
        if self.config.get("instructions"):
            argv += ["--instructions", str(self.config["instructions"])]
        return argv

    def extra_env(self, home: Path) -> dict[str, str]:
        return {**super().extra_env(home), **file_key_env(self.config)}


def _user_text(turn: Mapping[str, Any]) -> str | None:
    """The text of a provider turn's user message, or None when the turn shows none."""
    for item in turn.get("items") or []:
        if isinstance(item, Mapping) and item.get("type") == "userMessage":
            parts = [
                str(part.get("text") or "")
                for part in item.get("content") or []
                if isinstance(part, Mapping) and part.get("type") == "text"
            ]
            return "\n".join(parts)
    return None


def _thread_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    thread = result.get("thread")
    return thread if isinstance(thread, Mapping) else {}


def create_driver(config: Mapping[str, Any], failpoints: Failpoints) -> ProviderDriver:
    return TuttiAgentDriver(config, failpoints)
