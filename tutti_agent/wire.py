"""Codex app-server v2 shapes of Thread and Turn, projected from a thread's history.

Only the projection lives here; the JSON-RPC envelope is in server.py and the semantics
of turns in history.py."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from tutti_agent import __version__
from tutti_agent.history import TurnRecord, build_turns, is_real_user_message, message_text
from tutti_agent.store import ThreadHead, ThreadHistory


def turn_to_wire(turn: TurnRecord, index: int = 0, *, with_items: bool = True) -> dict[str, Any]:
    """A turn on the wire; `with_items=False` (a read that asked `turnItems: false`): its
    items left out, `itemsView: "notLoaded"`."""
    turn_id = turn.id if turn.id is not None else f"legacy-turn-{index}"
    return {
        "id": turn_id,
        "rootTurnId": turn_id,
        "items": [dict(item) for item in turn.items] if with_items else [],
        "itemsView": "full" if with_items else "notLoaded",
        "status": str(turn.status),
        "error": {"message": turn.error} if turn.error is not None else None,
        "startedAt": turn.started_at,
        "completedAt": turn.completed_at,
        "durationMs": turn.duration_ms,
    }


def turns_to_wire(
    history: ThreadHistory,
    turns: Sequence[TurnRecord] | None = None,
    *,
    with_items: bool = True,
) -> list[dict[str, Any]]:
    """The history's turns on the wire; `turns`: its `build_turns`, when the caller has it."""
    if turns is None:
        turns = build_turns(history.items, with_items=with_items)
    return [turn_to_wire(t, i, with_items=with_items) for i, t in enumerate(turns)]


def preview(history: ThreadHistory) -> str:
    for line in history.lines:
        if is_real_user_message(line.item):
            return message_text(line.item.payload)[:200]
    return ""


def _unix(ts: object) -> int | None:
    if not isinstance(ts, str):
        return None
    try:
        return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def thread_to_wire(
    history: ThreadHistory,
    *,
    status: str,
    include_turns: bool,
    turns: Sequence[TurnRecord] | None = None,
    with_items: bool = True,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`settings`: the history's `effective_settings()`, when the caller has them (a pass
    over every line of the history fewer)."""
    if settings is None:
        settings = history.effective_settings()
    return _thread_wire(
        history,
        preview(history),
        settings,
        status,
        turns_to_wire(history, turns, with_items=with_items) if include_turns else [],
    )


def head_to_wire(head: ThreadHead, *, status: str) -> dict[str, Any]:
    """A thread without its turns (`turns: []`), from its head alone (`ThreadStore.head`):
    the same object `thread_to_wire` makes of the whole history with `include_turns=False`."""
    return _thread_wire(head, head.preview, head.settings, status, [])


def _thread_wire(
    thread: ThreadHistory | ThreadHead,
    preview_text: str,
    settings: Mapping[str, Any],
    status: str,
    turns: list[dict[str, Any]],
) -> dict[str, Any]:
    meta: Mapping[str, Any] = thread.meta
    created = _unix(meta.get("timestamp"))
    try:
        updated: int | None = int(os.stat(thread.path).st_mtime)
    except OSError:
        updated = created
    return {
        "id": thread.thread_id,
        "sessionId": thread.thread_id,
        "forkedFromId": thread.forked_from_id,
        "parentThreadId": None,
        "preview": preview_text,
        "ephemeral": False,
        "historyMode": "paginated",
        "modelProvider": settings.get("model_provider"),
        "model": settings.get("model"),
        "createdAt": created,
        "updatedAt": updated,
        "status": {"type": status},
        "path": str(thread.path),
        "cwd": settings.get("cwd"),
        "cliVersion": meta.get("cli_version", __version__),
        "source": meta.get("source", "appServer"),
        "name": None,
        "turns": turns,
    }
