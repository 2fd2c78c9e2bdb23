"""The `host_copy` provider-state binder for rollout homes (`tutti-agent-home`, `codex-home`): it
copies a fork child's rollout — and, for a Referenced child, the ancestor rollouts it reads
through — from the source home into the child's own home, crash-durably, and returns a receipt;
with the rollout files on disk as it (and the readability proof) read and write them.

Rules (seed 000 §7, §10): exact lookup, every JSONL line validated, `session_meta.id` = thread,
size + SHA-256, atomic copy (temp, fsync, rename, fsync dir), no symlinked path anywhere,
idempotent; an existing target is kept (identical, or source bytes + post-fork appends),
repaired (a strict prefix of the source whose first line proves the identity), or — anything
else — refused with nothing written.

The rollout files: every JSONL line validated, `session_meta` identity and lineage read, exact
lookup by thread id, symlink-free regular reads, and crash-durable writes (temp, fsync, rename,
fsync dir). A refusal is a `BinderError` naming its `BindFailure`; nothing here writes on a
refusal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import stat
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any

from domain.errors import ProviderError
from domain.wake_one import WakeOneQueue, WakeOneThreads
from drivers.failpoints import Failpoints
from tutti_agent.rollout import REFUSED, fast_loads, lines_of

ROLLOUT_DIRS = ("sessions", "archived_sessions")
_THREAD_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_-]{0,127}$")
_MAX_LINEAGE_DEPTH = 64


class BindFailure(StrEnum):
    """Why the binder refused; every refusal writes nothing."""

    SYMLINKED_PATH = "symlinked_path"
    BAD_THREAD_ID = "bad_thread_id"
    SOURCE_ROLLOUT_MISSING = "source_rollout_missing"
    SOURCE_ROLLOUT_AMBIGUOUS = "source_rollout_ambiguous"
    SOURCE_ROLLOUT_CORRUPT = "source_rollout_corrupt"
    SOURCE_IDENTITY_MISMATCH = "source_identity_mismatch"
    TARGET_ROLLOUT_AMBIGUOUS = "target_rollout_ambiguous"
    TARGET_NOT_REGULAR = "target_not_regular"
    TARGET_IDENTITY_UNDETECTABLE = "target_identity_undetectable"
    TARGET_POST_FORK_CORRUPT = "target_post_fork_corrupt"
    TARGET_DIVERGED = "target_diverged"
    LINEAGE_INCOMPLETE = "lineage_incomplete"
    IO_ERROR = "io_error"


class BinderError(ProviderError):
    """The binder refused or failed; after a provider fork this makes the operation unknown."""

    default_reason = "provider_state_binding_failed"

    def __init__(self, failure: BindFailure, message: str) -> None:
        super().__init__(f"{failure.value}: {message}", params={"bindFailure": failure.value})
        self.failure = failure


@dataclass(frozen=True, slots=True)
class RolloutMeta:
    """What the first line says about a thread's identity and lineage."""

    thread_id: str
    first_ordinal: int
    last_ordinal: int
    forked_from_id: str | None
    referenced: bool


# --------------------------------------------------------------------------- validation


def parse_line(raw: bytes) -> dict[str, Any]:
    return _checked_line(json.loads(raw))


def _checked_line(obj: Any) -> dict[str, Any]:
    """`obj` if it is a rollout record `{timestamp, ordinal, type, payload}`, else ValueError."""
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    for key in ("timestamp", "ordinal", "type", "payload"):
        if key not in obj:
            raise ValueError(f"line lacks {key!r}")
    if not isinstance(obj["ordinal"], int) or isinstance(obj["ordinal"], bool):
        raise ValueError("ordinal is not an integer")
    if not isinstance(obj["type"], str) or not isinstance(obj["payload"], dict):
        raise ValueError("bad type or payload")
    return obj


_DECODE = json.JSONDecoder().decode


def _standard_line(raw: bytes) -> Any:
    """One line of a UTF-8 rollout through the standard library's decoder (whitespace around
    the value allowed; anything else raises its usual error)."""
    return _DECODE(raw.decode("utf-8"))


def validate_rollout(data: bytes, thread_id: str) -> RolloutMeta:
    """Validate a complete rollout: every line a JSON object `{timestamp, ordinal, type,
    payload}` ending in a newline, ordinals strictly increasing, first line `session_meta` with
    `payload.id == thread_id`. Raises ValueError describing the first defect."""
    return parse_rollout(data, thread_id).meta


@dataclass(frozen=True, slots=True)
class SpanUse:
    """Where a validated `Span` lies in a rollout's bytes: from byte `start` (right after its
    first line) and record index `index` (1), `len(span.records)` lines."""

    span: Span
    start: int
    index: int


@dataclass(frozen=True, slots=True)
class ParsedRollout:
    """A validated rollout's bytes and each line's decoded JSON object, in order: what a
    reader of the same bytes would decode, so a later reader (the readability proof) that
    finds exactly these bytes in the file may take the objects instead of decoding again."""

    meta: RolloutMeta
    data: bytes
    records: Sequence[dict[str, Any]]
    span: SpanUse | None = None
    """The run of lines whose decoding came from `ParsedSpans` (its bytes compared equal), if
    any: a reader may reuse what it derived from that span's records before (`Span.derived`)."""


# --------------------------------------------------------------------------- validated spans
# A fork child of tutti-agent is its own `session_meta` line, the source's lines up to the
# boundary as the source's file holds them (their bytes, not re-encoded), and its own settings
# line; the next fork of the same source through the same (or a later) Turn copies the same
# bytes again. `ParsedSpans` keeps, per worker (one per binder), the body of each rollout the
# binder validated — its lines after the first and before the last, their bytes and decoded
# records — and a later rollout whose bytes after its own first line *begin with exactly those
# bytes* (compared in full, `bytes.startswith`) takes those lines' records instead of decoding
# them again. Sound because a line's decoding and its checks are a function of its bytes alone
# (and of nothing else of the file: `fast_loads` only picks the decoder that returns the
# standard library's value), and the span starts and ends at line boundaries of both files; the
# checks that span lines of the new file — the ordinal order across the span's two ends, the
# first line's identity, every line outside the span — run as for any file. Nothing is keyed by
# a name, a path, a size or a time: a changed byte anywhere in the span is a miss. The records
# are shared, read-only, by every parse that took them (nobody mutates a decoded line).

SPANS_MAX_BYTES = 16 << 20
"""The rollout bytes the spans of one binder keep at most, the least recently used going first:
room for a 10,000-Turn source's body (14.7 MB). A span keeps ~4.6 times its bytes resident
(the 10,000-Turn one ~67 MB: the bytes, the decoded records, the proof's lines and reduction)."""
SPANS_MAX = 64
"""Spans kept at most (each forking source keeps one: its latest child's body)."""
SPANS_IDLE_S = 120.0
"""A span not used for this long is dropped (a worker that stopped forking frees its memory)."""
AHEAD_MIN_BYTES = 1 << 20
"""`RolloutBinder.validate_ahead` leaves a smaller rollout to the bind (a 1 MiB one parses in
~15 ms; a fork of a small source is paced by its syncs, not its parse)."""
_COMPARE_BLOCK = 256 << 10
"""`Span.lines_held` compares this many bytes at a time before it looks for the first that
differs."""


