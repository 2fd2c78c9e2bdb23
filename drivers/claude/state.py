"""The Claude Code driver's worker-side state: a session (its dirs, environment and one active
turn), the active turn as the CLI streams it, and a tool-permission request the CLI is blocked
on. Plain data, guarded by the session's lock; plus the id and parameter checks they share."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domain.errors import InvalidArgument
from drivers.base import Emit
from drivers.claude_transcript import transcript_path

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)


def is_uuid(value: str) -> bool:
    return bool(_UUID_RE.match(value))


def required(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(key, f"{key} is required")
    return value


@dataclass(slots=True)
class PendingPermission:
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
class TurnState:
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
    pending: dict[str, PendingPermission] = field(
        default_factory=dict
    )  # guarded by the session lock
    lanes: set[str] = field(default_factory=set)  # sidechain lanes already recorded
    # Streaming (include_partial_messages): the API message being streamed, its block kinds,
    # and how many blocks of each API message the settled AssistantMessages have shown.
    model_failure: str | None = None
    """A typed model failure (auth/unreachable) that made us stop the CLI's retries."""
    provider_failure: str | None = None
    """The CLI stayed stopped and was killed (`provider_stopped`, in words)."""
    stream_message_id: str | None = None
    stream_blocks: dict[int, str] = field(default_factory=dict)
    settled_blocks: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class SessionState:
    agent_session_id: str
    provider_session_id: str
    config_dir: Path
    private_home: Path
    cwd: str
    model: str | None
    claude_settings: str | None
    env: dict[str, str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: TurnState | None = None
    stopped: bool = False
    """`session.stop` took it: no CLI is started ahead for it any more."""

    @property
    def transcript(self) -> Path:
        return transcript_path(self.config_dir, self.cwd, self.provider_session_id)
