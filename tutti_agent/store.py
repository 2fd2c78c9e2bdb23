"""Thread store: rollout lineage resolution, source reservations and deletion.

A thread's logical history is its own rollout segment preceded, for a Referenced fork, by
the ancestor prefix named by `history_base`; this module resolves that chain (rejecting
cycles, missing files and mismatched metadata) and guards deletion (seed 004 §9-§10)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, cast

from tutti_agent.errors import (
    LineageError,
    NoRolloutFound,
    ThreadReferenced,
    ThreadReserved,
)
from tutti_agent.history import TurnRecord, build_turns, is_real_user_message, message_text
from tutti_agent.rollout import (
    CopiedSpan,
    KnownLines,
    LineType,
    RolloutItem,
    RolloutLine,
    RolloutWriter,
    SpanSource,
    decode_rollout,
    encode_new_rollout,
    file_holds,
    find_rollout_path,
    fsync_dir,
    iter_rollout_paths,
    lines_of_decoded,
    make_dirs,
    new_rollout_path,
    open_span,
    read_file,
    read_rollout,
    thread_id_of_path,
    write_chunks,
)

_HEADER_EVENTS = frozenset({"thread_settings_applied"})
_ITEM = itemgetter(2)
_ORDINAL = itemgetter(0)
"""A `RolloutLine`'s item (its third field), for `map`: a 60,000-line history's items are
listed in C, not by a Python-level loop."""
_ITEM_TYPE = attrgetter("item.type")


@dataclass(frozen=True, slots=True)
class HistoryPosition:
    """A frozen physical upper bound into one rollout: `[0, end_ordinal_exclusive)`."""

    thread_id: str
    end_ordinal_exclusive: int
    end_byte_offset: int

    def to_json(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "end_ordinal_exclusive": self.end_ordinal_exclusive,
            "end_byte_offset": self.end_byte_offset,
        }

    @staticmethod
    def from_json(raw: object, owner: str) -> HistoryPosition:
        if not isinstance(raw, Mapping):
            raise LineageError(owner, "malformed history_base")
        try:
            return HistoryPosition(
                str(raw["thread_id"]),
                int(raw["end_ordinal_exclusive"]),
                int(raw["end_byte_offset"]),
            )
        except (KeyError, TypeError, ValueError):
            raise LineageError(owner, "malformed history_base") from None


@dataclass(frozen=True, slots=True)
class Segment:
    """The lines of one physical rollout inside a logical history."""

    thread_id: str
    path: Path
    first_ordinal: int
    length: int
    content_start: int  # first ordinal after the header lines (session_meta, settings)
    base: HistoryPosition | None

    @property
    def end_ordinal(self) -> int:
        return self.first_ordinal + self.length


@dataclass(frozen=True, slots=True)
class ThreadHistory:
    """A thread's full logical history, ordinals contiguous from 0 across its segments."""

    thread_id: str
    path: Path
    meta: Mapping[str, Any]
    lines: tuple[RolloutLine, ...]
    segments: tuple[Segment, ...]

    @property
    def items(self) -> list[RolloutItem]:
        return list(map(_ITEM, self.lines))  # `[line.item for line in ...]`, in C

    @property
    def own_segment(self) -> Segment:
        return self.segments[-1]

    @property
    def next_ordinal(self) -> int:
        return len(self.lines)

    @property
    def forked_from_id(self) -> str | None:
        v = self.meta.get("forked_from_id")
        return str(v) if v is not None else None

    @property
    def history_base(self) -> HistoryPosition | None:
        return self.own_segment.base

    def effective_settings(self) -> dict[str, Any]:
        """cwd/model as last applied: the child's own settings win over the ancestors'."""
        settings: dict[str, Any] = {
            "cwd": self.meta.get("cwd"),
            "model": self.meta.get("model"),
            "model_provider": self.meta.get("model_provider"),
        }
        event_msg = LineType.EVENT_MSG.value
        for line in self.lines:
            # `line.item.event_type` inlined: one pass over every line of the history (60,000
            # for a 10,000-Turn thread), made for every thread a request projects.
            item = line.item
            if item.type == event_msg and item.payload.get("type") == "thread_settings_applied":
                ts = item.payload.get("thread_settings") or {}
                settings["cwd"] = ts.get("cwd", settings["cwd"])
                settings["model"] = ts.get("model", settings["model"])
        return settings

    def position_at(self, end_ordinal_exclusive: int) -> HistoryPosition | None:
        """The physical position of a logical boundary (seed 004 §9).

        A boundary at (or inside the header of) a segment's start falls back to the previous
        segment's end, so a reference never points at an empty prefix of a segment."""
        if end_ordinal_exclusive <= 0:
            return None
        last = end_ordinal_exclusive - 1
        for seg in self.segments:
            if seg.first_ordinal <= last < seg.end_ordinal:
                if end_ordinal_exclusive <= seg.content_start:
                    return seg.base
                line = self.lines[last]
                return HistoryPosition(seg.thread_id, end_ordinal_exclusive, line.end_byte_offset)
        raise ValueError(f"boundary {end_ordinal_exclusive} beyond history of {self.thread_id}")