@dataclass(slots=True, eq=False, weakref_slot=True)
class Span:
    """A run of complete lines (each ending in a newline) this process validated —
    `source[start:stop]`, kept inside the rollout it was validated in rather than copied out
    (a 14.7 MB copy is 3,600 pages touched afresh) —, their decoded records, and what readers
    derived from those records (`derived`, by the reader's key: a function of the records
    alone, e.g. tutti_agent's lines at a base offset)."""

    source: bytes
    start: int
    stop: int
    records: tuple[dict[str, Any], ...]
    first_ordinal: int
    last_ordinal: int
    used: float = 0.0
    derived: dict[str, Any] = field(default_factory=dict)
    first: bytes = field(init=False, repr=False)
    """The span's first line (a copy of it: a few hundred bytes): a rollout that does not hold
    it where the span would start holds none of the span's lines."""

    def __post_init__(self) -> None:
        end = self.source.find(b"\n", self.start, self.stop)
        self.first = self.source[self.start : self.stop if end < 0 else end + 1]

    @property
    def size(self) -> int:
        return self.stop - self.start

    def view(self) -> memoryview:
        """The span's bytes without a copy (`bytes.startswith` compares a view with memcmp)."""
        return memoryview(self.source)[self.start : self.stop]

    def lines_held(self, data: bytes, at: int) -> tuple[int, int]:
        """(n, size): `data` holds, from byte `at`, exactly the span's first `n` lines, `size`
        bytes, and not its line `n + 1` (n is 0 when it holds not even the first line whole).
        Compared in full, by memcmp: the common bytes found block by block, then cut back to
        the last newline inside them (the end of a whole line of both)."""
        view = self.view()
        size = min(self.size, len(data) - at)
        common = 0
        while common < size:  # whole blocks first
            step = min(_COMPARE_BLOCK, size - common)
            if not data.startswith(view[common : common + step], at + common):
                break
            common += step
        else:
            return (len(self.records), self.size) if common == self.size else self._cut(common)
        low, high = common, min(common + _COMPARE_BLOCK, size)  # the first byte that differs
        while low < high:  # is in (low, high]: common bytes = low at the end
            mid = (low + high + 1) // 2
            if data.startswith(view[low:mid], at + low):
                low = mid
            else:
                high = mid - 1
        return self._cut(low)

    def _cut(self, common: int) -> tuple[int, int]:
        """(n, size) of the span's whole lines inside its first `common` bytes."""
        end = self.source.rfind(b"\n", self.start, self.start + common) + 1
        if end <= self.start:
            return 0, 0
        return self.source.count(b"\n", self.start, end), end - self.start


class ParsedSpans:
    """The validated spans of one binder (see the comment above); thread-safe."""

    def __init__(
        self,
        max_bytes: int = SPANS_MAX_BYTES,
        max_spans: int = SPANS_MAX,
        idle_s: float = SPANS_IDLE_S,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_spans = max_spans
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._spans: list[Span] = []  # least recently used first
        self._sweeper = False
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._spans)

    def match(self, data: bytes, start: int) -> Span | None:
        """The longest kept span that `data` holds exactly from byte `start` on."""
        got = self.match_lines(data, start, whole=True)
        return None if got is None else got[0]

    def match_lines(
        self, data: bytes, start: int, *, whole: bool = False
    ) -> tuple[Span, int, int] | None:
        """(span, n, size): the kept span of which `data` holds, from byte `start` on, the most
        whole lines from its start — its first `n` lines, `size` bytes (`Span.lines_held`;
        all of them: `n == len(span.records)`) —, or None when it holds no span's first line
        (`whole`: only a span it holds entirely)."""
        best: tuple[Span, int, int] | None = None
        with self._lock:
            for span in self._spans:
                if best is not None and span.size <= best[2]:
                    continue
                # Not even its first line: none of its lines (one short compare, where
                # `lines_held` would search the whole span for the first byte that differs —
                # a worker forking 16 sources holds 16 spans, 15 of them misses every fork).
                if not data.startswith(span.first, start):
                    continue
                if data.startswith(span.view(), start):
                    best = (span, len(span.records), span.size)
                elif not whole:
                    n, size = span.lines_held(data, start)
                    if n and (best is None or size > best[2]):
                        best = (span, n, size)
            if best is not None:
                self._spans.remove(best[0])
                self._spans.append(best[0])
                best[0].used = time.monotonic()
                self.hits += 1
            else:
                self.misses += 1
        return best

    def covers(self, data: bytes, start: int, stop: int) -> Span | None:
        """A kept span that begins with exactly `data[start:stop]` (whole lines of `data`): a
        parse of those lines would take them all from it; None if none does. Not counted as
        a hit or a miss."""
        want = memoryview(data)[start:stop]
        with self._lock:
            for s in self._spans:
                if s.size >= stop - start and s.source.startswith(want, s.start):
                    return s
        return None

    def holds(self, span: Span) -> bool:
        """Whether `span` is still kept."""
        with self._lock:
            return any(s is span for s in self._spans)

    def remember(
        self, data: bytes, records: Sequence[dict[str, Any]], used: Span | None
    ) -> Span | None:
        """Keep the body of a rollout just validated (`records` its decoded lines): its lines
        after the first and before the last, unless `used` (the span its parse took) is that
        very body already. Returns the span that now holds the body (else `used`)."""
        if len(records) < 3:
            return used
        start = data.index(b"\n") + 1
        stop = data.rindex(b"\n", 0, len(data) - 1) + 1
        if stop - start > self.max_bytes:
            return used
        if used is not None and used.size == stop - start:
            return used  # the same body (it matched from `start`, and has this length)
        body = records[1:-1]
        span = Span(
            data,
            start,
            stop,
            tuple(body),
            body[0]["ordinal"],
            body[-1]["ordinal"],
            time.monotonic(),
        )
        dropped: list[Span] = []
        with self._lock:
            # A span this one extends (the same source forked through a later Turn) or equals
            # is of no more use.
            keep = [
                s
                for s in self._spans
                if not (s.size <= span.size and data.startswith(s.view(), start))
            ]
            dropped = [s for s in self._spans if s not in keep]
            keep.append(span)
            total = sum(s.size for s in keep)
            while len(keep) > self.max_spans or total > self.max_bytes:
                dropped.append(keep.pop(0))
                total -= dropped[-1].size
            self._spans = keep
            start_sweeper = not self._sweeper
            self._sweeper = True
        if start_sweeper:
            threading.Thread(target=self._sweep, name="span-sweep", daemon=True).start()
        if dropped:
            # A big span is about a million objects: freed off the fork's path (never
            # emptied in place: a parse that took it a moment ago may still read it).
            threading.Thread(target=_free_later, args=(dropped,), daemon=True).start()
        return span

    def clear(self) -> None:
        with self._lock:
            self._spans = []

    def sweep(self, now: float | None = None) -> int:
        """Drop the spans not used for `idle_s` before `now` (freed here, by reference
        counting, once no parse holds them any more); how many were dropped."""
        at = time.monotonic() if now is None else now
        with self._lock:
            old = [s for s in self._spans if at - s.used > self.idle_s]
            self._spans = [s for s in self._spans if s not in old]
        return len(old)

    def _sweep(self) -> None:
        """`sweep` every half idle period, for ever (a daemon thread)."""
        while True:
            time.sleep(max(0.05, self.idle_s / 2))
            self.sweep()


def _free_later(spans: list[Span]) -> None:
    """Drop `spans` once the parse that replaced them has returned (its own references gone)."""
    time.sleep(0.05)
    spans.clear()


