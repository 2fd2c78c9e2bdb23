"""Rollout files: the durable JSONL log of one thread under `TUTTI_AGENT_HOME/sessions`.

Owns the on-disk format (`{timestamp, ordinal, type, payload}` per line, first line
`session_meta`), crash-safe appends (flush + fsync per line) and tolerant reading (a torn
last line left by a killed process is ignored; any other bad line is corruption).

A new rollout whose first lines are all known up front is created whole: a new thread's
`session_meta` with `RolloutWriter.create` (every line handed to the file at once, `writelines`,
no joined copy), a fork's child, which this server never appends to, by descriptor
(`ThreadStore.create_child_lines`: one `open`, one `writev`); either way one fsync of the file,
then one fsync of each directory whose entries changed (a forked 10-turn child written line by
line would cost ~60 fsyncs).

Its lines are decoded as the standard library's decoder reads them, by orjson where the two
agree (`fast_loads`): the worker's binder and its readability proof decode rollouts the same
way. A large rollout is read, or a large history built from one, with the cyclic collector held
off (`gc_paused`, `hold_collector`), here and in every caller that builds on the read."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from tutti_agent.errors import RolloutCorrupt

# --------------------------------------------------------------------------- decoding a line
# JSONL lines decoded as the standard library's decoder reads them, by orjson where the two
# agree.
#
# A rollout is read line by line by the app-server, the worker's binder and its readability
# proof; the standard library's decoder was most of each one's CPU on a long rollout. orjson
# decodes the same line three times faster, and for every line orjson accepts the standard
# library returns the same value, with two exceptions, both handled here:
#
# - **integers beyond 64 bits**: orjson reads an integer beyond `[-2**63, 2**64)` as a float,
#   the standard library as an `int`. Such an integer needs 19 digits or more in a row, so a
#   file that holds no run of 19 digits anywhere (in a string or not) is decoded by orjson;
#   one that does is decoded by the standard library alone (`fast_loads`).
# - **nesting**: orjson reads arrays and objects nested up to 1,024 deep; the standard library
#   raises `RecursionError` from about 1,000 (the interpreter's recursion limit, less the
#   caller's stack). Neither encoder writes such a line (the standard library's encoder has
#   the same limit); a line between the two is read by every reader that decodes through
#   here — the binder, the proof and the app-server alike — so they still agree.
#
# Each line orjson refuses goes to the caller's standard-library decoder, which accepts or
# refuses it as before, with its own error: NaN and Infinity, numbers that overflow a double
# (`1e400`), lone surrogates (escaped, or raw in a bytes line), a UTF-8 BOM before a bytes
# line. Both decoders allow JSON whitespace (space, tab, CR) around a line's value and keep the
# last of duplicate keys at the first one's place; both refuse control characters in strings,
# trailing commas, leading zeros and a second value on the line
# (`tests/tutti_agent/test_json_lines.py` pins each of these).

_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
LONG_DIGITS = 19
"""A run of digits this long may be an integer orjson reads as a float: the least is
`-(2**63) - 1`, 19 digits (a shorter run is within the 64 bits orjson reads exactly)."""


_LONG_RUN = b"0" * LONG_DIGITS
AGREE_BLOCK = 1 << 16
"""`orjson_agrees` translates this many bytes at a time: one translated copy of a 14.7 MB
rollout would be 3,600 pages touched afresh (each a page fault, costly on a nested VM);
a block this size is reused from the allocator's free memory block after block."""


def orjson_agrees(data: bytes) -> bool:
    """Whether orjson reads every line of `data` it accepts as the standard library does: no
    run of `LONG_DIGITS` ASCII digits anywhere in it (a translate and a find per block, each
    block overlapping the next by `LONG_DIGITS - 1` bytes so no run across two is missed)."""
    for at in range(0, len(data), AGREE_BLOCK):
        if data[at : at + AGREE_BLOCK + LONG_DIGITS - 1].translate(_DIGITS).find(_LONG_RUN) >= 0:
            return False
    return True


LINE_BLOCK = 1 << 18
"""`line_blocks` splits this many bytes of lines at a time (a longer line: that line alone)."""