HEAD_PREVIEW_LINES = 64
"""How many lines after `session_meta` a head read decodes looking for the thread's first real
user message (its preview); a longer rollout without one there is read whole."""


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """What a thread's answer says of it besides its turns, read from a single-file rollout's
    first lines and its settings lines (`ThreadStore.head`), without parsing the rest."""

    thread_id: str
    path: Path
    meta: Mapping[str, Any]
    settings: dict[str, Any]
    """`effective_settings()` of the whole history."""
    preview: str
    """The first real user message's text, cut at 200 characters (`wire.preview`)."""
    updated_at: int | None = field(default=None, compare=False)
    """The file's mtime in whole seconds where the reader has just taken it (a child it wrote),
    else None: the answer takes it then. Not the head's identity (not compared)."""

    @property
    def forked_from_id(self) -> str | None:
        v = self.meta.get("forked_from_id")
        return str(v) if v is not None else None


class Reservation:
    """Keeps a source undeletable while a fork that depends on it is being prepared."""

    def __init__(self, store: ThreadStore, thread_id: str) -> None:
        self._store = store
        self.thread_id = thread_id
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._store._release(self.thread_id)

    @property
    def released(self) -> bool:
        return self._released


PARSED_ROLLOUTS_CACHED = 32
"""Parsed rollouts a store keeps (LRU): a fork reads its source twice (`thread/read`, then
`thread/fork`'s prepare), and a warm app-server forks the same source again and again."""


