"""What the generic app-server driver does on its reader thread: a provider turn id bound to its
canonical Turn on first sight, notifications turned into the turn events of internals.md
(`turn.started` carrying the Turn's binding, `item`, `message.delta`, `turn.completed`),
server→client requests raised as Interactions, a retried model failure stopped, and the turns
of a dead (or stopped) app-server failed. `TurnEvents` is the driver's event translator; it
owns `emit`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import threading
from collections.abc import Callable, Mapping
from typing import Any

from domain.enums import TurnOutcome
from domain.errors import HostError
from domain.model_limits import ModelLimits, stream_empty_timeout, stream_idle_timeout
from domain.redaction import redact_url
from domain.turn_events import (
    PROGRESS,
    InteractionRequested,
    MessageDelta,
    TurnActivity,
    TurnCompleted,
    TurnEvent,
    TurnItem,
    TurnStarted,
)
from drivers.app_server.items import (
    APPROVAL_METHODS,
    DELTA_METHODS,
    OUTCOMES,
    QUESTION_METHODS,
    map_item,
)
from drivers.app_server.process import AppServerClosed, ServerRequest
from drivers.app_server.state import PendingRequest, SessionState
from drivers.base import Emit
from drivers.credentials import CredentialPlan, classify_model_failure, model_failure_text

# Notifications that name no thread and never change one's turns (a fork child's
# `thread/started`, server-wide notices): they leave a fork's verified source read valid.
# Any other notification reaching a Session counts as a possible change of its thread.
_THREADLESS_BENIGN = frozenset(
    {
        "thread/started",
        "deprecationNotice",
        "configWarning",
        "account/rateLimits/updated",
        "remoteControl/status/changed",
    }
)


def _changes_history(session: SessionState, method: str, params: Mapping[str, Any]) -> bool:
    if "threadId" in params or method not in _THREADLESS_BENIGN:
        return True
    thread = params.get("thread")
    return isinstance(thread, Mapping) and thread.get("id") == session.thread_id


# Notifications that turn into no event and name at most the thread they concern: their
# lines reach `TurnEvents.on_quiet_line` undecoded (`QuietLines`), and only "the thread may have
# changed" is read of them, as `on_notification` would read it. So are the provider's copies of
# the user's message (the daemon's claim wrote the canonical one; a user item carries the whole
# prompt). A Turn is claimed by its `turn/start` answer, its `turn/started` or its first event.
_QUIET_METHODS = (
    "thread/status/changed",
    "thread/tokenUsage/updated",
    "thread/readState/changed",
    "account/rateLimits/updated",
    "warning",
)
QUIET_PREFIXES = (
    *(b'{"method":"%s",' % method.encode() for method in _QUIET_METHODS),
    b'{"method":"item/started","params":{"item":{"type":"userMessage",',
    b'{"method":"item/completed","params":{"item":{"type":"userMessage",',
)
_QUIET_THREADLESS = tuple(
    b'{"method":"%s",' % method.encode()
    for method in _QUIET_METHODS
    if method in _THREADLESS_BENIGN
)
_THREAD_KEY = b'"threadId":"'


# How Codex words the end of a stream that went silent past its `stream_idle_timeout_ms`.
_STREAM_IDLE = re.compile(r"idle timeout waiting for SSE", re.IGNORECASE)

COMPLETED_NEXT = "completedNext"
"""tutti-agent's `item/started` param (not Codex's) for an item it emits complete: that item's
`item/completed` is the next line the same call writes (tutti_agent/turn_io.py's name)."""


def _completed_next(params: Mapping[str, Any], item: Mapping[str, Any]) -> bool:
    """Whether an `item/started` needs no `TurnActivity` of its own: its item follows at once
    (`COMPLETED_NEXT`) as a `TurnItem` the Session actor takes as the same note (the model
    answered; not mid-stream; the Turn is not hung), at the same arrival, in the same order. An
    item no `TurnItem` would carry (unmapped, or the user's) still gets its note."""
    if params.get(COMPLETED_NEXT) is not True:
        return False
    return any(mapped.get("kind") != "user" for mapped in map_item(item))


class TurnEvents:
    """The reader-thread callbacks of the driver's app-servers (`on_notification`,
    `on_server_request`, `on_exit`, each bound to the Session it serves), turned into typed turn
    events sent through the worker's `emit`."""

    def __init__(
        self,
        kind: str,
        config: Mapping[str, Any],
        credential: CredentialPlan | None,
        interrupt: Callable[[SessionState, str], None],
    ) -> None:
        self.kind = kind
        self.config = config
        self.credential = credential
        # How a retried model failure stops the provider (the driver's `turn.interrupt`).
        self._interrupt = interrupt
        self.emit: Emit | None = None

    def endpoint(self) -> str | None:
        """The model endpoint named in a model failure."""
        base = self.config.get("model_base_url")
        return redact_url(str(base)) if base else None  # its user and password never shown

    def claim_turn(self, session: SessionState, provider_turn_id: str) -> str | None:
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
            binding = {
                "schemaVersion": 1,
                "threadId": session.thread_id,
                "providerTurnId": provider_turn_id,
            }
            # The start and its binding as one event: one link message, one actor message.
            binding_json = json.dumps(binding, sort_keys=True)
            self.send(session, TurnStarted(canonical, provider_turn_id, binding_json))
        return canonical

    def send(self, session: SessionState, event: TurnEvent) -> None:
        emit = self.emit
        if emit is not None:
            emit(session.agent_session_id, event)

    def on_notification(
        self, session: SessionState | None, method: str, params: Mapping[str, Any]
    ) -> None:
        if session is None or params.get("threadId", session.thread_id) != session.thread_id:
            return
        # (The idle reaper reads the reader's own clock, `AppServerProcess.last_activity`, which
        # every line moved: a notification adds nothing to `session.last_used`.)
        kind = DELTA_METHODS.get(method)
        if kind is not None:
            self._on_delta(session, kind, params)
            return
        if _changes_history(session, method, params):
            session.history_changed()
        if method == "turn/started":
            turn = params.get("turn") or {}
            self.claim_turn(session, str(turn.get("id") or ""))
        elif method == "item/started":
            # The model has answered (a tool it called starts to run, perhaps for minutes, with
            # nothing else to show): the host's first-byte backstop must not take that silence
            # for a model that never answered.
            item = params.get("item")
            if isinstance(item, Mapping) and item.get("type") not in ("userMessage", None):
                canonical = self.claim_turn(session, str(params.get("turnId") or ""))
                if canonical is not None and not _completed_next(params, item):
                    self.send(session, TurnActivity(canonical))
        elif method == "item/completed":
            provider_turn_id = str(params.get("turnId") or "")
            canonical = self.claim_turn(session, provider_turn_id)
            item = params.get("item")
            if canonical is None or not isinstance(item, Mapping):
                return
            for mapped in map_item(item):
                if mapped.get("kind") == "user":
                    # The daemon's claim wrote the Turn's user Message: the provider's copy
                    # is not sent (it would wake the daemon while the app-server starts).
                    continue
                with session.state_lock:
                    session.streamed.add(provider_turn_id)
                self.send(session, TurnItem(canonical, mapped))
        elif method == "error":
            self._on_model_error(session, params)
        elif method == "turn/completed":
            turn = params.get("turn") or {}
            provider_turn_id = str(turn.get("id") or "")
            canonical = self.claim_turn(session, provider_turn_id)
            if canonical is None:
                return
            outcome = OUTCOMES.get(str(turn.get("status")), TurnOutcome.FAILED)
            error: str | None = None
            with session.state_lock:
                streamed = provider_turn_id in session.streamed
                session.streamed.discard(provider_turn_id)
            provider_error = turn.get("error")
            if isinstance(provider_error, Mapping) and provider_error.get("message"):
                text = str(provider_error["message"])
                if _STREAM_IDLE.search(text):
                    # The provider's own stream-idle limit (Codex's stream_idle_timeout_ms).
                    idle = ModelLimits.from_mapping(self.config).stream_idle_s
                    worded = stream_idle_timeout if streamed else stream_empty_timeout
                    error = worded(self.kind, self.endpoint(), idle)
                else:
                    error = model_failure_text(self.kind, self.endpoint(), text, self.credential)
            with session.state_lock:
                failure = session.model_failures.pop(provider_turn_id, None)
            if failure is not None:
                # We stopped the provider's retries: the turn failed, it was not interrupted.
                outcome, error = TurnOutcome.FAILED, failure
            event = TurnCompleted(canonical, provider_turn_id, outcome.value, error)
            with session.state_lock:
                session.active.discard(provider_turn_id)
                session.forget_settled_turns()
                for key in [
                    k for k, p in session.pending.items() if p.provider_turn_id == provider_turn_id
                ]:
                    del session.pending[key]  # superseded by the turn's end
            self.send(session, event)

    def on_quiet_line(self, session: SessionState | None, raw: bytes) -> None:
        """A line that starts with one of `QUIET_PREFIXES`, undecoded: no event is owed. The
        thread's history may have changed unless the line names another thread (its first
        `"threadId":"…"`, the params' own in these notifications: JSON escapes the quotes of any
        such text inside a string) or, naming none, is a notice about no thread."""
        if session is None:
            return
        at = raw.find(_THREAD_KEY)
        if at < 0:
            if not raw.startswith(_QUIET_THREADLESS):
                session.history_changed()
            return
        ours = b'%s%s"' % (_THREAD_KEY, session.thread_id.encode())
        if raw.startswith(ours, at):
            session.history_changed()

    def _on_delta(self, session: SessionState, kind: str, params: Mapping[str, Any]) -> None:
        """Streamed text of an item still being generated: not durable, the completed item is
        the record (the daemon publishes it as `message.delta`). Every delta of a Turn takes
        this path on the reader thread, so its bookkeeping is one hold of the Session's lock
        (`note_delta`); only a Turn's first sight goes through `claim_turn`."""
        provider_turn_id = str(params.get("turnId") or "")
        delta = params.get("delta")
        text = delta if isinstance(delta, str) and delta else None
        canonical = session.note_delta(provider_turn_id, text is not None)
        if canonical is None:
            canonical = self.claim_turn(session, provider_turn_id)
            if canonical is None or text is None:
                return
            with session.state_lock:
                session.streamed.add(provider_turn_id)
        elif text is None:
            return
        item_id = str(params.get("itemId") or "")
        self.send(session, MessageDelta(canonical, item_id, kind, text))

    def _on_model_error(self, session: SessionState, params: Mapping[str, Any]) -> None:
        """Codex keeps retrying an endpoint that refuses connections (seconds apart, for
        minutes). A retried error that names an unreachable model or a refused credential
        fails the turn now: the failure is recorded, then the turn is interrupted."""
        if not params.get("willRetry"):
            return  # a final error arrives with turn/completed
        error = params.get("error")
        detail = json.dumps(error) if isinstance(error, Mapping) else str(error or "")
        message = str(error.get("message") or detail) if isinstance(error, Mapping) else detail
        extra = error.get("additionalDetails") if isinstance(error, Mapping) else None
        if extra:
            message = f"{message} ({extra})"
        provider_turn_id = str(params.get("turnId") or "")
        if classify_model_failure(detail) is None:
            # A retry the provider makes on its own (`model_retries`): shown, not silence.
            canonical = self.claim_turn(session, provider_turn_id)
            if canonical is not None:
                with session.state_lock:
                    session.retries += 1
                    item_id = f"retry-{session.retries}"
                note = f"{self.kind} retries the model request: {message}"
                self.send(session, MessageDelta(canonical, item_id, PROGRESS, note))
            return
        with session.state_lock:
            if provider_turn_id not in session.active or provider_turn_id in session.model_failures:
                return
            session.model_failures[provider_turn_id] = model_failure_text(
                self.kind, self.endpoint(), message, self.credential
            )
        # Not on the reader thread: it must stay free to read the interrupt's answer.
        threading.Thread(
            target=self._stop_retrying,
            args=(session, provider_turn_id),
            name="model-failure-interrupt",
            daemon=True,
        ).start()

    def _stop_retrying(self, session: SessionState, provider_turn_id: str) -> None:
        with contextlib.suppress(HostError):
            self._interrupt(session, provider_turn_id)

    def on_server_request(self, session: SessionState | None, request: ServerRequest) -> None:
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
        canonical = self.claim_turn(session, provider_turn_id)
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
            session.pending[request_id] = PendingRequest(request, kind, canonical, provider_turn_id)
        self.send(session, InteractionRequested(canonical, request_id, kind, input_))

    def on_exit(self, session: SessionState | None, reason: str) -> None:
        """The app-server died: every turn it was running ends as failed (nobody else will).
        A `turn/start` waiting on it raises to its caller; no event is owed for that one."""
        if session is None:
            return
        self.fail_turns(session, f"{self.kind} app-server exited: {reason}")

    def fail_turns(self, session: SessionState, error: str) -> None:
        """End every Turn the Session's app-server is running as failed with `error`."""
        self.send_failed(session, self.take_active(session), error)

    def take_active(self, session: SessionState) -> list[tuple[str, str | None]]:
        """The Session's running Turns `(provider id, canonical id)`, no longer counted as
        running, and the Interactions they wait on dropped (no answer can reach them)."""
        with session.state_lock:
            active = [(p, session.turns.get(p)) for p in session.active]
            session.active.clear()
            session.pending.clear()
            session.streamed.clear()
        return active

    def send_failed(
        self, session: SessionState, turns: list[tuple[str, str | None]], error: str
    ) -> None:
        for provider_turn_id, canonical in turns:
            if canonical is not None:
                self.send(
                    session,
                    TurnCompleted(canonical, provider_turn_id, TurnOutcome.FAILED.value, error),
                )