def line_blocks(data: bytes, start: int = 0, stop: int | None = None) -> Iterator[list[bytes]]:
    """The complete lines of `data[start:stop]` (each without its newline; what follows the
    last newline is left out), in lists of about `LINE_BLOCK` bytes of lines, each split only
    when the one before has been taken.

    A reader that drops each list before taking the next (`itertools.chain.from_iterable`
    does) keeps a block's worth of line objects alive, not the 60,000 of a 14.7 MB rollout: the
    next block's lines reuse the memory the last one's freed, where one `split` of the whole
    file touches ~15 MB afresh (~4,000 first-touch page faults)."""
    end = len(data) if stop is None else stop
    find, rfind = data.find, data.rfind
    at = start
    while at < end:
        cut = rfind(b"\n", at, min(end, at + LINE_BLOCK)) + 1
        if cut <= at:  # no newline in the block: one long line, or a torn tail
            cut = find(b"\n", at, end) + 1
            if cut <= 0:
                return
        lines = data[at:cut].split(b"\n")
        del lines[-1]  # after the block's last newline: nothing
        yield lines
        at = cut


def lines_of(data: bytes, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
    """`line_blocks` one line at a time."""
    return chain.from_iterable(line_blocks(data, start, stop))


REFUSED = orjson.JSONDecodeError
"""What `fast_loads`' decoder raises for a line it does not read: decode that line with the
standard library (whose own errors are not this type)."""


def fast_loads(data: bytes, standard: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """The decoder for the lines of `data`: `orjson.loads` where it returns what `standard`
    (the caller's standard-library decoder of one line's bytes) returns for every line it
    accepts, else `standard` itself. A line it raises `REFUSED` for goes to `standard`, which
    accepts or refuses it as it always has.

    Decode and use each line in the same pass (not all lines, then a second pass over the
    objects): 60,000 decoded lines do not stay in the CPU's caches, and each pass over them
    costs about what their checks do."""
    return orjson.loads if orjson_agrees(data) else standard


# --------------------------------------------------------------------------- the collector held off
# The cyclic garbage collector held off while a request builds or reads a large history.
#
# Parsing a 10,000-Turn rollout allocates about a million containers; each allocation burst
# past the collector's threshold starts a collection that walks every tracked object the
# parse has made so far, and those walks cost more than the parse itself. Nothing a history
# read builds is a reference cycle, so holding the collector off for its duration frees
# nothing later that would have been freed sooner. Process-wide (the interpreter has one
# collector): nested and concurrent holders share one pause, and the collector comes back
# as it was when the last one ends.

FREEZE_AFTER = 100_000
"""A pause that ends with more new containers alive than this (a 10,000-Turn thread's parse is
about a million) moves every tracked object into the collector's permanent generation
(`gc.freeze`, constant time) before the collector comes back: else the collection the next
allocation sets off walks all of them (~0.3–0.6 s for such a parse), and the older generations'
collections walk them again later. Frozen objects are still freed by reference counting as
before; only a reference cycle already garbage at that moment would never be collected, and
nothing a history read builds is a cycle."""

_collector_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (explicit `gc.collect()` still runs)."""
    resume = hold_collector()
    try:
        yield
    finally:
        resume()


def hold_collector() -> Callable[[], None]:
    """`gc_paused` across threads: the collector is held off until the returned function is
    called (by any thread; a second call does nothing). For a pause that ends elsewhere than
    it began: objects built under a pause and freed later, on another thread, without a
    collection walking them in between (each would walk every one of them)."""
    global _holders, _was_enabled
    with _collector_lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    done = False

    def resume() -> None:
        global _holders
        nonlocal done
        with _collector_lock:
            if done:
                return
            done = True
            _holders -= 1
            if _holders == 0 and _was_enabled:
                if gc.get_count()[0] > FREEZE_AFTER:
                    gc.freeze()
                gc.enable()

    return resume


# --------------------------------------------------------------------------- the log


class LineType(StrEnum):
    SESSION_META = "session_meta"
    EVENT_MSG = "event_msg"
    RESPONSE_ITEM = "response_item"


class RolloutItem(NamedTuple):
    """One logical history entry without its physical position (what a fork carries over).

    A named tuple, not a frozen dataclass: a 10,000-Turn rollout is 60,000 lines, and a
    frozen dataclass's constructor sets each field through `object.__setattr__` (the
    constructors were a third of reading such a rollout)."""

    type: str
    payload: Mapping[str, Any]

    @property
    def event_type(self) -> str | None:
        if self.type == LineType.EVENT_MSG:
            return str(self.payload.get("type"))
        return None


class RolloutLine(NamedTuple):
    """A persisted line: its ordinal is global across a Referenced lineage (a named tuple,
    as `RolloutItem`)."""

    ordinal: int
    timestamp: str
    item: RolloutItem
    end_byte_offset: int  # offset just after this line in its physical file

    def to_json(self) -> str:
        return _ENCODE(
            {
                "timestamp": self.timestamp,
                "ordinal": self.ordinal,
                "type": self.item.type,
                "payload": self.item.payload,
            }
        )


# One encoder for every line (`json.dumps` with options builds a new one per call,
# and a forked child encodes every line of its prefix).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def sessions_dir(home: Path) -> Path:
    return home / "sessions"


def new_rollout_path(home: Path, thread_id: str, when: datetime | None = None) -> Path:
    """A new rollout's path: `sessions/rollout-<ts>-<thread_id>.jsonl`, directly in
    `sessions/` (no `YYYY/MM/DD` below it, as Codex files them and tutti-agent did before):
    a fork child's target home is then three directories (`<session>`, the home,
    `sessions`), not six, each one a new inode and an fsync of its parent on the fork's path
    (docs/performance.md, "One directory per child home"). The readers still find a rollout
    an older build filed under `sessions/YYYY/MM/DD` (`find_rollout_path`,
    `iter_rollout_paths`); the time stays in the name."""
    when = when or datetime.now(UTC)
    return sessions_dir(home) / f"rollout-{when:%Y-%m-%dT%H-%M-%S}-{thread_id}.jsonl"


def iter_rollout_paths(home: Path) -> Iterator[Path]:
    """Every rollout of the home, sorted by path: the ones directly in `sessions/` (today's
    layout) and the ones an older build filed under `sessions/YYYY/MM/DD`."""
    root = sessions_dir(home)
    if root.is_dir():
        flat = [p for p in root.glob("rollout-*.jsonl") if p.is_file()]
        yield from sorted([*flat, *root.glob("*/*/*/rollout-*.jsonl")])


def thread_id_of_path(path: Path) -> str:
    # rollout-YYYY-MM-DDTHH-MM-SS-<uuid>.jsonl: the uuid is the last 36 characters.
    return path.name[: -len(".jsonl")][-36:]


def find_rollout_path(home: Path, thread_id: str) -> Path | None:
    """Exact lookup by the thread id in the file name (never a prefix or fuzzy match).

    The same files as `iter_rollout_paths` (`sessions/rollout-*.jsonl` and an older build's
    `sessions/*/*/*/rollout-*.jsonl`, first in sorted order wins), listed with `os.scandir`
    and matched on the name's end before any `Path` is built (a source home holds every
    child it ever forked, and a glob per lookup would compile a pattern and build a `Path`
    per rollout). A home of today's layout alone is one listing: `sessions/` holds no
    directory."""
    suffix = f"{thread_id}.jsonl"
    root = os.path.join(home, "sessions")  # `sessions_dir`'s, without a `Path` to parse
    found: list[str] = []
    level: list[str] = []
    for e in _entries(root):
        if e.is_dir():
            level.append(e.path)
        elif e.name.endswith(suffix) and e.name.startswith("rollout-") and e.is_file():
            found.append(e.path)
    for _ in range(2):  # an older build's year, month: their day directories below
        level = [entry.path for d in level for entry in _entries(d) if entry.is_dir()]
    for day in level:
        found.extend(
            e.path
            for e in _entries(day)
            if e.name.endswith(suffix) and e.name.startswith("rollout-") and e.is_file()
        )
    for name in sorted(found):
        path = Path(name)
        if thread_id_of_path(path) == thread_id:
            return path
    return None


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


_DECODE = json.JSONDecoder().decode


def read_file(path: Path) -> bytes:
    """A rollout's bytes, never through a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