def parse_rollout(data: bytes, thread_id: str, spans: ParsedSpans | None = None) -> ParsedRollout:
    """`validate_rollout`, keeping the decoded lines.

    Every line is still parsed on its own (a line holding two objects, or half of one, is a
    defect) and judged as the standard library's decoder judges it: by orjson where that
    returns the same (`tutti_agent.rollout.fast_loads`), else the line's text through the standard
    library's decoder (NaN, a lone surrogate, ... accepted or refused, and named, as before).
    The file must be UTF-8 as a whole.

    `spans`: the lines after the first that are byte for byte a span this binder validated
    before take that span's records (`ParsedSpans`); the rest is decoded and every ordinal
    checked across the span's ends; the body is then kept for the next parse."""
    if not data:
        raise ValueError("empty rollout")
    if not data.endswith(b"\n"):
        raise ValueError("torn last line")
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ValueError(f"line {line}: not UTF-8") from None
    got = None
    if spans is not None:
        first_end = data.index(b"\n") + 1
        got = spans.match_lines(data, first_end)
    use = None
    if got is None:
        records, previous = _parse_lines(data, 0, None)
    else:
        # The span's first `n` lines, byte for byte (all of them, or a run of its whole lines
        # from its start: a child forked through an earlier Turn than the span's rollout).
        span, n, size = got
        after = first_end + size
        records, previous = _parse_lines(data[:first_end], 0, None)
        if span.first_ordinal <= records[0]["ordinal"]:
            raise ValueError("line 2: ordinal not increasing")
        taken = span.records if n == len(span.records) else span.records[:n]
        tail, previous = _parse_lines(data[after:], 1 + n, taken[-1]["ordinal"])
        records = [*records, *taken, *tail]
        if n == len(span.records):
            use = SpanUse(span, first_end, 1)
    first = records[0]
    assert previous is not None
    if first["type"] != "session_meta":
        raise ValueError("first line is not session_meta")
    payload = first["payload"]
    if payload.get("id") != thread_id:
        raise ValueError(f"session_meta.id is {payload.get('id')!r}, expected {thread_id!r}")
    forked_from = payload.get("forked_from_id")
    # Referenced children start past ordinal 0 and name the ordinal they read through.
    referenced = bool(forked_from) and (
        payload.get("forked_from_ordinal_exclusive") is not None
        or payload.get("history_base") is not None
        or first["ordinal"] > 0
    )
    meta = RolloutMeta(
        thread_id=thread_id,
        first_ordinal=first["ordinal"],
        last_ordinal=previous,
        forked_from_id=str(forked_from) if forked_from else None,
        referenced=referenced,
    )
    if spans is not None:
        used = None if use is None else use.span
        kept = spans.remember(data, records, used)
        if kept is not None and kept is not used:
            # This parse's own body, kept: a reader derives from it once, for the next fork.
            use = SpanUse(kept, data.index(b"\n") + 1, 1)
    return ParsedRollout(meta, data, records, use)


def _parse_lines(
    data: bytes, first: int, previous: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    """The records of `data`'s lines (complete, UTF-8; the first is line `first + 1` of its
    file), each checked, their ordinals increasing from after `previous`; and the last
    ordinal."""
    loads = fast_loads(data, _standard_line)
    records: list[dict[str, Any]] = []
    append = records.append
    # A block of lines at a time (`lines_of`): 60,000 line objects alive at once would be
    # ~15 MB touched afresh; the records are what the parse keeps.
    for index, raw in enumerate(lines_of(data), start=first):
        try:
            try:
                obj = loads(raw)
            except REFUSED:
                obj = _standard_line(raw)
            # The shape every writer produces passes these exact-type checks (a decoder makes
            # only these types; subscripts, not `get` calls: three calls per line fewer); a
            # value that is no dict, or lacks a key, raises here and, like any other shape,
            # is judged and its defect named by the full check.
            try:
                ordinal = obj["ordinal"]
                shaped = (
                    type(obj) is dict
                    and type(ordinal) is int
                    and type(obj["type"]) is str
                    and type(obj["payload"]) is dict
                    and "timestamp" in obj
                )
            except (KeyError, TypeError):
                shaped = False
            if not shaped:
                obj = _checked_line(obj)
                ordinal = obj["ordinal"]
        except ValueError as exc:
            raise ValueError(f"line {index + 1}: {exc}") from None
        if previous is not None and ordinal <= previous:
            raise ValueError(f"line {index + 1}: ordinal not increasing")
        previous = ordinal
        append(obj)
    return records, previous


def first_line_identity(data: bytes) -> str | None:
    """The `session_meta.id` of a complete first line, or None when it cannot be proven."""
    newline = data.find(b"\n")
    if newline < 0:
        return None
    try:
        obj = parse_line(data[:newline])
    except ValueError:
        return None
    if obj["type"] != "session_meta":
        return None
    ident = obj["payload"].get("id")
    return ident if isinstance(ident, str) else None


def referenced_ordinal(data: bytes) -> int | None:
    newline = data.find(b"\n")
    obj = parse_line(data[:newline])
    payload = obj["payload"]
    value = payload.get("forked_from_ordinal_exclusive")
    if isinstance(value, int):
        return value
    base = payload.get("history_base")
    if isinstance(base, dict) and isinstance(base.get("ordinal_exclusive"), int):
        return int(base["ordinal_exclusive"])
    return int(obj["ordinal"])


# --------------------------------------------------------------------------- paths


def _components(path: str, start: int) -> list[str]:
    """Each component's own path of the absolute `path` from index `start` on, shallowest
    first: "/a", "/a/b", ..., path (the slashes found by `str.find`, not by a test of every
    character in Python)."""
    parts = []
    end = path.find("/", start)
    while end != -1:
        parts.append(path[:end])
        end = path.find("/", end + 1)
    parts.append(path)
    return parts


def assert_no_symlink(
    path: Path | str,
    *,
    must_exist: bool,
    below: Path | str | None = None,
    seen: dict[str, bool] | None = None,
) -> str | None:
    """Refuse if `path` or any ancestor is a symlink (a copy through a link could land in, or
    read from, another session's home). `below`: an ancestor of `path` this bind already
    checked (its home): only the components under it are looked at again (otherwise a
    bind would lstat every component of every path, home included, five times over).
    `seen`: components already looked at by this caller (path → exists), filled as they are
    (`assert_homes_no_symlink`). Returns the first component that does not exist (nothing
    below it can be a link yet), None when every one does: what `DirsAhead` creates from,
    without probing the chain again."""
    path = os.path.abspath(path)
    start = 1
    if below is not None:
        base = os.path.abspath(below).rstrip("/")
        if path.startswith(base + "/"):
            start = len(base) + 1
    for part in _components(path, start):
        exists = seen.get(part) if seen is not None else None
        if exists is None:
            try:
                st = os.lstat(part)
            except FileNotFoundError:
                exists = False
            else:
                if stat.S_ISLNK(st.st_mode):
                    raise BinderError(BindFailure.SYMLINKED_PATH, f"{part} is a symlink")
                exists = True
            if seen is not None:
                seen[part] = exists
        if not exists:
            if must_exist and part == path:
                raise BinderError(
                    BindFailure.SOURCE_ROLLOUT_MISSING, f"{part} does not exist"
                ) from None
            return part  # nothing below a missing component can be a link yet
    return None


def assert_homes_no_symlink(*homes: Path | str, checked: Mapping[str, bool] | None = None) -> None:
    """`assert_no_symlink(home, must_exist=False)` of each home, a component the homes share
    (their common ancestors: a source and a target home are siblings under the daemon's
    runtimes) `lstat`ed once, not once per home. `checked`: components this fork already
    found to be no link (`DirsAhead.checked`: its walk, and what it created), not `lstat`ed
    again."""
    seen: dict[str, bool] = dict(checked) if checked else {}
    for home in homes:
        assert_no_symlink(home, must_exist=False, seen=seen)


def rollout_matches(home: Path | str, thread_id: str) -> list[Path]:
    """`rollout_paths` as `Path`s (for callers off the fork's path)."""
    return [Path(p) for p in rollout_paths(home, thread_id)]


def rollout_paths(home: Path | str, thread_id: str) -> list[str]:
    """Exact lookup: every `rollout-<ts>-<thread_id>.jsonl` anywhere under sessions/ and
    archived_sessions/, sorted (the caller refuses more than one).

    Every directory under them is listed, every time: a source home holds every child the
    provider ever forked from it, in one directory per day, and no cache of a listing can
    prove that directory unchanged (it changes at every fork, and a directory's timestamps
    are as coarse as the kernel's tick). What is cut is the per-entry work: one `scandir`
    per directory, the name's suffix tested before its type, no list of names built per
    directory (as `os.walk` did) — the listing itself (the kernel's readdir) is what grows.
    Classified as `os.walk` does: a link to a directory is not descended (and never a
    match); a link named as a rollout is a match, refused by the read (`O_NOFOLLOW`). A
    directory that cannot be listed fails the lookup (`os.walk` skipped it, so a stray
    below it went unseen); one removed meanwhile holds nothing."""
    suffix = f"-{thread_id}.jsonl"
    found: list[str] = []
    for dirname in ROLLOUT_DIRS:
        root = os.path.join(home, dirname)
        try:
            # One `lstat`, not `isdir` + `islink`: a link (to a directory or not) is skipped.
            if not stat.S_ISDIR(os.lstat(root).st_mode):
                continue
        except (FileNotFoundError, NotADirectoryError):
            continue
        pending = [root]
        while pending:
            try:
                listing = os.scandir(pending.pop())
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed (or replaced) since its parent was listed
            with listing:
                for entry in listing:
                    if entry.is_dir():  # follows a link, as os.walk classifies
                        if not entry.is_symlink():
                            pending.append(entry.path)
                    elif entry.name.endswith(suffix) and entry.name.startswith("rollout-"):
                        found.append(entry.path)
    found.sort()
    return found  # strings: the bind works on them as they are (no `Path` per match)


def _below(path: str, home: str) -> str:
    """`path` relative to `home`, an ancestor of it: both absolute and normalized, `path`
    joined onto `home` (`os.path.join`, the lookup's walk), so a slice (what
    `Path.relative_to` answered, without parsing both paths)."""
    return path[len(home.rstrip("/")) + 1 :]


def read_regular(path: Path | str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BinderError(BindFailure.TARGET_NOT_REGULAR, f"{path} is not a regular file")
        # The size it has now in one read (no chunks joined: a 14.7 MB rollout was copied once
        # more by the join), then on to the end, should it have grown meanwhile.
        chunks = [os.read(fd, max(st.st_size, 1 << 16))]
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 20))
        return chunks[0] if len(chunks) == 2 else b"".join(chunks)
    finally:
        os.close(fd)


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SYNC_THREADS = 8
# Each sync handed to ONE idle sync thread, the one idle last (`domain.wake_one`): on a
# `SimpleQueue` the eight idle threads waited on one lock that a `get` hands on as it returns,
# so each sync of a round woke a second thread for nothing.
_sync_queue: WakeOneQueue[tuple[_Round, Callable[[], None]]] = WakeOneQueue()
_sync_threads = 0
_sync_pool_lock = threading.Lock()


