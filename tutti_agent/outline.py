"""A thread read lean: its head (what its answers say of it besides its turns) and its outline
(the head, its turns without items and where its settled turns end in its file), made by one pass
that decodes every line of a single-file rollout and keeps none of them.

A source a host forks is answered from its outline (`thread/read` without items, `thread/fork`
of an unopened child through a settled turn): the same answers as from the whole history, for a
third of its CPU and none of its 60,000 line objects on a 10,000-Turn thread."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutti_agent.history import (
    ThreadHistoryBuilder,
    TurnRecord,
    is_env_context,
    is_real_user_message,
    message_text,
)
from tutti_agent.rollout import (
    REFUSED,
    CopiedSpan,
    LineType,
    RolloutItem,
    fast_loads,
    gc_paused,
    lines_of,
    read_file,
    read_span,
    standard_loads,
)


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """What a thread's answer says of it besides its turns, read from a single-file rollout's
    first lines and its settings lines (`ThreadStore.head`), or by its outline's pass."""

    thread_id: str
    path: Path
    meta: Mapping[str, Any]
    settings: dict[str, Any]
    """`effective_settings()` of the whole history."""
    preview: str
    """The first real user message's text, cut at 200 characters (`wire.preview`)."""

    @property
    def forked_from_id(self) -> str | None:
        v = self.meta.get("forked_from_id")
        return str(v) if v is not None else None


_LIFECYCLE = frozenset({"task_started", "task_complete", "turn_aborted", "error"})
"""The events that change a reduction without items while a turn is open (`build_turns` with
`with_items=False`): every other line changes it only while no turn is open."""
_TERMINAL = frozenset({"task_complete", "turn_aborted"})
_EVENT_MSG: str = LineType.EVENT_MSG.value
_RESPONSE_ITEM: str = LineType.RESPONSE_ITEM.value
_SESSION_META: str = LineType.SESSION_META.value


@dataclass(frozen=True, slots=True)
class ThreadOutline:
    """A single-file rollout as its lean answers need it, for the file `key` names (device,
    inode, size, mtime: a rollout only grows, so the same key holds the same lines)."""

    head: ThreadHead
    key: tuple[int, int, int, int]
    turns: tuple[TurnRecord, ...]
    """`build_turns(history.items, with_items=False)` of the whole history."""
    line_count: int
    first_end: int
    """The byte offset just after the first line (`session_meta`)."""
    settled_ends: Mapping[int, int]
    """For each line that is a terminal event (`task_complete`, `turn_aborted`): its index + 1
    (the exclusive end of a prefix it settles) → the byte offset just after it."""
    first_inner_meta: int | None
    """The index of the first `session_meta` line after the first, if any."""
    preview_index: int | None
    """The index of the first real user message (the head's preview), if any."""
    has_env_context: bool
    """Whether a line is the `<environment_context>` user fragment (`is_env_context`)."""

    @property
    def thread_id(self) -> str:
        return self.head.thread_id

    @property
    def path(self) -> Path:
        return self.head.path

    def preview_before(self, end: int) -> str:
        """`wire.preview` of the lines `[0, end)`."""
        index = self.preview_index
        return self.head.preview if index is not None and index < end else ""