COMPARE_BLOCK = 1 << 18
"""`file_holds` reads this many bytes at a time into one buffer."""


def file_holds(path: Path, data: bytes) -> bool:
    """Whether the file at `path` (never through a symlink) holds exactly `data`: read a block
    at a time into one reused buffer and compared in place (a 14.7 MB rollout read whole to be
    compared is 3,600 pages touched afresh)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        view = memoryview(bytearray(COMPARE_BLOCK))
        at = 0
        while n := os.readv(fd, [view]):
            if not data.startswith(view[:n], at):
                return False
            at += n
        return at == len(data)
    finally:
        os.close(fd)


def read_rollout(path: Path) -> list[RolloutLine]:
    """Read every complete line; a torn last line (no newline, bad JSON) is dropped.

    Each line is decoded as the standard library's decoder reads it: by orjson where that
    returns the same (`fast_loads`), else, in an all-ASCII file, through the decoder's text
    path, in any other through `json.loads` of the line's bytes. Same lines, same offsets,
    same errors either way."""
    return decode_rollout(path.read_bytes(), path)


def decode_rollout(data: bytes, path: Path) -> list[RolloutLine]:
    """`read_rollout` of `data`, the bytes just read from the file at `path` (named in errors)."""
    standard = _standard_ascii if data.isascii() else json.loads
    with gc_paused():
        # Past the last newline: nothing, or a torn tail from a crash mid-write (left out).
        return _read_lines(lines_of(data), path, fast_loads(data, standard), standard)


def _standard_ascii(raw: bytes) -> Any:
    return _DECODE(raw.decode("ascii"))


class KnownLines(NamedTuple):
    """Lines already built (`lines_of_decoded`) for the records `first`, `first + 1`, ... of a
    file, their line starting at byte `start` (offsets absolute in that file)."""

    first: int
    start: int
    lines: Sequence[RolloutLine]


def lines_of_decoded(
    data: bytes,
    records: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    base: int = 0,
    known: KnownLines | None = None,
    start: int = 0,
    stop: int | None = None,
) -> list[RolloutLine]:
    """The lines `read_rollout` returns for a file holding `data[start:stop]` (complete lines
    only, every one ending in a newline), given each line's JSON already decoded by a caller
    that checked those very bytes: the same lines, offsets and errors, without decoding again.

    `base`: `data[start]` is that byte of its file (the offsets count from there). `known`:
    the lines of a run of these records built before from the same records at the same
    offsets (the caller vouches for both: `ParsedSpans` compared the bytes): taken as they
    are, only the lines around them are built."""
    end_at = len(data) if stop is None else stop
    if known is not None and known.lines:
        n, last = len(known.lines), known.lines[-1]
        after = last.end_byte_offset - base
        if (
            known.first + n > len(records)
            or known.lines[0].item.payload is not records[known.first]["payload"]
            or last.item.payload is not records[known.first + n - 1]["payload"]
            or not 0 <= known.start - base <= after <= end_at - start
        ):
            raise ValueError("the known lines are not these records' lines")
        return [
            *lines_of_decoded(
                data,
                records[: known.first],
                path,
                base=base,
                start=start,
                stop=start + known.start - base,
            ),
            *known.lines,
            *lines_of_decoded(
                data,
                records[known.first + n :],
                path,
                base=last.end_byte_offset,
                start=start + after,
                stop=end_at,
            ),
        ]
    if end_at > start and data[end_at - 1] != 0x0A:
        raise ValueError("the decoded records are not the lines of these bytes")
    lines: list[RolloutLine] = []
    append = lines.append
    new = tuple.__new__  # as in `_read_lines`
    offset = base
    with gc_paused():
        # `_read_lines`' loop with each line's JSON taken from `records`, in a loop of its own:
        # a call per line fewer (the records' iterator) for the 60,000 lines of a 10,000-Turn
        # child the worker's proof reads (~20 % of this). A count of lines other than the
        # records' ends the loop (`strict`) before any line is answered.
        try:
            for raw, obj in zip(lines_of(data, start, end_at), records, strict=True):
                end = offset + len(raw) + 1
                try:
                    append(
                        new(
                            RolloutLine,
                            (
                                int(obj["ordinal"]),
                                str(obj["timestamp"]),
                                new(RolloutItem, (str(obj["type"]), obj["payload"])),
                                end,
                            ),
                        )
                    )
                except (ValueError, KeyError, TypeError) as exc:
                    raise RolloutCorrupt(
                        f"corrupt rollout line at byte {offset} of {path}: {exc}"
                    ) from None
                offset = end
        except ValueError:  # zip's: more lines than records, or fewer (a line's: RolloutCorrupt)
            raise ValueError("the decoded records are not the lines of these bytes") from None
    return lines


def _read_lines(
    raws: Iterable[bytes],
    path: Path,
    loads: Callable[[bytes], Any],
    standard: Callable[[bytes], Any],
) -> list[RolloutLine]:
    """A `RolloutLine` per line of `raws` (each a complete line, its newline stripped) from
    its JSON: `loads(raw)`, or `standard(raw)` where that raises `REFUSED`."""
    lines: list[RolloutLine] = []
    append = lines.append
    # The named tuples built with `tuple.__new__` straight, not through their constructors
    # (a Python-level call each, two per line): the same RolloutLines.
    new = tuple.__new__
    offset = 0
    for raw in raws:
        end = offset + len(raw) + 1
        try:
            try:
                obj = loads(raw)
            except REFUSED:
                obj = standard(raw)
            append(
                new(
                    RolloutLine,
                    (
                        int(obj["ordinal"]),
                        str(obj["timestamp"]),
                        new(RolloutItem, (str(obj["type"]), obj["payload"])),
                        end,
                    ),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RolloutCorrupt(
                f"corrupt rollout line at byte {offset} of {path}: {exc}"
            ) from None
        offset = end
    return lines


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> list[Path]:
    """`mkdir -p path`; returns the directories whose entries changed (the parent of each
    directory that was missing), deepest first, each once — what must be fsynced for the new
    directories to survive a crash. Empty when `path` already existed."""
    missing: list[Path] = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        probe = probe.parent
    changed: list[Path] = []
    for directory in reversed(missing):
        # A concurrent creator may have made it but not fsynced its parent yet: ours does.
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
        changed.append(directory.parent)
    changed.reverse()
    return changed


class SpanSource:
    """Bytes `[start, stop)` of a rollout held open (the very inode its parse came from), to be
    copied into a new file by the kernel (`copy_file_range`): a 10,000-Turn prefix read into
    this process first was 14.7 MB, ~3,600 pages touched afresh on the fork's path. A rollout
    only grows, so the open file holds those bytes for as long as it is open."""

    def __init__(self, fd: int, start: int, stop: int) -> None:
        self.fd = fd
        self.start = start
        self.stop = stop
        self._close = weakref.finalize(self, os.close, fd)

    def __len__(self) -> int:
        return self.stop - self.start

    def close(self) -> None:
        self._close()

    def read(self) -> bytes:
        """The bytes, read into this process; an `OSError` if the file holds fewer."""
        chunks: list[bytes] = []
        at = self.start
        while at < self.stop:
            chunk = os.pread(self.fd, min(self.stop - at, 1 << 24), at)
            if not chunk:
                raise OSError(errno.EIO, f"the copied span ended at byte {at}")
            chunks.append(chunk)
            at += len(chunk)
        return b"".join(chunks)

    def copy_to(self, fd: int) -> None:
        """Append the bytes to `fd` at its offset, in the kernel where it can (a file system
        that cannot: a block at a time through one buffer); an `OSError` if the file holds
        fewer of them than it did when opened (nothing may be made up)."""
        at = self.start
        try:
            while at < self.stop:
                copied = os.copy_file_range(self.fd, fd, self.stop - at, at)
                if not copied:
                    raise OSError(errno.EIO, f"the copied span ended at byte {at}")
                at += copied
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise
            block = memoryview(bytearray(min(self.stop - at, COMPARE_BLOCK)))
            while at < self.stop:
                got = os.preadv(self.fd, [block[: min(len(block), self.stop - at)]], at)
                if not got:
                    raise OSError(errno.EIO, f"the copied span ended at byte {at}") from None
                rest = block[:got]
                while rest:
                    rest = rest[os.write(fd, rest) :]
                at += got


_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})
"""`copy_file_range`'s answers for "not between these files": copied through a buffer."""


