"""Codex app-server v2 shapes of Thread and Turn, projected from a thread's history.

Only the projection lives here; the JSON-RPC envelope is in server.py and the semantics
of turns in history.py."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

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


class LeanTurns(list[dict[str, Any]]):
    """Turns on the wire without their items: every value a string, an integer, None or
    `{"message": str}` (`turn_to_wire` of a `TurnRecord`), which orjson encodes to the very
    text the standard library's encoder writes (`encode_message`). Never changed once made:
    the last one is answered again for the same reduction (`lean_turns_to_wire`), its text
    kept with it (`encoded`)."""

    encoded: str | None = None


_last_lean: tuple[Sequence[TurnRecord], LeanTurns] | None = None
"""The last reduction projected without items, and its projection (`lean_turns_to_wire`)."""
_projecting = threading.RLock()
"""Held while a reduction is projected without items or its projection encoded: a second
thread asking for the same one (a source's `thread/read` that comes while the resume's prewarm
is still projecting: the cold fork's case) waits and takes it, instead of projecting and
encoding the 10,000 turns again beside it."""


def lean_turns_to_wire(turns: Sequence[TurnRecord]) -> LeanTurns:
    """`turns` on the wire without their items; the very list (and its encoded text) again
    when `turns` is the reduction projected last: a warm app-server answers a source's read
    and each fork through its last Turn with the same 10,000 turns (the store keeps the
    reduction, `ThreadStore.turns`; `fork._resolve` hands it on whole)."""
    global _last_lean
    last = _last_lean
    if last is not None and last[0] is turns:
        return last[1]
    with _projecting:
        last = _last_lean
        if last is not None and last[0] is turns:
            return last[1]  # projected meanwhile by the thread this one waited for
        wire = LeanTurns(turn_to_wire(t, i, with_items=False) for i, t in enumerate(turns))
        _last_lean = (turns, wire)
        return wire


_last_columns: tuple[Sequence[TurnRecord], dict[str, list[str]]] | None = None
"""The last reduction's turns as columns, and the reduction (`turn_columns`)."""


def turn_columns(turns: Sequence[TurnRecord]) -> dict[str, list[str]]:
    """`turns` as two columns, `{"turnIds": [...], "turnStatuses": [...]}` (a read or fork that
    asked `turnColumns: true`, ours): each turn's id and status as `turn_to_wire` writes them,
    in order, and nothing else. A host that reads only the ids and statuses of a 10,000-Turn
    thread is sent ~0.2 MB of strings instead of 10,000 objects (2.3 MB), built and decoded
    without a dictionary per turn. The same lists again for the reduction answered last."""
    global _last_columns
    last = _last_columns
    if last is not None and last[0] is turns:
        return last[1]
    columns = {
        "turnIds": [t.id if t.id is not None else f"legacy-turn-{i}" for i, t in enumerate(turns)],
        "turnStatuses": [str(t.status) for t in turns],
    }
    _last_columns = (turns, columns)
    return columns


def turns_to_wire(
    history: ThreadHistory,
    turns: Sequence[TurnRecord] | None = None,
    *,
    with_items: bool = True,
) -> list[dict[str, Any]]:
    """The history's turns on the wire; `turns`: its `build_turns`, when the caller has it."""
    if turns is None:
        turns = build_turns(history.items, with_items=with_items)
    if not with_items:
        return lean_turns_to_wire(turns)
    return [turn_to_wire(t, i) for i, t in enumerate(turns)]


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _encoded(turns: LeanTurns) -> str | None:
    """`turns`' text by orjson, made once (`LeanTurns.encoded`); None where orjson refuses a
    value (the standard library encodes the message instead)."""
    if turns.encoded is None:
        with _projecting:
            if turns.encoded is None:  # else encoded meanwhile by the thread waited for
                try:
                    turns.encoded = orjson.dumps(turns).decode()
                except (TypeError, orjson.JSONEncodeError):
                    return None
    return turns.encoded


def prepare_lean(turns: Sequence[TurnRecord]) -> None:
    """Project `turns` without items and encode them ahead of an answer that will (a resume's
    prewarm: the source read a fork sends next), holding `_projecting` throughout: a read
    that asks meanwhile waits for both and answers with them."""
    with _projecting:
        _encoded(lean_turns_to_wire(turns))


def encode_message(message: Mapping[str, Any]) -> str:
    """`json.dumps(message, separators=(",", ":"), ensure_ascii=False)`, the same text; a
    result's thread whose turns are `LeanTurns` (a 10,000-Turn thread's are 2.3 MB) has them
    encoded by orjson (a fifth of the time) and put in place of a marker no other value holds.
    orjson writes strings, integers, None and objects of them as the standard library does
    (escapes included; `tests/tutti_agent/test_tutti_resume_head.py`); anything it refuses (a
    lone surrogate, an integer beyond 64 bits) is encoded by the standard library alone."""
    result = message.get("result")
    thread = result.get("thread") if isinstance(result, Mapping) else None
    turns = thread.get("turns") if isinstance(thread, Mapping) else None
    if not isinstance(turns, LeanTurns) or not turns:
        return _ENCODE(message)
    assert isinstance(result, Mapping) and isinstance(thread, Mapping)
    raw = _encoded(turns)
    if raw is None:
        return _ENCODE(message)
    marker = f"turns-{os.urandom(16).hex()}"
    text = _ENCODE({**message, "result": {**result, "thread": {**thread, "turns": marker}}})
    return text.replace(f'"{marker}"', raw, 1)


def encode_notification(method: str, params: Mapping[str, Any]) -> str:
    """A notification `{method, params}` as `encode_message` writes it, by orjson (a Turn's
    ~8 notifications, and one per streamed delta: the standard library's encoder was ~2.5 µs
    of each, orjson ~0.2). A notification's params are made of strings, integers, booleans,
    None, lists and string-keyed dicts, which orjson writes as the standard library does
    (escapes included: `tests/tutti_agent/test_tutti_notify_encoding.py`); none carries a
    float (orjson would write 1e16 for the standard library's 1e+16, null for NaN). What
    orjson refuses — a lone surrogate, an integer beyond 64 bits, a Mapping that is no dict —
    is encoded by the standard library as before."""
    try:
        return orjson.dumps({"method": method, "params": params}).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _ENCODE({"method": method, "params": dict(params)})


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


def head_to_wire(
    head: ThreadHead,
    *,
    status: str,
    turns: Sequence[TurnRecord] | None = None,
    with_items: bool = True,
) -> dict[str, Any]:
    """A thread from its head alone (`ThreadStore.head`), with `turns` (its `build_turns`,
    as `thread_to_wire` projects them), or without any (`turns: []`, None): the object
    `thread_to_wire` makes of the whole history."""
    wire: list[dict[str, Any]] = []
    if turns is not None:
        wire = (
            [turn_to_wire(t, i) for i, t in enumerate(turns)]
            if with_items
            else lean_turns_to_wire(turns)
        )
    return _thread_wire(head, head.preview, head.settings, status, wire)


def _thread_wire(
    thread: ThreadHistory | ThreadHead,
    preview_text: str,
    settings: Mapping[str, Any],
    status: str,
    turns: list[dict[str, Any]],
) -> dict[str, Any]:
    meta: Mapping[str, Any] = thread.meta
    created = _unix(meta.get("timestamp"))
    updated: int | None = thread.updated_at if isinstance(thread, ThreadHead) else None
    if updated is None:
        try:
            updated = int(os.stat(thread.path).st_mtime)
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