class ThreadStore:
    """All rollouts under one `TUTTI_AGENT_HOME`; safe to share between threads.

    Two caches spare a warm app-server work that repeats on every request: where
    a thread's rollout lives (checked to still be a file before use, else looked up again),
    and the parsed lines of recently read rollouts, reused only while the file's identity,
    size and modification time are unchanged (rollouts only grow, and every write changes
    size or mtime), so a read never returns lines the file does not hold."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._cond = threading.Condition()
        self._reservations: dict[str, int] = {}
        self._cache_lock = threading.Lock()
        self._paths: dict[str, Path] = {}
        self._parsed: OrderedDict[Path, tuple[tuple[int, int, int, int], list[RolloutLine]]] = (
            OrderedDict()
        )
        self._memo: dict[tuple[Path, str], tuple[list[RolloutLine], Any]] = {}
        self._head_read: tuple[Path, tuple[int, int, int, int], bytes] | None = None
        """The bytes `head` read last, with the file's key unchanged across that read: the
        next parse of that file under that key takes them instead of reading the file again
        (a resume's deferred load: 14.7 MB, ~3,600 pages touched afresh, not read twice);
        dropped by the next `_read`, whichever file it reads."""
        self._reducing = threading.Lock()

    def _find(self, thread_id: str) -> Path | None:
        """Exact lookup (`find_rollout_path`), remembered while the file stays there."""
        with self._cache_lock:
            known = self._paths.get(thread_id)
        if known is not None and known.is_file():
            return known
        path = find_rollout_path(self.home, thread_id)
        with self._cache_lock:
            if path is None:
                self._paths.pop(thread_id, None)
            else:
                self._paths[thread_id] = path
        return path

    def _read(self, path: Path, key: tuple[int, int, int, int] | None = None) -> list[RolloutLine]:
        """`read_rollout`, reusing the last parse while the file is unchanged; `key`: the
        file's `_file_key` the caller has just taken."""
        key = _file_key(path) if key is None else key
        with self._cache_lock:
            # Taken by the next read whatever it finds: never held past it.
            head_read, self._head_read = self._head_read, None
            hit = self._parsed.get(path)
            if hit is not None and hit[0] == key:
                self._parsed.move_to_end(path)
                return hit[1]
        if head_read is not None and head_read[:2] == (path, key):
            # The same file, unchanged since `head` read it whole (rollouts only grow, and
            # every write changes size or mtime): what a read would return now.
            lines = decode_rollout(head_read[2], path)
        else:
            lines = read_rollout(path)
        if _file_key(path) == key:  # not written while we read: the parse matches the key
            with self._cache_lock:
                self._parsed[path] = (key, lines)
                self._parsed.move_to_end(path)
                while len(self._parsed) > PARSED_ROLLOUTS_CACHED:
                    self._parsed.popitem(last=False)
        return lines

    def turns(self, history: ThreadHistory, *, with_items: bool = True) -> tuple[TurnRecord, ...]:
        """`build_turns(history.items, with_items=...)`, reduced once per parse of a
        single-file history and kept with it: a warm app-server's `thread/read` and each
        `thread/fork` of the same unchanged source (its boundary, its reply) share one
        reduction instead of one each (60,000 lines for a 10,000-Turn thread). Kept only while
        `history` is built from the very parse this store holds for its file (a rollout that
        grew is parsed and reduced again). Two threads asking for the same reduction make it
        once (a resume's `prewarm` and the `thread/read` that follows it)."""
        turns: tuple[TurnRecord, ...] = self._per_parse(
            history,
            "turns" if with_items else "lean turns",
            lambda: tuple(build_turns(history.items, with_items=with_items)),
        )
        return turns

    def settings(self, history: ThreadHistory) -> dict[str, Any]:
        """`history.effective_settings()` (a copy), made once per parse as `turns` is: a fork
        reads its source's settings, and a warm app-server forks the same source again and
        again (a pass over 60,000 lines each)."""
        return dict(self._per_parse(history, "settings", history.effective_settings))

    def preview_before(self, history: ThreadHistory, end: int) -> str:
        """`wire.preview` of a history whose lines after its first are `history.lines[1:end]`
        (and a settings line): the first real user message among them, cut at 200 characters.
        Where that message is (and its text) is found once per parse: a warm app-server forks
        the same source again and again."""
        index, text = self._per_parse(history, "first user message", lambda: _first_user(history))
        return str(text) if index < end else ""

    def _holds_inner_meta(self, history: ThreadHistory) -> bool:
        """Whether any line but the first of a single-file history is a `session_meta` (made
        once per parse, as `turns`)."""
        return bool(
            self._per_parse(
                history,
                "inner meta",
                lambda: LineType.SESSION_META.value in map(_ITEM_TYPE, history.lines[1:]),
            )
        )

    def _per_parse(self, history: ThreadHistory, what: str, make: Callable[[], Any]) -> Any:
        """`make()`, kept with the parse `history` is assembled from (`_parse_of`), under the
        name `what`; made anew (and not kept) for a history that is no cached parse."""
        parse = self._parse_of(history)
        if parse is None:
            return make()
        key = (history.path, what)
        with self._cache_lock:
            hit = self._memo.get(key)
        if hit is not None and hit[0] is parse:
            return hit[1]
        with self._reducing:
            with self._cache_lock:
                hit = self._memo.get(key)
            if hit is not None and hit[0] is parse:
                return hit[1]  # made meanwhile by another thread
            value = make()
            self._keep(key, parse, value)
        return value

    def _keep(self, key: tuple[Path, str], parse: list[RolloutLine], value: object) -> None:
        """`value` kept under `key` with `parse`, the memo pruned of what the parses no longer
        cached made."""
        with self._cache_lock:
            self._memo[key] = (parse, value)
            if len(self._memo) > 4 * PARSED_ROLLOUTS_CACHED:
                # Only the parses still cached keep what was made of them.
                for stale in [k for k in self._memo if k[0] not in self._parsed]:
                    del self._memo[stale]

    def _parse_of(self, history: ThreadHistory) -> list[RolloutLine] | None:
        """The cached parse `history`'s lines are (a single-file history assembled from it),
        else None."""
        if len(history.segments) != 1 or not history.lines:
            return None
        with self._cache_lock:
            hit = self._parsed.get(history.path)
        if hit is None:
            return None
        lines = hit[1]
        if len(lines) != len(history.lines) or lines[-1] is not history.lines[-1]:
            return None
        return lines

    def adopt_decoded(
        self,
        path: Path,
        data: bytes,
        records: Sequence[Mapping[str, Any]],
        known: KnownLines | None = None,
    ) -> bool:
        """Take `records` — each line of `data` decoded, by a caller that validated those very
        bytes — as the parse of the file at `path`, if the file holds exactly `data` (read
        here, in full, and compared): its next `load` assembles them instead of decoding
        the file again. False (nothing taken) when the file holds anything else. `known`: some
        of those lines already built (`lines_of_decoded`)."""
        key = _file_key(path)
        if key[2] != len(data) or not file_holds(path, data) or _file_key(path) != key:
            return False
        lines = lines_of_decoded(data, records, path, known=known)
        with self._cache_lock:
            self._parsed[path] = (key, lines)
            self._parsed.move_to_end(path)
            while len(self._parsed) > PARSED_ROLLOUTS_CACHED:
                self._parsed.popitem(last=False)
        return True

    def _forget(self, thread_id: str, path: Path) -> None:
        with self._cache_lock:
            self._paths.pop(thread_id, None)
            self._parsed.pop(path, None)

    # -- files ------------------------------------------------------------------------
    def create_rollout(
        self,
        thread_id: str,
        meta: Mapping[str, Any],
        *,
        first_ordinal: int = 0,
        items: Sequence[RolloutItem] = (),
    ) -> RolloutWriter:
        """A new rollout of `session_meta` + `items`, durable on return (one write, one file
        fsync, one fsync per changed directory: `RolloutWriter.create`)."""
        path = new_rollout_path(self.home, thread_id)
        meta_item = RolloutItem(LineType.SESSION_META, dict(meta))
        writer, _ = RolloutWriter.create(path, first_ordinal, [meta_item, *items])
        with self._cache_lock:
            self._paths[thread_id] = path
        return writer

    def create_child_lines(
        self,
        thread_id: str,
        meta: Mapping[str, Any],
        *,
        first_ordinal: int = 0,
        items: Sequence[RolloutItem] = (),
        copied: CopiedSpan | None = None,
        copied_lines: bool = True,
    ) -> tuple[Path, list[RolloutLine]]:
        """A new rollout (as `create_rollout`) this server writes once and leaves closed (a
        fork's child), and the lines it wrote (with their byte offsets); `copied` goes verbatim
        between `session_meta` and `items` (`copied_span`); `copied_lines=False`: the copied
        lines are not among those returned. The same file, durable on return with the same
        syncs (the file, then its directory and each parent whose entries changed), the same
        cleanup on failure — written by descriptor, not through a buffered file object: one
        `open`, the lines in one `writev`, no `fstat`/`ioctl`/`lseek` of the object's own and no
        `write` per chunk. `sessions/` is not probed first: it is created (and its parents'
        changes fsynced) only when the create finds it missing. Returns the path and the lines
        written."""
        path = new_rollout_path(self.home, thread_id)
        try:  # the copied span's descriptor is closed whatever the encode or the write raises
            new_rollout = encode_new_rollout(
                first_ordinal,
                [RolloutItem(LineType.SESSION_META, dict(meta)), *items],
                copied,
                copied_lines,
            )
            _write_new_file(path, new_rollout.chunks)
        finally:
            if copied is not None and isinstance(copied.data, SpanSource):
                copied.data.close()
        with self._cache_lock:
            self._paths[thread_id] = path
        return path, new_rollout.lines

    def copied_span(self, history: ThreadHistory, end: int) -> CopiedSpan | None:
        """Lines `[1, end)` of a single-file history as the bytes its file holds, for a Copied
        child to write verbatim instead of encoding each line again; None (encode them) unless
        the file is still the very one whose parse `history` holds, none of those lines is a
        `session_meta`, and the span's last line reads back as the parsed one.

        The parse is the file's (the cache keys it by device, inode, size and mtime) and a
        rollout only grows (a torn tail is cut past the last complete line), so the same inode
        still holds those bytes; the last line is checked anyway, for the price of one line.
        A short span read (and checked) is kept with the parse, one per source: the next fork
        of the same unchanged source through the same turn opens and reads nothing (a warm
        app-server forks one source again and again)."""
        if len(history.segments) != 1 or not 1 < end <= len(history.lines):
            return None
        lines = history.lines[1:end]
        if self._holds_inner_meta(history) and LineType.SESSION_META.value in map(
            _ITEM_TYPE, lines
        ):
            return None
        with self._cache_lock:
            hit = self._parsed.get(history.path)
        if hit is None or len(hit[1]) < end or hit[1][end - 1] is not history.lines[end - 1]:
            return None
        start, stop = history.lines[0].end_byte_offset, lines[-1].end_byte_offset
        kept_key = (history.path, "copied span")
        with self._cache_lock:
            kept = self._memo.get(kept_key)
        if kept is not None and kept[0] is hit[1]:
            held = cast(CopiedSpan, kept[1])
            if held.start == start and len(held.lines) == len(lines):
                return held
        span = self._read_span(history, hit[0][:2], lines, start, stop)
        if span is not None and isinstance(span.data, bytes):
            self._keep(kept_key, hit[1], span)
        return span

    def _read_span(
        self,
        history: ThreadHistory,
        identity: tuple[int, int],
        lines: Sequence[RolloutLine],
        start: int,
        stop: int,
    ) -> CopiedSpan | None:
        """`copied_span`'s bytes `[start, stop)` of `history`'s file (the inode `identity`
        names), whose last line must read back as `lines[-1]`."""
        # The span stays in the file, held open (the very inode the parse came from): the
        # child's write copies it in the kernel. Only its last line is read here, with the
        # newline before it.
        source = open_span(history.path, start, stop, identity)
        if source is None:
            return None
        data: bytes | SpanSource = source
        try:
            if len(source) < SPAN_COPY_MIN_BYTES:
                # A short span read into this process: one `pread`, where the kernel's copy
                # would cost its writes two system calls more (a warm small fork's child).
                data = source.read()
                source.close()
                if not data.endswith(b"\n"):
                    return None
                last = data[data.rfind(b"\n", 0, len(data) - 1) + 1 : -1]
            else:
                last_start = history.lines[len(lines) - 1].end_byte_offset  # the line before
                raw = os.pread(source.fd, stop - last_start + 1, last_start - 1)
                if not (raw[:1] == b"\n" and raw.endswith(b"\n") and raw.count(b"\n") == 2):
                    source.close()
                    return None
                last = raw[1:-1]
            obj = json.loads(last)
        except (OSError, ValueError):
            source.close()
            return None
        parsed = lines[-1]
        if not isinstance(obj, dict) or (
            obj.get("ordinal"),
            obj.get("timestamp"),
            obj.get("type"),
            obj.get("payload"),
        ) != (parsed.ordinal, parsed.timestamp, parsed.item.type, parsed.item.payload):
            source.close()
            return None
        return CopiedSpan(data, start, lines)

    def head(self, thread_id: str) -> ThreadHead | None:
        """The thread's `ThreadHead`, read from the bytes of its rollout without decoding its
        history: the first line (`session_meta`), the lines from the second on until the first
        real user message (the preview), and, from the end backwards, the lines whose bytes
        name `thread_settings_applied` until the last `cwd` and `model` are known (any other
        line holding those bytes is decoded and passed over). Every rollout writer writes that
        ASCII name unescaped (ours, Codex's), so no settings line is missed. A torn last line is
        not read. A missing rollout raises `NoRolloutFound` as `load` does; None (read the
        whole history with `load`, which also names any error) for a Referenced child (its
        settings and preview may lie in an ancestor), a first line that is not this thread's
        `session_meta`, a line that does not decode or is not a rollout line, or no user
        message within `HEAD_PREVIEW_LINES` lines of a longer rollout."""
        path = self._find(thread_id)
        if path is None:
            raise NoRolloutFound(thread_id)
        key = _file_key(path)
        data = read_file(path)
        if len(data) == key[2] and _file_key(path) == key:
            with self._cache_lock:
                self._head_read = (path, key, data)
        end = data.rfind(b"\n") + 1  # complete lines only
        first_end = data.find(b"\n", 0, end)
        if first_end < 0:
            return None
        try:
            first = _line_at(data, 0, first_end)
            if first is None or first[0] != LineType.SESSION_META.value:
                return None
            meta = first[1]
            if str(meta.get("id")) != thread_id or meta.get("history_base") is not None:
                return None
            preview = _head_preview(data, first_end + 1, end)
            settings = _last_settings(data, meta, first_end + 1, end)
        except ValueError:
            return None
        if preview is None or settings is None:
            return None
        return ThreadHead(thread_id, path, meta, settings, preview)

    def open_writer(self, history: ThreadHistory) -> RolloutWriter:
        return RolloutWriter(history.path, history.next_ordinal, create=False)

    def path_of(self, thread_id: str) -> Path:
        path = self._find(thread_id)
        if path is None:
            raise NoRolloutFound(thread_id)
        return path

    def exists(self, thread_id: str) -> bool:
        return self._find(thread_id) is not None

    # -- lineage ----------------------------------------------------------------------
    def load(self, thread_id: str) -> ThreadHistory:
        """Resolve the full logical history; a missing own rollout is `NoRolloutFound`.

        The remembered path is checked to still be a regular file by the same `stat` that
        keys its parse (`_find`'s `is_file` and `_read`'s key were two of the same file)."""
        with self._cache_lock:
            known = self._paths.get(thread_id)
        if known is not None:
            key = _regular_file_key(known)
            if key is not None:
                return self._load(thread_id, known, frozenset(), key)
        path = self._find(thread_id)
        if path is None:
            raise NoRolloutFound(thread_id)
        return self._load(thread_id, path, frozenset())

    def _load(
        self,
        thread_id: str,
        path: Path,
        visiting: frozenset[str],
        file_key: tuple[int, int, int, int] | None = None,
    ) -> ThreadHistory:
        if thread_id in visiting:
            raise LineageError(thread_id, "lineage cycle")
        own = self._read(path, file_key)
        key = (path, "history")
        with self._cache_lock:
            hit = self._memo.get(key)
        if hit is not None and hit[0] is own and hit[1].thread_id == thread_id:
            # A single-file history assembled from this very parse: the same checks passed.
            return cast(ThreadHistory, hit[1])
        history = self._assemble(thread_id, path, own, visiting, None)
        if len(history.segments) == 1:
            with self._cache_lock:
                if own is self._parsed.get(path, (None, None))[1]:
                    self._memo[key] = (own, history)
        return history

    def adopt_created(
        self,
        thread_id: str,
        path: Path,
        own: list[RolloutLine],
        parent: ThreadHistory | None,
        *,
        remember: bool = True,
    ) -> ThreadHistory:
        """The history of a rollout this store just created (`create_rollout`) from the lines
        it wrote, with the same checks as `load` — identity, history_base, ordinals, the
        parent's boundary offset — but without reading back and re-parsing the file it just
        fsynced (a fork would otherwise read its whole child again). `parent`: the history a
        Referenced child's history_base points into (the fork's frozen source), else None.
        The parse is remembered as the file's, so a later read of the unchanged file reuses it
        (`remember=False`: only its path, for a child this server does not open — a
        10,000-Turn child's parse kept for nothing is 60,000 lines more for the collector and
        the cache)."""
        key = _file_key(path)
        if key[2] != (own[-1].end_byte_offset if own else 0):
            raise LineageError(thread_id, "rollout does not hold the lines written")
        history = self._assemble(thread_id, path, own, frozenset(), parent)
        with self._cache_lock:
            self._paths[thread_id] = path
            if not remember:
                return history
            self._parsed[path] = (key, own)
            self._parsed.move_to_end(path)
            while len(self._parsed) > PARSED_ROLLOUTS_CACHED:
                self._parsed.popitem(last=False)
        return history

    def adopt_unopened(self, thread_id: str, path: Path, size: int) -> int:
        """A rollout this store just created and will not open (a fork child forked
        `loaded: false` from a copied span): its file must hold the `size` bytes written, and
        only its path is remembered. Its lines are the copied span's — checked when the source
        was assembled — between its own `session_meta` and settings lines, their ordinals
        contiguous by construction (`RolloutWriter.create`); a later `load` reads it whole.
        Returns the file's mtime in whole seconds, from the same `stat` (the answer's
        `updatedAt`)."""
        key = _file_key(path)
        if key[2] != size:
            raise LineageError(thread_id, "rollout does not hold the lines written")
        with self._cache_lock:
            self._paths[thread_id] = path
        return key[3] // 1_000_000_000

    def _assemble(
        self,
        thread_id: str,
        path: Path,
        own: list[RolloutLine],
        visiting: frozenset[str],
        parent: ThreadHistory | None,
    ) -> ThreadHistory:
        """A logical history from a rollout's own lines; a Referenced rollout's parent is
        loaded from this home unless given (then it must be the thread history_base names)."""
        if not own or own[0].item.type != LineType.SESSION_META:
            raise LineageError(thread_id, "rollout does not start with session_meta")
        meta = own[0].item.payload
        if str(meta.get("id")) != thread_id:
            raise LineageError(thread_id, "session_meta id does not match the rollout")
        base = (
            HistoryPosition.from_json(meta["history_base"], thread_id)
            if meta.get("history_base") is not None
            else None
        )
        if base is not None and (base.thread_id == thread_id or base.thread_id in visiting):
            raise LineageError(base.thread_id, "lineage cycle")
        first = base.end_ordinal_exclusive if base is not None else 0
        if own[0].ordinal != first:
            raise LineageError(thread_id, "first ordinal does not match history_base")
        if list(map(_ORDINAL, own)) != list(range(first, first + len(own))):
            # Contiguous from `first` or not, compared in C; the loop only names the gap.
            for expected, line in enumerate(own, start=first):
                if line.ordinal != expected:
                    raise LineageError(thread_id, f"ordinal gap at {expected}")
        segment = Segment(
            thread_id=thread_id,
            path=path,
            first_ordinal=first,
            length=len(own),
            content_start=first + _header_length(own),
            base=base,
        )
        if base is None:
            return ThreadHistory(thread_id, path, meta, tuple(own), (segment,))
        if parent is not None and parent.thread_id != base.thread_id:
            parent = None  # the boundary lies in an ancestor of the given thread: load it
        if parent is None:
            parent_path = self._find(base.thread_id)
            if parent_path is None:
                raise LineageError(base.thread_id, "missing source rollout")
            parent = self._load(base.thread_id, parent_path, visiting | {thread_id})
        seg = parent.own_segment
        end = base.end_ordinal_exclusive
        if not (seg.first_ordinal < end <= seg.end_ordinal):
            # Past the source's durable end, or into an ancestor's range: the reference
            # would cover the wrong physical lines.
            raise LineageError(base.thread_id, "history_base outside the source segment")
        if parent.lines[end - 1].end_byte_offset != base.end_byte_offset:
            raise LineageError(base.thread_id, "history_base byte offset does not match")
        return ThreadHistory(
            thread_id,
            path,
            meta,
            parent.lines[:end] + tuple(own),
            (*parent.segments, segment),
        )

    # -- reservations and deletion ----------------------------------------------------
    def reserve(self, thread_id: str) -> Reservation:
        with self._cond:
            self._reservations[thread_id] = self._reservations.get(thread_id, 0) + 1
        return Reservation(self, thread_id)

    def _release(self, thread_id: str) -> None:
        with self._cond:
            left = self._reservations.get(thread_id, 0) - 1
            if left <= 0:
                self._reservations.pop(thread_id, None)
            else:
                self._reservations[thread_id] = left
            self._cond.notify_all()

    def is_reserved(self, thread_id: str) -> bool:
        with self._cond:
            return self._reservations.get(thread_id, 0) > 0

    def referencing_children(self, thread_id: str) -> list[str]:
        """Rollouts whose durable `history_base` points into this thread's file."""
        children = []
        for path in iter_rollout_paths(self.home):
            meta = _first_meta(path)
            base = meta.get("history_base") if meta else None
            if isinstance(base, Mapping) and base.get("thread_id") == thread_id:
                children.append(thread_id_of_path(path))
        return children

    def delete(self, thread_id: str, *, wait_s: float = 0.0) -> None:
        """Delete a rollout; waits up to `wait_s` for reservations, then refuses.

        A reservation or a durable Referenced child both protect the source: deleting it
        would cut the child's logical history."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._reservations.get(thread_id, 0) > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ThreadReserved(thread_id)
                self._cond.wait(remaining)
            path = self.path_of(thread_id)
            if self.referencing_children(thread_id):
                raise ThreadReferenced(thread_id)
            path.unlink()
            self._forget(thread_id, path)
            fsync_dir(path.parent)


SPAN_COPY_MIN_BYTES = 1 << 20
"""A copied span this long or longer goes to the child by `copy_file_range` (`SpanSource`);
a shorter one is read (`copied_span`)."""
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
"""`open(path, "xb")`'s flags."""


def _write_new_file(path: Path, chunks: Sequence[bytes | SpanSource]) -> None:
    """Create `path` (it must not exist) holding `chunks`, durable on return: the file
    fsynced, then its directory and each parent created for it. A failure removes the file
    (its removal made durable) before it raises."""
    changed: list[Path] = []
    try:
        fd = os.open(path, _NEW_FILE, 0o666)
    except FileNotFoundError:
        changed = make_dirs(path.parent)
        fd = os.open(path, _NEW_FILE, 0o666)
    try:
        try:
            write_chunks(fd, chunks)
            os.fsync(fd)
        finally:
            os.close(fd)
        for directory in [path.parent, *changed]:
            fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            fsync_dir(path.parent)
        raise


def _first_user(history: ThreadHistory) -> tuple[int, str]:
    """(index, text cut at 200 characters) of `history`'s first real user message after its
    first line; (its length, "") when there is none."""
    lines = history.lines
    for index in range(1, len(lines)):
        item = lines[index].item
        if is_real_user_message(item):
            return index, message_text(item.payload)[:200]
    return len(lines), ""


def _file_key(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})
"""The errors `Path.is_file` answers False for."""