@dataclass(frozen=True, slots=True)
class CopiedSpan:
    """Complete lines of an existing rollout, to be written verbatim into a new one: `data`
    is the file's bytes `[start, start + len(data))` (in memory, or a `SpanSource` copied by
    the kernel), `lines` their parse (end offsets in that file, ordinals contiguous)."""

    data: bytes | SpanSource
    start: int
    lines: Sequence[RolloutLine]


def write_chunks(fd: int, chunks: Sequence[bytes | SpanSource]) -> None:
    """Write `chunks` in order at `fd`'s offset: each run of bytes by `writev` (up to
    `IOV_MAX` buffers a call; a short write finished a `write` at a time), each `SpanSource`
    copied by the kernel."""
    run: list[bytes] = []
    for chunk in [*chunks, None]:
        if isinstance(chunk, bytes):
            run.append(chunk)
            continue
        for at in range(0, len(run), _IOV_MAX):
            batch = run[at : at + _IOV_MAX]
            written = os.writev(fd, batch)
            if written < sum(map(len, batch)):  # a short write: the rest one `write` at a time
                rest = memoryview(b"".join(batch))[written:]
                while rest:
                    rest = rest[os.write(fd, rest) :]
        run = []
        if chunk is not None:
            chunk.copy_to(fd)