def read_outline(path: Path, thread_id: str) -> ThreadOutline | None:
    """The outline of the rollout at `path`, from one pass that decodes each line as
    `read_rollout` does (the same decoder, the same checks of its keys) and feeds the reducer
    only the lines that can change it (`_LIFECYCLE` events, and any line while no turn is open:
    the turns are exactly `build_turns`'s without items). None — read the whole history with
    `ThreadStore.load`, which names any error — for anything but a well-formed single-file
    rollout of this thread: a line that does not decode or lacks a key, a key of another type
    than the writer writes, a payload that is no object, an ordinal out of order, a first line
    that is not this thread's `session_meta`, a Referenced child (its `history_base`), a
    malformed settings line, or a file that changed while it was read."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    data = read_file(path)
    if len(data) != key[2]:
        return None
    standard = standard_loads(data)
    loads = fast_loads(data, standard)
    builder = ThreadHistoryBuilder(with_items=False)
    handle, handle_event, active = builder.handle, builder.handle_event, builder.has_active_turn
    new = tuple.__new__
    meta: dict[str, Any] | None = None
    settings: dict[str, Any] = {}
    settled: dict[int, int] = {}
    first_end = 0
    inner_meta: int | None = None
    preview_at: int | None = None
    preview = ""
    env = False
    index = offset = 0
    with gc_paused():
        for raw in lines_of(data):
            offset += len(raw) + 1
            try:
                try:
                    obj = loads(raw)
                except REFUSED:
                    obj = standard(raw)
                ordinal, kind, payload = obj["ordinal"], obj["type"], obj["payload"]
                stamp = obj["timestamp"]
            except (ValueError, KeyError, TypeError):
                return None
            if (
                type(ordinal) is not int
                or ordinal != index
                or type(kind) is not str
                or type(stamp) is not str
                or type(payload) is not dict
            ):
                return None
            if kind == _EVENT_MSG:
                event = payload.get("type")
                if event in _LIFECYCLE or not active():
                    handle_event(index, event, payload)
                if event in _TERMINAL:
                    settled[index + 1] = offset
                elif event == "thread_settings_applied":
                    applied = payload.get("thread_settings") or {}
                    if not isinstance(applied, dict):
                        return None
                    settings["cwd"] = applied.get("cwd", settings.get("cwd"))
                    settings["model"] = applied.get("model", settings.get("model"))
            else:
                item = new(RolloutItem, (kind, payload))
                if not active():
                    handle(index, item)
                if kind == _RESPONSE_ITEM:
                    if preview_at is None and is_real_user_message(item):
                        preview_at, preview = index, message_text(payload)[:200]
                    if not env and is_env_context(item):
                        env = True
                elif kind == _SESSION_META:
                    if index == 0:
                        meta, first_end = payload, offset
                        settings = {
                            "cwd": meta.get("cwd"),
                            "model": meta.get("model"),
                            "model_provider": meta.get("model_provider"),
                        }
                    elif inner_meta is None:
                        inner_meta = index
            if index == 0 and meta is None:
                return None  # the first line is no session_meta
            index += 1
        turns = tuple(builder.turns())
    if meta is None or str(meta.get("id")) != thread_id or meta.get("history_base") is not None:
        return None
    head = ThreadHead(thread_id, path, meta, settings, preview)
    return ThreadOutline(
        head=head,
        key=key,
        turns=turns,
        line_count=index,
        first_end=first_end,
        settled_ends=settled,
        first_inner_meta=inner_meta,
        preview_index=preview_at,
        has_env_context=env,
    )


def outline_span(outline: ThreadOutline, end: int) -> CopiedSpan | None:
    """Lines `[1, end)` of the outlined rollout as the bytes its file holds, for a Copied child
    to write verbatim (`ThreadStore.copied_span` for a history); None unless `end` is settled
    (its last line a terminal event), none of those lines is a `session_meta`, the file is still
    the one outlined (device, inode) and holds them, and the span's last line reads back as that
    terminal event with its ordinal."""
    stop = outline.settled_ends.get(end)
    if stop is None or not 1 < end <= outline.line_count:
        return None
    if outline.first_inner_meta is not None and outline.first_inner_meta < end:
        return None
    data = read_span(outline.path, outline.first_end, stop, outline.key[:2])
    if data is None or not data.endswith(b"\n"):
        return None
    last = data[data.rfind(b"\n", 0, len(data) - 1) + 1 : -1]
    try:
        obj = json.loads(last)
    except ValueError:
        return None
    payload = obj.get("payload") if isinstance(obj, dict) else None
    if (
        not isinstance(payload, dict)
        or obj.get("ordinal") != end - 1
        or obj.get("type") != _EVENT_MSG
        or payload.get("type") not in _TERMINAL
    ):
        return None
    return CopiedSpan(data, outline.first_end, 1, end - 1)