def _regular_file_key(path: Path) -> tuple[int, int, int, int] | None:
    """`_file_key` of `path` if it is a regular file (`Path.is_file`, links followed), else
    None: one `stat` for both."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno in _NOT_THERE:
            return None
        raise
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _header_length(lines: Sequence[RolloutLine]) -> int:
    n = 1  # session_meta
    while n < len(lines) and lines[n].item.event_type in _HEADER_EVENTS:
        n += 1
    return n


def _line_at(data: bytes, start: int, stop: int) -> tuple[str, Mapping[str, Any]] | None:
    """(type, payload) of the rollout line `data[start:stop]`; None if it is not a line with an
    object payload; ValueError if it does not decode."""
    obj = json.loads(data[start:stop])
    if not isinstance(obj, dict) or "ordinal" not in obj or "timestamp" not in obj:
        return None
    payload = obj.get("payload")
    if not isinstance(payload, dict):
        return None
    return str(obj.get("type")), payload


def _head_preview(data: bytes, start: int, end: int) -> str | None:
    """`wire.preview` of the rollout lines in `data[start:end]` from their head: "" when none
    is a real user message, None when none of the first `HEAD_PREVIEW_LINES` is and more
    follow."""
    at = start
    for _ in range(HEAD_PREVIEW_LINES):
        if at >= end:
            return ""
        stop = data.find(b"\n", at, end)
        line = _line_at(data, at, stop)
        if line is None:
            return None
        item = RolloutItem(*line)
        if is_real_user_message(item):
            return message_text(item.payload)[:200]
        at = stop + 1
    return "" if at >= end else None


def _last_settings(
    data: bytes, meta: Mapping[str, Any], start: int, end: int
) -> dict[str, Any] | None:
    """`ThreadHistory.effective_settings()` of a single-file rollout from its settings lines
    alone, found by their bytes from the end backwards; None when one of them is malformed
    (the whole history's pass raises for it)."""
    found: dict[str, Any] = {}
    at = end
    while len(found) < 2:
        hit = data.rfind(b"thread_settings_applied", start, at)
        if hit < 0:
            break
        line_start = data.rfind(b"\n", 0, hit) + 1
        line = _line_at(data, line_start, data.find(b"\n", hit, end))
        at = line_start
        if line is None:
            return None  # not a rollout line with an object payload: the whole read judges it
        kind, payload = line
        if kind != LineType.EVENT_MSG.value or payload.get("type") != "thread_settings_applied":
            continue
        ts = payload.get("thread_settings") or {}
        if not isinstance(ts, Mapping):
            return None
        for key in ("cwd", "model"):
            if key in ts and key not in found:
                found[key] = ts[key]
    return {
        "cwd": found.get("cwd", meta.get("cwd")),
        "model": found.get("model", meta.get("model")),
        "model_provider": meta.get("model_provider"),
    }


def _first_meta(path: Path) -> Mapping[str, Any] | None:
    try:
        with open(path, "rb") as f:
            first = f.readline()
        obj = json.loads(first)
    except (OSError, ValueError):
        return None
    payload = obj.get("payload") if isinstance(obj, dict) else None
    return payload if isinstance(payload, Mapping) else None


def iter_thread_ids(home: Path) -> Iterator[str]:
    for path in iter_rollout_paths(home):
        yield thread_id_of_path(path)


def remove_file_durably(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