_IOV_MAX = 1024
"""Buffers one `writev` takes at most (Linux's `IOV_MAX`)."""


def open_span(path: Path, start: int, stop: int, identity: tuple[int, int]) -> SpanSource | None:
    """The bytes `[start, stop)` of the file at `path`, held open, if it is still the file
    `identity` (device, inode) names and holds them all; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if (st.st_dev, st.st_ino) != identity or st.st_size < stop:
        os.close(fd)
        return None
    return SpanSource(fd, start, stop)


class NewRollout(NamedTuple):
    """A new rollout's bytes, before any is written (`encode_new_rollout`)."""

    chunks: list[bytes | SpanSource]
    """The file's bytes in order (the copied span's one chunk, not joined)."""
    lines: list[RolloutLine]
    """Each line written, with its end offset in the new file (the copied ones only when asked)."""
    next_ordinal: int
    size: int


def encode_new_rollout(
    first_ordinal: int,
    items: Sequence[RolloutItem],
    copied: CopiedSpan | None = None,
    copied_lines: bool = True,
) -> NewRollout:
    """The bytes of a new rollout holding `items` (the first one `session_meta`) with `copied`
    verbatim right after the first (their ordinals must follow it) and the rest of `items`
    after them: one timestamp for the batch (the lines are written together), each line's end
    offset in the new file; `copied_lines=False`: the copied lines are not among those returned
    (for a caller that keeps no parse of the new file: 60,000 line objects fewer to build).
    `RolloutWriter.create` and `ThreadStore.create_child_lines` write what it returns."""
    timestamp = now_iso()
    lines: list[RolloutLine] = []
    chunks: list[bytes | SpanSource] = []
    offset = 0

    def encode(ordinal: int, item: RolloutItem) -> None:
        nonlocal offset
        data = (RolloutLine(ordinal, timestamp, item, 0).to_json() + "\n").encode()
        offset += len(data)
        chunks.append(data)
        lines.append(RolloutLine(ordinal, timestamp, item, offset))

    encode(first_ordinal, items[0])
    ordinal = first_ordinal + 1
    if copied is not None and copied.lines:
        if copied.lines[0].ordinal != ordinal:
            raise ValueError(f"copied lines start at {copied.lines[0].ordinal}, not {ordinal}")
        shift = offset - copied.start
        if copied_lines:
            # `tuple.__new__` straight, not the named tuple's constructor (a Python-level
            # call per line: 60,000 for a 10,000-Turn prefix); the same RolloutLines.
            new = tuple.__new__
            lines.extend(
                [
                    new(RolloutLine, (ordinal_, timestamp_, item_, end_ + shift))
                    for ordinal_, timestamp_, item_, end_ in copied.lines
                ]
            )
        chunks.append(copied.data)
        offset += len(copied.data)
        ordinal = copied.lines[-1].ordinal + 1
    for item in items[1:]:
        encode(ordinal, item)
        ordinal += 1
    return NewRollout(chunks, lines, ordinal, offset)