class _Round:
    """The syncs of one `sync_together` call handed to the sync threads: `wait()` returns once
    each has ended. A counter and a lock as the latch, not a `Future` per sync: the
    executor's submit, its futures' conditions and their wake-ups were a quarter of the
    worker's own CPU per small fork at 16 clients (py-spy, GIL held)."""

    __slots__ = ("_done", "_error", "_left", "_lock")

    def __init__(self, count: int) -> None:
        self._left = count
        self._lock = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()
        self._error: BaseException | None = None

    def run(self, call: Callable[[], None]) -> None:
        error: BaseException | None = None
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the round's waiter
            error = exc
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self._done.release()

    def wait(self) -> BaseException | None:
        """Once every sync has ended: the first error, if any."""
        self._done.acquire()
        self._done.release()
        return self._error


def _sync_thread() -> None:
    while True:
        sync_round, call = _sync_queue.get()
        sync_round.run(call)
        del sync_round, call


def _start_sync_threads() -> None:
    global _sync_threads
    with _sync_pool_lock:
        while _sync_threads < _SYNC_THREADS:
            _sync_threads += 1
            threading.Thread(
                target=_sync_thread, name=f"fsync-{_sync_threads}", daemon=True
            ).start()


def sync_together(calls: Sequence[Callable[[], None]]) -> None:
    """Run independent syncs at the same time and return when every one has ended (the first
    error, if any, is raised then). Why: each `fsync` in a row waited for a journal
    commit of its own (~1 ms on this disk, most of a fork's binder time); fsyncs issued
    together join the same ext4/jbd2 commit. Only syncs with no order between them may be
    passed: a caller that needs "A durable before B exists" runs two rounds. The first runs
    on the caller's thread, the others on the sync threads (`_Round`)."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    if _sync_threads < _SYNC_THREADS:
        _start_sync_threads()
    sync_round = _Round(len(calls) - 1)
    for call in calls[1:]:
        _sync_queue.put((sync_round, call))
    error: BaseException | None = None
    try:
        calls[0]()
    except BaseException as exc:  # noqa: BLE001 - raised once every sync has ended
        error = exc
    waited = sync_round.wait()  # every sync ended, whatever the first one did
    error = error or waited
    if error is not None:
        raise error


def fsync_dirs(paths: Iterable[Path | str]) -> None:
    """fsync each distinct directory once, all at the same time (`sync_together`)."""
    unique = list(dict.fromkeys(os.fspath(p) for p in paths))
    sync_together([partial(fsync_dir, d) for d in unique])


def makedirs(path: Path | str) -> list[str]:
    """Create `path` and its missing ancestors; returns the directories whose entries
    changed (each created directory's parent), deepest first — the caller fsyncs each once."""
    missing: list[str] = []
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    changed: list[str] = []
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        changed.append(os.path.dirname(directory))
    changed.reverse()
    return changed


class DirsAhead:
    """A directory chain created and made durable ahead of the write that needs it (a fork
    child's target directories, made by the fork's own thread while the provider call it
    has just sent runs), so the `atomic_write_all` that follows finds them existing and
    durable and only fsyncs the file's own directory after its rename.

    `run()` does the work and never raises; `ready()` (which runs it first if nobody did)
    returns once every directory it created is durable: if the work failed part-way, it
    fsyncs the parent of every directory created (or found appearing) itself — raising if
    that fails, so the caller's write fails closed. A path with a symlinked component is left
    alone (the binder refuses it anyway). A wrong guess of the path costs only empty
    directories; a caller that never calls `ready()` leaves them, harmlessly.

    On the caller's thread, not a pool's, and so are its fsyncs: the caller only waits for the
    provider's answer meanwhile, so a background thread bought no wall time and cost a
    hand-off per fork, and so did a `sync_together` round's (docs/performance.md, forkw)."""

    def __init__(self, path: Path | str) -> None:
        self._path = os.path.abspath(path)
        self._parents: list[str] = []
        self._ran = False
        self._error: BaseException | None = None
        self._seen: dict[str, bool] = {}  # the symlink check's walk: component → exists

    def run(self) -> None:
        """Create the chain, then fsync every created directory's parent, one after another
        on this thread (no order between them is needed — nothing is named inside the chain
        before `ready()`; a `sync_together` round cost the worker ~40 `futex` calls a fork in
        hand-offs to the sync threads, and a tutti-agent child home's three fsyncs end within
        the provider's fork they hide behind); an error is kept for `ready()`."""
        if self._ran:
            return
        self._ran = True
        try:
            self._make()
        except Exception as exc:  # noqa: BLE001 - judged by ready(), never here
            self._error = exc

    def _make(self) -> None:
        # The symlink check's walk down the chain finds its first missing component: that one
        # and everything below it are what to create (no second walk of `stat`s up the chain).
        first_missing = assert_no_symlink(self._path, must_exist=False, seen=self._seen)
        missing: list[str] = []
        probe = self._path
        while first_missing is not None:
            missing.append(probe)
            if probe == first_missing or probe == os.path.dirname(probe):
                break
            probe = os.path.dirname(probe)
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                # Made concurrently by another: its entry is fsynced here all the same, and it
                # is no directory of ours to vouch for (`checked`): `lstat`ed again at the bind.
                self._seen.pop(directory, None)
            else:
                self._seen[directory] = True  # a directory this call made is no link
            self._parents.append(os.path.dirname(directory))
        # One after another on this thread (see `run`): each hand-off to a sync thread (its
        # queue, its wake-up, the latch and the interpreter lock handed back) cost the worker
        # more CPU than the overlap of three fsyncs saved.
        for parent in reversed(self._parents):
            fsync_dir(parent)

    def checked(self) -> dict[str, bool]:
        """The chain's components this run found to be no link (its symlink check's walk) or
        made itself, for the bind's check of the homes (`RolloutBinder.begin(checked=…)`): the
        same fork's check, not repeated a millisecond later. Empty unless the run ended
        without an error."""
        if not self._ran or self._error is not None:
            return {}
        return {path: True for path, exists in self._seen.items() if exists}

    def ready(self) -> None:
        """Wait until every directory this created is durable (see the class docstring)."""
        self.run()
        if self._error is None or isinstance(self._error, BinderError):
            return  # done, or a symlinked path: nothing was created; the binder refuses it
        # Failed part-way: made durable here, or the caller fails closed.
        fsync_dirs(reversed(self._parents))


def atomic_write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename over, fsync the directory: a crash leaves old or new bytes
    (`atomic_write_all` of one file)."""
    atomic_write_all([(path, data)])


def atomic_write_all(files: Sequence[tuple[Path | str, bytes]]) -> None:
    """`begin_atomic_write_all(files).wait()`: see there."""
    begin_atomic_write_all(files).wait()


class NamesSyncing:
    """The last round of `begin_atomic_write_all` — the renamed files' directories fsynced
    together: `wait()` returns once every name is durable, or raises the round's first error
    (the caller then fails closed).

    `background`: the round runs on the names' pool from now on, so what needs only the names
    (the readability proof of a large child) runs meanwhile. Otherwise it runs on the thread
    that calls `wait()`, when it does: a small bind's proof is over in well under an fsync, so
    the hand-off (a pool submit, its future, the pool thread's wake-ups and their GIL
    hand-backs: ~0.1 ms of the worker's CPU per warm fork at 16 clients, forkproc) bought no
    wall time. Either way nothing counts the names durable before `wait()` returned."""

    def __init__(self, directories: Iterable[str], *, background: bool = True) -> None:
        global _names_pool
        self._unique = list(dict.fromkeys(directories))
        self._round: _Round | None = None
        self._done = False
        if not background:
            return
        with _sync_pool_lock:
            if _names_pool is None:
                # Not the fsync pool: the round submits its syncs there.
                _names_pool = WakeOneThreads(4, "names-sync")
            pool = _names_pool
        # A `_Round` of one as the latch (no `Future`); the pool wakes ONE idle thread a job
        # (`domain.wake_one`): an executor's idle threads all waited on its one queue's lock.
        sync_round = self._round = _Round(1)
        unique = self._unique
        pool.submit(lambda: sync_round.run(partial(fsync_dirs, unique)))

    def wait(self) -> None:
        if self._round is not None:
            error = self._round.wait()
            if error is not None:
                raise error
        elif not self._done:
            fsync_dirs(self._unique)  # raises: not done, a later wait() tries again
            self._done = True


_names_pool: WakeOneThreads | None = None


# A temp name's pid and random tag without a system call each (`getpid`, `getrandom`: two of
# the worker's ~125 a warm fork): the pid kept, the tag from a generator of its own seeded
# from the system's randomness — both again in a forked child. Only the tag's uniqueness
# counts: `O_EXCL` refuses a clash, and the bind then fails closed.
_pid = os.getpid()
_temp_rng = random.Random()
_temp_tag = _temp_rng.getrandbits


def _repid() -> None:
    global _pid
    _pid = os.getpid()
    _temp_rng.seed()


os.register_at_fork(after_in_child=_repid)


def begin_atomic_write_all(
    files: Sequence[tuple[Path | str, bytes]],
    *,
    present: Collection[str] = (),
    before_names: Callable[[], None] | None = None,
) -> NamesSyncing:
    """Write each file crash-durably: when this returns every file and every directory whose
    entries changed (each file's, each created directory's parent) is durable, a crash leaves
    each target with its old or its new bytes, and no target's name ever appears before its
    bytes are durable.

    Two rounds (`sync_together`), the fewest that keep that law: (1) every directory
    created and every temp file written, then all temp files and every created directory's
    parent fsynced together — no temp name is a target yet, so nothing orders them; (2)
    every file renamed onto its target, in the given order, then every target's directory
    fsynced together. A name needs its bytes durable first (that costs round 1); nothing
    else is ordered across files. The renames are issued in the given order (the binder
    passes ancestors first), so a process that dies part-way leaves a prefix of them; only
    a power loss inside round 2 can make a later name durable without an earlier one (ext4
    and XFS journal the renames in order; POSIX does not promise it). That half state is a
    bind that never returned, so no fork accepted it: its child reads as lineage-incomplete
    to every reader (the readability proof, `fork.resolve`'s inspection) and a re-bind
    completes it (idempotent: the child identical, the ancestor copied).

    Returns with the names in place and round 2 running — for a write of
    `NAMES_BACKGROUND_MIN_BYTES` or more; a smaller one's round 2 runs in `wait()`, on the
    caller's thread (`NamesSyncing`): what needs only the names (the readability proof reads
    the files back) may run meanwhile; nothing may count the files durable before `wait()`
    returned.

    `present`: directories (absolute, normalized) the caller has just found existing — the
    bind's symlink check right before the write `lstat`ed each target's parent — whose
    existence is not probed again (`makedirs`' `stat`). One removed since makes the temp
    file's `O_CREAT` open fail, and the caller fails closed, as for any failed write.

    `before_names`: called once round 1 is over, before the first rename; if it raises, every
    temp file is removed and its error raised (no name was made)."""
    staged: list[tuple[str, str, int]] = []  # (target, temp, fd)
    changed: list[str] = []
    try:
        for path, data in files:
            target = os.path.abspath(path)
            parent, name = os.path.split(target)
            if parent not in present:
                changed.extend(makedirs(parent))
            tmp = os.path.join(parent, f".{name}.bind-{_pid}-{_temp_tag(32):08x}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            staged.append((target, tmp, fd))
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        created = list(dict.fromkeys(changed))
        sync_together(
            [partial(os.fsync, fd) for _, _, fd in staged]
            + [partial(fsync_dir, d) for d in created]
        )
    except BaseException:
        for _, tmp, fd in staged:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    for _, _, fd in staged:
        os.close(fd)
    if before_names is not None:
        try:
            before_names()
        except BaseException:
            for _, tmp, _ in staged:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
    for index, (target, tmp, _) in enumerate(staged):
        try:
            os.replace(tmp, target)
        except BaseException:
            for _, later, _ in staged[index:]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(later)
            raise
    return NamesSyncing(
        (os.path.dirname(target) for target, _, _ in staged),
        background=sum(len(data) for _, data in files) >= NAMES_BACKGROUND_MIN_BYTES,
    )


NAMES_BACKGROUND_MIN_BYTES = 1 << 20
"""A write of this many bytes or more has its names' round run in the background
(`NamesSyncing`): its child's readability proof is long enough to hide an fsync behind; a
smaller one's round runs on the thread that waits for it."""

SYNC_ROUNDS = 2
"""`atomic_write_all`'s rounds of syncs for any number of files, the second one overlappable
(`begin_atomic_write_all`) (bench.sync_floor's
`WORKER_ROUNDS`; tests/drivers/test_binder_fsyncs pins it)."""


def tamper_with(paths: Iterable[Path]) -> None:
    """The `tamper` failpoint's damage (tests only): cut each rollout just written to its
    session_meta line, as a lost or damaged copy would look. Identity stays provable; the
    history (a Copied child's turns, the prefix a Referenced child reads) is gone."""
    for path in paths:
        data = path.read_bytes()
        path.write_bytes(data[: data.index(b"\n") + 1])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def iter_rollouts(home: Path) -> Iterator[Path]:
    """Every rollout file in a home (tests count provider children with it)."""
    for dirname in ROLLOUT_DIRS:
        root = home / dirname
        if root.is_dir():
            yield from sorted(root.rglob("rollout-*.jsonl"))


# --------------------------------------------------------------------------- the binder


class BindAction(StrEnum):
    COPIED = "copied"
    """The target had no rollout: the source bytes were copied."""
    IDENTICAL = "identical"
    """The target already held exactly the source bytes."""
    KEPT = "kept"
    """The target holds the source bytes plus valid post-fork appends (or the source is gone
    and the target validates on its own): left as is."""
    REPAIRED = "repaired"
    """The target was a strict prefix of the source (truncated, maybe a torn tail) whose first
    line proves the identity: rebuilt from the source in place."""


@dataclass(frozen=True, slots=True)
class RolloutReceipt:
    thread_id: str
    role: str  # "child" or "ancestor"
    relative_path: str
    action: BindAction
    source_size: int | None
    source_sha256: str | None
    target_size: int
    target_sha256: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "threadId": self.thread_id,
            "role": self.role,
            "relativePath": self.relative_path,
            "action": self.action.value,
            "sourceSize": self.source_size,
            "sourceSha256": self.source_sha256,
            "targetSize": self.target_size,
            "targetSha256": self.target_sha256,
        }


@dataclass(frozen=True, slots=True)
class BindReceipt:
    child_id: str
    source_home: str
    target_home: str
    rollouts: tuple[RolloutReceipt, ...]
    parsed: Mapping[str, ParsedRollout] = field(default_factory=dict, compare=False, repr=False)
    """Each bound rollout's validated bytes and decoded lines, by its target path (never on
    the wire): the readability proof decodes a file holding exactly these bytes no more."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "childId": self.child_id,
            "sourceHome": self.source_home,
            "targetHome": self.target_home,
            "rollouts": [r.to_wire() for r in self.rollouts],
        }


class PendingNames:
    """The last round of a bind's syncs: `wait()` returns once every name it wrote is
    durable, or raises `BinderError` (`io_error`)."""

    def __init__(self, syncing: NamesSyncing | None) -> None:
        self._syncing = syncing

    def wait(self) -> None:
        if self._syncing is None:
            return
        try:
            self._syncing.wait()
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, f"the bound names' sync: {exc}") from exc


# --------------------------------------------------------------------------- the binder


@dataclass(frozen=True, slots=True)
class _Plan:
    """One rollout's decided action, computed for every rollout before anything is written."""

    thread_id: str
    role: str
    relative: str
    target: str
    """Both absolute-path strings, not `Path`s: the bind only joins, slices and opens them."""
    action: BindAction
    source_bytes: bytes | None
    target_bytes: bytes
    target_parse: ParsedRollout
    """The validation's parse of `target_bytes` (the same bytes, or equal ones)."""


def _receipt(plan: _Plan) -> RolloutReceipt:
    source, target = plan.source_bytes, plan.target_bytes
    target_sha = sha(target)
    # A copy writes the source's very bytes object: hash it once.
    source_sha = None if source is None else target_sha if source is target else sha(source)
    return RolloutReceipt(
        thread_id=plan.thread_id,
        role=plan.role,
        relative_path=plan.relative,
        action=plan.action,
        source_size=len(source) if source is not None else None,
        source_sha256=source_sha,
        target_size=len(target),
        target_sha256=target_sha,
    )


def _parse_source(data: bytes, thread_id: str, path: str, spans: ParsedSpans) -> ParsedRollout:
    """A source rollout's parse, or the `BinderError` that refuses it."""
    try:
        return parse_rollout(data, thread_id, spans)
    except ValueError as exc:
        failure = (
            BindFailure.SOURCE_IDENTITY_MISMATCH
            if "session_meta.id" in str(exc)
            else BindFailure.SOURCE_ROLLOUT_CORRUPT
        )
        raise BinderError(failure, f"{path}: {exc}") from None


class RolloutBinder:
    """Binds fork children between rollout homes; stateless, safe to call concurrently for
    different targets and idempotent for the same one."""

    def __init__(
        self, failpoints: Failpoints | None = None, spans: ParsedSpans | None = None
    ) -> None:
        self._failpoints = failpoints or Failpoints()
        self.spans = ParsedSpans() if spans is None else spans
        """The bodies of the rollouts this binder validated, for the next parse of the same
        bytes (`ParsedSpans`): a source forked again copies the same lines into its child."""
        # (home, thread) → (its rollout's path, (inode, size, mtime), the span that held its
        # body, weakly: a memo never keeps a dropped span's records alive) when last validated
        # ahead: what `wants_ahead` guesses from
        self._ahead: dict[
            tuple[str, str], tuple[str, tuple[int, int, int], weakref.ref[Span] | None]
        ] = {}
        self._ahead_lock = threading.Lock()
        self._running: dict[tuple[str, str], threading.Thread] = {}  # `start_ahead`'s threads
        # (home, thread) → (its rollout's path, (inode, size, mtime)) when `check_source` last
        # passed it
        self._checked: dict[tuple[str, str], tuple[str, tuple[int, int, int]]] = {}

    def start_ahead(self, home: Path | str, thread_id: str) -> threading.Thread | None:
        """`validate_ahead` on a thread of its own (named `validate-ahead`), or the one already
        running for the same rollout (home, thread); None when `wants_ahead` says there is
        nothing to do. The caller may `join()` it before a bind that should take its span."""
        key = (os.path.abspath(home), thread_id)
        with self._ahead_lock:
            running = self._running.get(key)
            if running is not None and running.is_alive():
                return running
        if not self.wants_ahead(home, thread_id):
            return None
        thread = threading.Thread(
            target=self._run_ahead, args=(home, thread_id), name="validate-ahead", daemon=True
        )
        with self._ahead_lock:
            running = self._running.get(key)
            if running is not None and running.is_alive():
                return running
            self._running[key] = thread
        thread.start()
        return thread

    def _run_ahead(self, home: Path | str, thread_id: str) -> None:
        try:
            with contextlib.suppress(Exception):  # a cache warmed: the bind judges everything
                self.validate_ahead(home, thread_id)
        finally:
            key = (os.path.abspath(home), thread_id)
            with self._ahead_lock:
                if self._running.get(key) is threading.current_thread():
                    del self._running[key]

    def wants_ahead(self, home: Path | str, thread_id: str) -> bool:
        """Whether `validate_ahead` may have work to do (cheap: one `lstat` at most): False
        when the rollout it found there last time is still that file and under
        `AHEAD_MIN_BYTES`, or unchanged (inode, size, modification time) while the span that
        held its body is still kept. A guess about the cache only: no bind trusts it."""
        with self._ahead_lock:
            last = self._ahead.get((os.path.abspath(home), thread_id))
        if last is None:
            return True
        path, seen, ref = last
        span = None if ref is None else ref()
        try:
            st = os.lstat(path)
        except OSError:
            return True
        if st.st_size < AHEAD_MIN_BYTES:
            return False
        return not (
            (st.st_ino, st.st_size, st.st_mtime_ns) == seen
            and span is not None
            and self.spans.holds(span)
        )

    def validate_ahead(self, home: Path | str, thread_id: str) -> bool:
        """Validate the rollout of `thread_id` in `home` into this binder's spans, ahead of a
        bind of a child that copies its lines (`parse_rollout` with `self.spans`: the body is
        kept, and the child's bind takes the lines it holds of it, compared byte for byte,
        decoding only its own). Only a cache warmed: nothing is judged or refused here, and
        whatever happens — no such rollout, two, a symlink, a torn or corrupt file — the bind
        reads and judges every rollout itself. Nothing is parsed for a rollout under
        `AHEAD_MIN_BYTES` or whose body a kept span already begins with. True when it
        parsed."""
        try:
            if not _THREAD_ID.match(thread_id):
                return False
            found = rollout_paths(os.path.abspath(home), thread_id)
            if len(found) != 1:
                return False
            st = os.lstat(found[0])
            if not stat.S_ISREG(st.st_mode):
                return False
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            span: Span | None = None
            parsed = False
            if st.st_size >= AHEAD_MIN_BYTES:
                data = read_regular(found[0])
                first_end = data.index(b"\n") + 1
                stop = data.rindex(b"\n", 0, len(data) - 1) + 1
                if stop > first_end:
                    span = self.spans.covers(data, first_end, stop)
                    if span is None:
                        use = parse_rollout(data, thread_id, self.spans).span
                        span, parsed = (None if use is None else use.span), True
            with self._ahead_lock:
                key = (os.path.abspath(home), thread_id)
                self._ahead.pop(key, None)
                self._ahead[key] = (
                    found[0],
                    seen,
                    None if span is None else weakref.ref(span),
                )
                while len(self._ahead) > SPANS_MAX:
                    del self._ahead[next(iter(self._ahead))]
            return parsed
        except (OSError, ValueError, BinderError):
            return False

    def check_source(self, home: Path | str, thread_id: str) -> None:
        """Raise the `BinderError` a bind would raise reading `thread_id`'s rollout in `home`
        as its source: none or two there, a link, a torn last line or a line that is no
        rollout record, another thread's `session_meta`. Read before a provider's fork of it,
        so a source the bind would refuse is refused before the provider makes a child. The
        parse is kept in `spans`: the bind of the same bytes takes it. A rollout that passed
        and is still that file, unchanged (inode, size, modification time), is not read again:
        only an early refusal, the bind judges every byte after the fork."""
        home = os.path.abspath(home)
        key = (home, thread_id)
        with self._ahead_lock:
            last = self._checked.get(key)
        if last is not None:
            with contextlib.suppress(OSError):
                st = os.lstat(last[0])
                if (st.st_ino, st.st_size, st.st_mtime_ns) == last[1]:
                    return
        if not _THREAD_ID.match(thread_id):
            raise BinderError(BindFailure.BAD_THREAD_ID, f"bad thread id {thread_id!r}")
        try:
            sources = rollout_paths(home, thread_id)
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, str(exc)) from exc
        if not sources:
            raise BinderError(BindFailure.SOURCE_ROLLOUT_MISSING, f"no rollout for {thread_id}")
        if len(sources) > 1:
            raise BinderError(
                BindFailure.SOURCE_ROLLOUT_AMBIGUOUS, f"{len(sources)} for {thread_id}"
            )
        try:
            st = os.lstat(sources[0])
        except OSError as exc:
            raise BinderError(BindFailure.SOURCE_ROLLOUT_MISSING, f"{sources[0]}: {exc}") from exc
        data = self._read(sources[0], missing=BindFailure.SOURCE_ROLLOUT_MISSING)
        _parse_source(data, thread_id, sources[0], self.spans)
        if len(data) == st.st_size:  # the bytes judged are the file `st` saw
            with self._ahead_lock:
                self._checked.pop(key, None)
                self._checked[key] = (sources[0], (st.st_ino, st.st_size, st.st_mtime_ns))
                while len(self._checked) > SPANS_MAX:
                    del self._checked[next(iter(self._checked))]

    def available(self) -> bool:
        """What an attestation reports as `binderAvailable` (seed 000 §7: a host_copy fork
        without a working binder fails closed before dispatch). True only when this platform
        has what `bind` relies on: no-follow opens, directory fsync (crash-durable rename) and
        atomic replace."""
        return all(hasattr(os, name) for name in ("O_NOFOLLOW", "O_DIRECTORY", "fsync", "replace"))

    def bind(self, source_home: Path | str, target_home: Path | str, child_id: str) -> BindReceipt:
        """`begin` and wait for it: when this returns the bound rollouts are durable."""
        receipt, names = self.begin(source_home, target_home, child_id)
        names.wait()
        return receipt

    def begin(
        self,
        source_home: Path | str,
        target_home: Path | str,
        child_id: str,
        planned: Callable[[Mapping[str, ParsedRollout]], None] | None = None,
        checked: Mapping[str, bool] | None = None,
        before_names: Callable[[], None] | None = None,
    ) -> tuple[BindReceipt, PendingNames]:
        """The bind with its last round of syncs (the names' directories) still running:
        the files are in place, readable and their bytes durable; `wait()` on the second
        value before anything counts them durable (the fork answers `accepted` only after
        it, and meanwhile proves the child readable). `planned`: called with each target's
        parse (`BindReceipt.parsed`) once every rollout is validated and planned, before the
        first write (a failed bind may have called it). `checked`: components of the homes'
        paths this fork's own symlink check found to be no link before (`DirsAhead.checked`:
        the target home's chain, walked and made while the provider forked), not `lstat`ed
        again; the path about to be written still is, right before the write. `before_names`:
        called between the files' bytes made durable and their renames (only when a file is
        written); if it raises, the temp files are removed, nothing is named, and its error is
        raised (`begin_atomic_write_all`)."""
        # Strings, not `Path`s, from here on (each `Path` built was a parse of the whole path).
        source_home = os.path.abspath(source_home)
        target_home = os.path.abspath(target_home)
        assert_homes_no_symlink(source_home, target_home, checked=checked)
        plans: list[_Plan] = []
        seen: set[str] = set()
        thread_id: str | None = child_id
        needed_ordinal: int | None = None
        role = "child"
        while thread_id is not None:
            if thread_id in seen or len(seen) >= _MAX_LINEAGE_DEPTH:
                raise BinderError(BindFailure.LINEAGE_INCOMPLETE, f"lineage loops at {thread_id}")
            seen.add(thread_id)
            plan, meta = self._plan(source_home, target_home, thread_id, role)
            if needed_ordinal is not None and meta.last_ordinal < needed_ordinal - 1:
                raise BinderError(
                    BindFailure.LINEAGE_INCOMPLETE,
                    f"{thread_id} ends at ordinal {meta.last_ordinal}, "
                    f"a descendant reads through {needed_ordinal - 1}",
                )
            plans.append(plan)
            if meta.referenced and meta.forked_from_id:
                needed_ordinal = referenced_ordinal(plan.target_bytes)
                thread_id, role = meta.forked_from_id, "ancestor"
            else:
                thread_id = None
        # Every rollout was validated and planned before the first write (fail closed).
        parsed = {p.target: p.target_parse for p in plans}
        if planned is not None:
            planned(parsed)
        writes = [p for p in plans if p.action in (BindAction.COPIED, BindAction.REPAIRED)]
        if writes and self._failpoints.armed:
            self._failpoints.hit("worker.bind.before_copy")
        try:
            # Ancestors first: a crash mid-bind never leaves a child whose lineage is missing.
            ordered = list(reversed(writes))
            present: set[str] = set()
            for plan in ordered:
                # Again just before the write: a link planted since the plan is still refused.
                missing = assert_no_symlink(plan.target, must_exist=False, below=target_home)
                if missing is None or missing == plan.target:
                    present.add(os.path.dirname(plan.target))  # its directory: no probe again
            # Two rounds: every file's bytes fsynced together, then every name (in this
            # order) and their directories fsynced together, the latter in the background.
            syncing = (
                begin_atomic_write_all(
                    [(plan.target, plan.target_bytes) for plan in ordered],
                    present=present,
                    before_names=before_names,
                )
                if ordered
                else None
            )
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, str(exc)) from exc
        names = PendingNames(syncing)
        if writes and self._failpoints.armed:
            self._failpoints.hit(
                "worker.bind.after_copy", tamper=lambda: tamper_with(Path(p.target) for p in writes)
            )
        receipt = BindReceipt(
            child_id=child_id,
            source_home=source_home,
            target_home=target_home,
            rollouts=tuple(_receipt(p) for p in plans),
            parsed=parsed,
        )
        return receipt, names

    def _plan(
        self, source_home: str, target_home: str, thread_id: str, role: str
    ) -> tuple[_Plan, RolloutMeta]:
        if not _THREAD_ID.match(thread_id):
            raise BinderError(BindFailure.BAD_THREAD_ID, f"bad thread id {thread_id!r}")
        try:
            sources = rollout_paths(source_home, thread_id)
            targets = rollout_paths(target_home, thread_id)
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, str(exc)) from exc
        if len(sources) > 1:
            raise BinderError(
                BindFailure.SOURCE_ROLLOUT_AMBIGUOUS, f"{len(sources)} for {thread_id}"
            )
        if len(targets) > 1:
            raise BinderError(
                BindFailure.TARGET_ROLLOUT_AMBIGUOUS, f"{len(targets)} for {thread_id}"
            )
        target_existing = targets[0] if targets else None
        target_bytes = self._read(target_existing) if target_existing is not None else None

        if not sources:
            # The source may be cleaned up: only a target that validates on its own is accepted.
            if target_existing is None or target_bytes is None:
                raise BinderError(BindFailure.SOURCE_ROLLOUT_MISSING, f"no rollout for {thread_id}")
            try:
                kept = parse_rollout(target_bytes, thread_id, self.spans)
            except ValueError as exc:
                raise BinderError(
                    BindFailure.SOURCE_ROLLOUT_MISSING, f"and target: {exc}"
                ) from None
            relative = _below(target_existing, target_home)
            return (
                _Plan(
                    thread_id,
                    role,
                    relative,
                    target_existing,
                    BindAction.KEPT,
                    None,
                    target_bytes,
                    kept,
                ),
                kept.meta,
            )

        source = sources[0]
        # No `lstat` of its components here: the lookup found it by descending only
        # directories that are no links, and the read opens it with `O_NOFOLLOW` (a link
        # named as the rollout is refused there, `SYMLINKED_PATH`).
        source_bytes = self._read(source, missing=BindFailure.SOURCE_ROLLOUT_MISSING)
        parsed = _parse_source(source_bytes, thread_id, source, self.spans)
        meta = parsed.meta
        relative = _below(source, source_home)
        # An archived target is repaired where it lives, never duplicated into sessions/.
        target = (
            target_existing if target_existing is not None else os.path.join(target_home, relative)
        )
        relative_target = _below(target, target_home)
        # Its components are not `lstat`ed here: an existing target was found by the lookup's
        # walk (no link descended) and read with `O_NOFOLLOW`; a target that is written —
        # copied or repaired — is checked right before the write (`begin`), the check the
        # law needs, and nothing is written before it.

        def plan(
            action: BindAction, data: bytes, data_parse: ParsedRollout = parsed
        ) -> tuple[_Plan, RolloutMeta]:
            return (
                _Plan(
                    thread_id, role, relative_target, target, action, source_bytes, data, data_parse
                ),
                meta,
            )

        if target_bytes is None:
            return plan(BindAction.COPIED, source_bytes)
        if target_bytes == source_bytes:
            return plan(BindAction.IDENTICAL, target_bytes)
        if target_bytes.startswith(source_bytes):
            try:
                kept_parse = parse_rollout(target_bytes, thread_id, self.spans)
            except ValueError as exc:
                # Rolling back would destroy the child's own history: refuse instead.
                raise BinderError(
                    BindFailure.TARGET_POST_FORK_CORRUPT, f"{target}: {exc}"
                ) from None
            return plan(BindAction.KEPT, target_bytes, kept_parse)
        if source_bytes.startswith(target_bytes):
            if first_line_identity(target_bytes) != thread_id:
                raise BinderError(
                    BindFailure.TARGET_IDENTITY_UNDETECTABLE,
                    f"{target} is a truncated prefix without a provable session_meta",
                )
            return plan(BindAction.REPAIRED, source_bytes)
        raise BinderError(BindFailure.TARGET_DIVERGED, f"{target} diverges from {source}")

    @staticmethod
    def _read(path: str, missing: BindFailure = BindFailure.IO_ERROR) -> bytes:
        try:
            return read_regular(path)
        except BinderError:
            raise
        except FileNotFoundError as exc:  # gone since the lookup listed it
            raise BinderError(missing, f"{path}: {exc}") from exc
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: O_NOFOLLOW met a symlinked file
                raise BinderError(BindFailure.SYMLINKED_PATH, f"{path} is a symlink") from exc
            raise BinderError(BindFailure.IO_ERROR, f"{path}: {exc}") from exc
