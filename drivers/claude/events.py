"""Claude Code's streamed SDK messages read as the turn events of internals.md (`ClaudeEvents`,
the Claude driver's event translator): items, `message.delta` as text is generated, descendant
lanes, the Turn's observed identity and checkpoints, its outcome in our words, and a retried
model failure stopped (through the Turn's runner).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from domain.enums import TurnOutcome
from domain.model_limits import first_byte_timeout, stream_idle_timeout
from domain.turn_events import PROGRESS, MessageDelta, TurnItem
from drivers.claude.checkpoints import observe_root, set_checkpoint
from drivers.claude.env import ClaudeDriverConfig
from drivers.claude.state import SessionState, TurnState
from drivers.credentials import (
    MODEL_AUTH_FAILED,
    MODEL_UNREACHABLE,
    classify_model_failure,
    credential_note,
    model_failure_text,
)

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


# How the CLI words its own request timeouts (API_TIMEOUT_MS, the first-byte watchdog).
TIMED_OUT = re.compile(r"request timed out|timed out waiting|no_response", re.IGNORECASE)


class ClaudeEvents:
    """One SDK message at a time → turn events through the Turn's `emit`; `terminate` stops a
    Turn's CLI when a retried model failure must end it now."""

    def __init__(self, config: ClaudeDriverConfig, terminate: Callable[[TurnState], None]) -> None:
        self._config = config
        self._terminate = terminate

    def on_message(
        self, session: SessionState, turn: TurnState, message: Any
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
            # A raw event that is no object (a broken CLI's) says nothing: skipped.
            if message.parent_tool_use_id is None and isinstance(message.event, Mapping):
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
                observe_root(session, turn, message.uuid)
            for result in results:
                turn.emit(
                    sid,
                    TurnItem(
                        turn.turn_id,
                        {
                            "kind": "tool_result",
                            "text": _text_of(result.content),
                            "payload": {
                                "providerToolUseId": result.tool_use_id,
                                "providerMessageUuid": message.uuid,
                            },
                        },
                    ),
                )
            if turn.provider_turn_id is not None:
                set_checkpoint(session, turn, message.uuid)
        elif isinstance(message, AssistantMessage):
            # An `error` message is the CLI's own wording of a failed API call ("Request timed
            # out… set API_TIMEOUT_MS"): not a reply; the Turn's error says it in ours. It stays
            # a checkpoint (it is on the transcript's chain).
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
                if item is not None and message.error is None:
                    # provider* keys: the store leaves provider identities untouched when it clones
                    # a Turn (a bare `messageId` would read as a canonical typed reference).
                    item["payload"].update(
                        {
                            "providerMessageUuid": message.uuid,
                            "providerApiMessageId": message.message_id,
                            "providerItemId": f"{api_id}:{index}",
                        }
                    )
                    turn.emit(sid, TurnItem(turn.turn_id, item))
            if message.uuid and turn.provider_turn_id is not None:
                set_checkpoint(session, turn, message.uuid)
        elif isinstance(message, SystemMessage):
            if message.subtype == "api_retry":
                self._on_api_retry(sid, turn, message.data)
            msg_uuid = message.data.get("uuid")
            if (
                message.subtype not in EPHEMERAL_SYSTEM_SUBTYPES
                and isinstance(msg_uuid, str)
                and turn.provider_turn_id is not None
            ):
                # A trailing system message (e.g. a Stop hook notice) extends the turn.
                set_checkpoint(session, turn, msg_uuid)
        elif isinstance(message, ResultMessage):
            if message.is_error:
                errors = getattr(message, "errors", None) or []
                text = str(message.result or "; ".join(map(str, errors)) or message.subtype)
                if TIMED_OUT.search(text):
                    return TurnOutcome.FAILED, self.timeout_text(turn)
                return TurnOutcome.FAILED, model_failure_text(
                    "claude-code", self._config.shown_endpoint, text, self._config.credential()
                )
            return TurnOutcome.COMPLETED, None
        return None

    @staticmethod
    def _record_lane(sid: str, turn: TurnState, parent_tool_use_id: str) -> None:
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
        turn.emit(sid, TurnItem(turn.turn_id, item))

    def timeout_text(self, turn: TurnState) -> str:
        """The CLI's own limit ended the request: the first byte never came, or the stream
        began (a `message_start` was seen) and then went silent."""
        limits, endpoint = self._config.limits, self._config.shown_endpoint
        if turn.stream_message_id is None:
            return first_byte_timeout("claude-code", endpoint, limits.first_byte_budget_s)
        return stream_idle_timeout("claude-code", endpoint, limits.stream_idle_s)

    def _on_api_retry(self, sid: str, turn: TurnState, data: Mapping[str, Any]) -> None:
        """The CLI retries a refused credential or an unreachable endpoint for minutes: a
        retry whose cause is one of those fails the turn now, naming it."""
        if turn.model_failure is not None:
            return
        status = data.get("error_status")
        cause = str(data.get("error") or "")
        # Classified on the error's own words (numbers such as retry_delay_ms could look like
        # a status), plus the HTTP status.
        reason = classify_model_failure(cause)
        attempt = int(data.get("attempt") or 0)
        if data.get("no_response") or TIMED_OUT.search(cause):
            # The endpoint accepted the request and sent nothing: the CLI retries it within
            # `model_retries`, then ends the turn with its timeout (named in `_timeout_text`).
            self._progress(sid, turn, data, "the endpoint sent nothing in time")
            return
        endpoint = self._config.shown_endpoint or "(the default Anthropic API)"
        if status in (401, 403):
            note = credential_note("claude-code", self._config.credential())
            failure = (
                f"{MODEL_AUTH_FAILED}: claude-code model endpoint {endpoint} answered HTTP "
                f"{status} ({note}): {cause or 'the credential was refused'}"
            )
        elif status is None and attempt >= 2:
            # No HTTP answer at all, twice: the endpoint refuses or does not route (the CLI
            # reports it as `error: "unknown"`; a blip gets one retry).
            failure = (
                f"{MODEL_UNREACHABLE}: claude-code model endpoint {endpoint} is unreachable: "
                f"no HTTP answer to {attempt} attempts (the connection failed"
                + (f": {cause})" if cause and cause != "unknown" else ")")
            )
        elif reason is not None:
            failure = model_failure_text(
                "claude-code", self._config.shown_endpoint, cause, self._config.credential()
            )
        else:
            self._progress(sid, turn, data, cause or f"HTTP {status}")
            return
        turn.model_failure = failure
        self._terminate(turn)  # on the loop thread already (messages are read there)

    @staticmethod
    def _progress(sid: str, turn: TurnState, data: Mapping[str, Any], why: str) -> None:
        """A retry the CLI makes on its own, shown to the user as it happens (not silence)."""
        attempt, limit = data.get("attempt"), data.get("max_retries")
        of = f" (attempt {attempt} of {limit})" if attempt and limit else ""
        note = f"claude-code retries the model request{of}: {why}"
        turn.emit(sid, MessageDelta(turn.turn_id, f"retry-{attempt}", PROGRESS, note))

    def _on_stream_event(
        self, session: SessionState, turn: TurnState, event: Mapping[str, Any]
    ) -> None:
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
                item_id = f"{turn.stream_message_id}:{index}"
                turn.emit(
                    session.agent_session_id,
                    MessageDelta(turn.turn_id, item_id, item_kind, text),
                )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""