TAIL_BLOCK = 1 << 16
"""`RolloutWriter` looks for a rollout's last newline this many bytes at a time from its end."""


class RolloutWriter:
    """Appends lines to one rollout; each append is durable before it returns."""

    def __init__(self, path: Path, next_ordinal: int, *, create: bool) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._next = next_ordinal
        if create:
            changed = make_dirs(path.parent)
            self._file: BinaryIO = open(path, "xb")  # noqa: SIM115 - lives as long as the writer
            for directory in [path.parent, *changed]:
                fsync_dir(directory)
        else:
            self._file = open(path, "r+b")  # noqa: SIM115
            self._truncate_torn_tail()
        self._offset = self._file.seek(0, os.SEEK_END)

    @classmethod
    def create(
        cls,
        path: Path,
        first_ordinal: int,
        items: Sequence[RolloutItem],
        copied: CopiedSpan | None = None,
        *,
        copied_lines: bool = True,
    ) -> tuple[RolloutWriter, list[RolloutLine]]:
        """Create a rollout holding `items` (the first one `session_meta`), durable on return;
        `copied`: lines written verbatim right after the first item (their ordinals must
        follow it), the rest of `items` after them. The lines returned are every line written,
        with its offset in the new file; `copied_lines=False`: all but the copied ones (for a
        caller that keeps no parse of the new file: 60,000 line objects fewer to build).

        Durability as with one `append` per line, for a fraction of the cost: all lines written at
        once (`writelines`), one fsync of the file, then one fsync of its directory and of each
        parent whose entries changed because a directory was created. A crash before the return
        leaves at most an unreferenced, possibly torn file (a torn tail is ignored by readers, and
        the rollout was never announced); a failure removes the file before it raises."""
        changed = make_dirs(path.parent)
        new_rollout = encode_new_rollout(first_ordinal, items, copied, copied_lines)
        chunks, lines = new_rollout.chunks, new_rollout.lines
        file: BinaryIO = open(path, "xb")  # noqa: SIM115 - handed to the writer
        try:
            # Not joined first: a join of a 10,000-Turn child's copied bytes is a second 14.7 MB
            # copy (3,600 pages touched afresh) on the fork answer's path.
            write_chunks(file.fileno(), chunks)  # nothing buffered in `file` yet
            os.fsync(file.fileno())
            for directory in [path.parent, *changed]:
                fsync_dir(directory)
        except BaseException:
            file.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                fsync_dir(path.parent)
            raise
        writer = cls.__new__(cls)
        writer.path = path
        writer._lock = threading.Lock()
        writer._next = new_rollout.next_ordinal
        writer._file = file
        writer._offset = new_rollout.size
        return writer, lines

    def _truncate_torn_tail(self) -> None:
        # A torn last line would glue onto the next append and corrupt it: cut it first. Only
        # what follows the last newline is read, a block at a time from the end (a resumed
        # 10,000-Turn rollout read whole was 14.7 MB, ~3,600 pages touched afresh).
        fd = self._file.fileno()
        size = end = os.fstat(fd).st_size
        keep = 0
        while end > 0:
            start = max(0, end - TAIL_BLOCK)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        if keep != size:
            self._file.truncate(keep)
            self._file.flush()
            os.fsync(self._file.fileno())

    @property
    def next_ordinal(self) -> int:
        return self._next

    def append(self, item: RolloutItem) -> RolloutLine:
        """Append one line, durable on return. A line the disk refuses (full, failing) is cut
        off again before the error is raised, and nothing of it is kept to be written later:
        the next append starts where this one did, under the same ordinal (a buffered write
        kept the refused bytes and wrote them ahead of the next line, two lines under one
        ordinal)."""
        with self._lock:
            line = RolloutLine(self._next, now_iso(), item, 0)
            data = (line.to_json() + "\n").encode()
            fd = self._file.fileno()
            try:
                view = memoryview(data)
                at = self._offset
                while view:  # at its own offset: no file position, no buffer between
                    written = os.pwrite(fd, view, at)
                    view, at = view[written:], at + written
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self._offset)
                raise
            self._offset += len(data)
            self._next += 1
            return RolloutLine(line.ordinal, line.timestamp, item, self._offset)

    def close(self) -> None:
        with self._lock:
            self._file.close()
