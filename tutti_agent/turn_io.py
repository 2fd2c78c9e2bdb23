"""The `TurnIO` port bound to one live turn (`LiveTurnIO`): what each step a model takes becomes
— a reasoning, a tool call, an approval or a question to the client, a reply, a streamed
delta, token usage — appended (fsynced) to the rollout first, then streamed to the client as
the app-server notifications Codex sends, so a client never sees an item a crash could lose.
Also the turn's cancel state (`ActiveTurn`) and the client connection as a turn sees it
(`Peer`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tutti_agent.errors import ModelError
from tutti_agent.ids import uuid7
from tutti_agent.model import TurnCancelled
from tutti_agent.rollout import LineType, RolloutItem

COMPLETED_NEXT = "completedNext"
"""An `item/started` param (not Codex's) for an item emitted complete: its `item/completed` is
the next line the same call writes. agenthost's driver reads the same name."""


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


class TurnThread(Protocol):
    """What a turn's IO needs of its loaded thread (`tutti_agent.turns.LiveThread`)."""

    @property
    def peer(self) -> Peer: ...

    @property
    def thread_id(self) -> str: ...

    @property
    def cwd(self) -> str: ...

    @property
    def model_name(self) -> str | None: ...

    def append(self, item: RolloutItem) -> None: ...

    def model_input(self) -> list[Mapping[str, Any]]: ...


class LiveTurnIO:
    """TurnIO bound to one live turn: persists each step, then streams it."""

    def __init__(self, thread: TurnThread, turn: ActiveTurn) -> None:
        self._thread = thread
        self._turn = turn
        self.items: list[dict[str, Any]] = []
        self.last_agent_message: str | None = None

    @property
    def cancelled(self) -> threading.Event:
        return self._turn.cancelled

    @property
    def cwd(self) -> str:
        return self._thread.cwd

    def on_cancel(self, callback: Callable[[], None]) -> None:
        self._turn.on_cancel(callback)

    def _check(self) -> None:
        if self._turn.cancelled.is_set():
            raise TurnCancelled()

    def _notify_item(
        self, method: str, item: Mapping[str, Any], *, completed_next: bool = False
    ) -> None:
        params: dict[str, Any] = {
            "item": dict(item),
            "threadId": self._thread.thread_id,
            "turnId": self._turn.turn_id,
        }
        if completed_next:
            # Not Codex's: the item/completed of this very item is the next line this call
            # writes, so a reader may take the item as its start too (agenthost's driver sends
            # no separate "it runs" note for it).
            params[COMPLETED_NEXT] = True
        self._thread.peer.notify(method, params)

    def emit_item(self, item: dict[str, Any]) -> None:
        """Persist a completed item and stream item/started + item/completed."""
        self._thread.append(
            RolloutItem(
                LineType.EVENT_MSG,
                {"type": "item_completed", "turn_id": self._turn.turn_id, "item": item},
            )
        )
        self._notify_item("item/started", item, completed_next=True)
        self._notify_item("item/completed", item)
        self.items.append(item)

    def model_input(self) -> list[Mapping[str, Any]]:
        return self._thread.model_input()

    @property
    def model_name(self) -> str | None:
        return self._thread.model_name

    def retrying(self, message: str) -> None:
        """A model request is sent again: Codex's `error` notification with `willRetry`, so
        one driver shows both as progress."""
        self._thread.peer.notify(
            "error",
            {
                "error": {"message": message},
                "willRetry": True,
                "threadId": self._thread.thread_id,
                "turnId": self._turn.turn_id,
            },
        )

    def delta(self, item_id: str, kind: str, text: str) -> None:
        """Stream a piece of an item still being generated (not persisted: the completed item
        is the record). Codex's notification names, so one driver maps both."""
        method = (
            "item/agentMessage/delta"
            if kind == "assistant"
            else ("item/reasoning/summaryTextDelta")
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

    def _server_request(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
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
