"""A loaded thread and the execution of its turns: persistence first, then streaming.

Every item is appended (fsynced) to the rollout before its notification is sent, so a
client never sees an item that a crash could lose; one active turn per thread."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tutti_agent.errors import ModelError, NoActiveTurn, ThreadBusy
from tutti_agent.history import (
    InterruptedMarker,
    TurnStatus,
    interrupted_marker_item,
    model_context,
    turn_aborted_item,
)
from tutti_agent.ids import uuid7
from tutti_agent.model import Model, TurnCancelled
from tutti_agent.rollout import LineType, RolloutItem, RolloutWriter
from tutti_agent.store import ThreadHistory, ThreadStore

ENV_CONTEXT_PREFIX = "<environment_context>"


class Peer(Protocol):
    """The client connection as seen from a turn."""

    def notify(self, method: str, params: Mapping[str, Any]) -> None: ...

    def request(
        self, method: str, params: Mapping[str, Any], cancelled: threading.Event
    ) -> tuple[int | str, Mapping[str, Any] | None]: ...


class ActiveTurn:
    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)
            fire = self.cancelled.is_set()
        if fire:
            callback()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            # A socket being closed may already be closed: the cancel itself must not fail.
            with contextlib.suppress(Exception):
                cb()


class LiveThread:
    """A thread loaded in this server: its writer, settings and at most one active turn."""

    def __init__(
        self,
        store: ThreadStore,
        history: ThreadHistory,
        writer: RolloutWriter,
        peer: Peer,
        model: Model,
    ) -> None:
        self.store = store
        self.thread_id = history.thread_id
        self.path = history.path
        self.writer = writer
        self.peer = peer
        self.model = model
        self._lock = threading.Lock()
        self.active: ActiveTurn | None = None
        self._has_env_context = any(
            _is_env_context(line.item) for line in history.lines
        )
        self.cwd = str(history.effective_settings().get("cwd") or ".")
        # The Session's own model (thread/start `model`), which an HTTP model sends.
        model_name = history.effective_settings().get("model")
        self.model_name = str(model_name) if model_name else None

    # -- lifecycle --------------------------------------------------------------------
    def status(self) -> str:
        return "active" if self.active is not None else "idle"

    def close(self) -> None:
        self.writer.close()

    def append(self, item: RolloutItem) -> None:
        self.writer.append(item)

    def start_turn(self, text: str) -> tuple[dict[str, Any], Callable[[], None]]:
        """Reserve the turn now; the returned starter runs it after the response is sent."""
        with self._lock:
            if self.active is not None:
                raise ThreadBusy(
                    f"thread {self.thread_id} already has an active turn {self.active.turn_id}"
                )
            turn = ActiveTurn(uuid7())
            self.active = turn
        wire: dict[str, Any] = {
            "id": turn.turn_id,
            "rootTurnId": turn.turn_id,
            "items": [],
            "itemsView": "notLoaded",
            "status": "inProgress",
            "error": None,
            "startedAt": None,
            "completedAt": None,
            "durationMs": None,
        }

        def starter() -> None:
            threading.Thread(
                target=self._run_turn, args=(turn, text), name=f"turn-{turn.turn_id}", daemon=True
            ).start()

        return wire, starter

    def interrupt(self, turn_id: str) -> None:
        with self._lock:
            active = self.active
        if active is None:
            raise NoActiveTurn()
        if active.turn_id != turn_id:
            raise NoActiveTurn()
        active.cancel()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        with self._lock:
            active = self.active
        return True if active is None else active.done.wait(timeout_s)

    # -- turn execution ---------------------------------------------------------------
    def _run_turn(self, turn: ActiveTurn, text: str) -> None:
        io = _TurnIO(self, turn)
        started_at = int(time.time())
        t0 = time.monotonic()
        status = TurnStatus.COMPLETED
        error: str | None = None
        try:
            self.append(
                RolloutItem(
                    LineType.EVENT_MSG,
                    {"type": "task_started", "turn_id": turn.turn_id, "started_at": started_at},
                )
            )
            self.peer.notify(
                "thread/status/changed",
                {"threadId": self.thread_id, "status": {"type": "active", "activeFlags": []}},
            )
            self.peer.notify(
                "turn/started",
                {"threadId": self.thread_id, "turn": _turn_wire(turn.turn_id, [], "inProgress",
                                                                None, started_at, None, None)},
            )
            if not self._has_env_context:
                # Like Codex: the first turn carries the environment context, model-visible but
                # never a user turn (it must not count for Nth-user truncation).
                self.append(_env_context_item(self.cwd))
                self._has_env_context = True
            self.append(_message_item("user", "input_text", text))
            io.emit_item(
                {
                    "type": "userMessage",
                    "id": uuid7(),
                    "clientId": None,
                    "content": [{"type": "text", "text": text, "text_elements": []}],
                }
            )
            try:
                self.model.run(text, io)
            except TurnCancelled:
                status = TurnStatus.INTERRUPTED
            except ModelError as exc:
                status, error = TurnStatus.FAILED, str(exc)
            except Exception as exc:  # noqa: BLE001 - any model crash fails only this turn
                status, error = TurnStatus.FAILED, f"{type(exc).__name__}: {exc}"
            if status == TurnStatus.COMPLETED and turn.cancelled.is_set():
                status = TurnStatus.INTERRUPTED
            completed_at = int(time.time())
            duration_ms = int((time.monotonic() - t0) * 1000)
            if status == TurnStatus.INTERRUPTED:
                marker = interrupted_marker_item(InterruptedMarker.CONTEXTUAL_USER)
                if marker is not None:
                    self.append(marker)
                self.append(
                    turn_aborted_item(
                        turn.turn_id,
                        started_at,
                        completed_at=completed_at,
                        duration_ms=duration_ms,
                    )
                )
            else:
                if error is not None:
                    self.append(
                        RolloutItem(
                            LineType.EVENT_MSG,
                            {"type": "error", "turn_id": turn.turn_id, "message": error},
                        )
                    )
                self.append(
                    RolloutItem(
                        LineType.EVENT_MSG,
                        {
                            "type": "task_complete",
                            "turn_id": turn.turn_id,
                            "last_agent_message": io.last_agent_message,
                            "started_at": started_at,
                            "completed_at": completed_at,
                            "duration_ms": duration_ms,
                        },
                    )
                )
            with self._lock:
                self.active = None
            self.peer.notify(
                "thread/status/changed", {"threadId": self.thread_id, "status": {"type": "idle"}}
            )
            self.peer.notify(
                "turn/completed",
                {
                    "threadId": self.thread_id,
                    "turn": _turn_wire(
                        turn.turn_id,
                        io.items,
                        str(status),
                        {"message": error} if error is not None else None,
                        started_at,
                        completed_at,
                        duration_ms,
                    ),
                },
            )
        finally:
            with self._lock:
                if self.active is turn:
                    self.active = None
            turn.done.set()


class _TurnIO:
    """TurnIO bound to one live turn: persists each step, then streams it."""

    def __init__(self, thread: LiveThread, turn: ActiveTurn) -> None:
        self._thread = thread
        self._turn = turn
        self.items: list[dict[str, Any]] = []
        self.last_agent_message: str | None = None

    @property
    def cancelled(self) -> threading.Event:
        return self._turn.cancelled

    def on_cancel(self, callback: Callable[[], None]) -> None:
        self._turn.on_cancel(callback)

    def _check(self) -> None:
        if self._turn.cancelled.is_set():
            raise TurnCancelled()

    def _notify_item(self, method: str, item: Mapping[str, Any]) -> None:
        self._thread.peer.notify(
            method,
            {"item": dict(item), "threadId": self._thread.thread_id, "turnId": self._turn.turn_id},
        )

    def emit_item(self, item: dict[str, Any]) -> None:
        """Persist a completed item and stream item/started + item/completed."""
        self._thread.append(
            RolloutItem(
                LineType.EVENT_MSG,
                {"type": "item_completed", "turn_id": self._turn.turn_id, "item": item},
            )
        )
        self._notify_item("item/started", item)
        self._notify_item("item/completed", item)
        self.items.append(item)

    def model_input(self) -> list[Mapping[str, Any]]:
        history = self._thread.store.load(self._thread.thread_id)
        return model_context(history.items)

    @property
    def model_name(self) -> str | None:
        return self._thread.model_name

    def delta(self, item_id: str, kind: str, text: str) -> None:
        """Stream a piece of an item still being generated (not persisted: the completed item
        is the record). Codex's notification names, so one driver maps both."""
        method = "item/agentMessage/delta" if kind == "assistant" else (
            "item/reasoning/summaryTextDelta"
        )
        params: dict[str, Any] = {
            "threadId": self._thread.thread_id,
            "turnId": self._turn.turn_id,
            "itemId": item_id,
            "delta": text,
        }
        if kind != "assistant":
            params["summaryIndex"] = 0
        self._thread.peer.notify(method, params)

    def usage(self, input_tokens: int, output_tokens: int) -> None:
        self._thread.append(
            RolloutItem(
                LineType.EVENT_MSG,
                {
                    "type": "token_count",
                    "turn_id": self._turn.turn_id,
                    "info": {
                        "last_token_usage": {
                            "input_tokens": input_tokens,
                            "output_tokens": output_tokens,
                            "total_tokens": input_tokens + output_tokens,
                        }
                    },
                },
            )
        )

    def reasoning(self, text: str, item_id: str | None = None) -> None:
        self._check()
        item_id = item_id or f"rs_{uuid7()}"
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {
                    "type": "reasoning",
                    "id": item_id,
                    "summary": [{"type": "summary_text", "text": text}],
                    "content": None,
                    "encrypted_content": None,
                },
            )
        )
        self.emit_item({"type": "reasoning", "id": item_id, "summary": [text], "content": []})

    def tool_call(self, name: str, arguments: str, output: str) -> None:
        self._check()
        call_id = f"call_{uuid7()}"
        started = {
            "type": "dynamicToolCall",
            "id": call_id,
            "namespace": None,
            "tool": name,
            "arguments": arguments,
            "status": "inProgress",
            "contentItems": None,
            "success": None,
            "durationMs": None,
        }
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments},
            )
        )
        self._notify_item("item/started", started)
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {"type": "function_call_output", "call_id": call_id, "output": output},
            )
        )
        done = {
            **started,
            "status": "completed",
            "contentItems": [{"type": "inputText", "text": output}],
            "success": True,
            "durationMs": 0,
        }
        self._thread.append(
            RolloutItem(
                LineType.EVENT_MSG,
                {"type": "item_completed", "turn_id": self._turn.turn_id, "item": done},
            )
        )
        self._notify_item("item/completed", done)
        self.items.append(done)

    def request_approval(self, command: str) -> bool:
        self._check()
        call_id = f"call_{uuid7()}"
        started_ms = int(time.time() * 1000)
        item: dict[str, Any] = {
            "type": "commandExecution",
            "id": call_id,
            "command": command,
            "cwd": self._thread.cwd,
            "processId": None,
            "source": "agent",
            "status": "inProgress",
            "commandActions": [],
            "aggregatedOutput": None,
            "exitCode": None,
            "durationMs": None,
        }
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "shell",
                    "arguments": json.dumps({"command": command}),
                },
            )
        )
        self._notify_item("item/started", item)
        result = self._server_request(
            "item/commandExecution/requestApproval",
            {
                "threadId": self._thread.thread_id,
                "turnId": self._turn.turn_id,
                "itemId": call_id,
                "approvalId": None,
                "startedAtMs": started_ms,
                "reason": None,
                "command": command,
                "cwd": self._thread.cwd,
                "commandActions": [],
            },
        )
        decision = result.get("decision") if result is not None else None
        approved = decision in ("accept", "acceptForSession") or (
            isinstance(decision, Mapping) and "acceptWithExecpolicyAmendment" in decision
        )
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": "approved" if approved else "declined",
                },
            )
        )
        done = {
            **item,
            "status": "completed" if approved else "declined",
            "aggregatedOutput": "" if approved else None,
            "exitCode": 0 if approved else None,
            "durationMs": int(time.time() * 1000) - started_ms,
        }
        self._thread.append(
            RolloutItem(
                LineType.EVENT_MSG,
                {"type": "item_completed", "turn_id": self._turn.turn_id, "item": done},
            )
        )
        self._notify_item("item/completed", done)
        self.items.append(done)
        return approved

    def ask(self, question: str) -> str:
        self._check()
        call_id = f"call_{uuid7()}"
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "request_user_input",
                    "arguments": json.dumps({"question": question}),
                },
            )
        )
        result = self._server_request(
            "item/tool/requestUserInput",
            {
                "threadId": self._thread.thread_id,
                "turnId": self._turn.turn_id,
                "itemId": call_id,
                "isBlocking": True,
                "autoResolutionMs": None,
                "questions": [
                    {
                        "id": "answer",
                        "header": "Question",
                        "question": question,
                        "isOther": True,
                        "isSecret": False,
                        "options": None,
                    }
                ],
            },
        )
        if result is None:
            raise ModelError("question was not answered")
        answer = _answer_text(result)
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {"type": "function_call_output", "call_id": call_id, "output": answer},
            )
        )
        self.emit_item(
            {
                "type": "dynamicToolCall",
                "id": call_id,
                "namespace": None,
                "tool": "request_user_input",
                "arguments": {"question": question},
                "status": "completed",
                "contentItems": [{"type": "inputText", "text": answer}],
                "success": True,
                "durationMs": None,
            }
        )
        return answer

    def _server_request(
        self, method: str, params: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        request_id, result = self._thread.peer.request(method, params, self._turn.cancelled)
        if self._turn.cancelled.is_set():
            self._thread.peer.notify(
                "serverRequest/resolved",
                {"threadId": self._thread.thread_id, "requestId": request_id},
            )
            raise TurnCancelled()
        return result

    def agent_message(self, text: str, item_id: str | None = None) -> None:
        self._check()
        item_id = item_id or f"msg_{uuid7()}"
        self._thread.append(
            RolloutItem(
                LineType.RESPONSE_ITEM,
                {
                    "type": "message",
                    "id": item_id,
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                },
            )
        )
        self.emit_item(
            {
                "type": "agentMessage",
                "id": item_id,
                "text": text,
                "phase": None,
                "memoryCitation": None,
            }
        )
        self.last_agent_message = text

    def sleep(self, ms: int) -> None:
        if self._turn.cancelled.wait(ms / 1000.0):
            raise TurnCancelled()


def _answer_text(result: Mapping[str, Any]) -> str:
    answers = result.get("answers")
    if isinstance(answers, Mapping):
        texts: list[str] = []
        for value in answers.values():
            if isinstance(value, Mapping):
                texts.extend(str(a) for a in value.get("answers") or [])
        return "\n".join(texts)
    text = result.get("text")  # lenient: a plain {text} answer
    return str(text) if text is not None else ""


def _turn_wire(
    turn_id: str,
    items: list[dict[str, Any]],
    status: str,
    error: Mapping[str, Any] | None,
    started_at: int | None,
    completed_at: int | None,
    duration_ms: int | None,
) -> dict[str, Any]:
    return {
        "id": turn_id,
        "rootTurnId": turn_id,
        "items": items,
        "itemsView": "full" if items else "notLoaded",
        "status": status,
        "error": dict(error) if error is not None else None,
        "startedAt": started_at,
        "completedAt": completed_at,
        "durationMs": duration_ms,
    }


def _message_item(role: str, content_type: str, text: str) -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {"type": "message", "role": role, "content": [{"type": content_type, "text": text}]},
    )


def _env_context_item(cwd: str) -> RolloutItem:
    text = f"{ENV_CONTEXT_PREFIX}\n  <cwd>{cwd}</cwd>\n</environment_context>"
    return _message_item("user", "input_text", text)


def _is_env_context(item: RolloutItem) -> bool:
    if item.type != LineType.RESPONSE_ITEM or item.payload.get("role") != "user":
        return False
    content = item.payload.get("content") or []
    return any(
        isinstance(c, Mapping) and str(c.get("text", "")).startswith(ENV_CONTEXT_PREFIX)
        for c in content
    )
