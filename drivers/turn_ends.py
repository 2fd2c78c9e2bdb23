"""Whether an app-server thread's rollout (Codex's, the Tutti Agent's: the same lines) still
holds the end of the last Turn the host bound and settled `completed` (`boundTurnId`), checked
before a Turn or a fork sends anything.

A rollout cut back by hand to before that Turn is a valid JSONL prefix (the bind's and the
fork's readers take it), and a live app-server holds the conversation in memory and appends
past the cut: the next Turn would run on a history the store says holds a Turn it lost. A
Turn's end is its `event_msg` line whose payload is `task_complete` or `turn_aborted` naming
it (`turn_id`), in the thread's own rollout or, for a Codex fork child, one of its lineage's in
the home (a Tutti Agent child's rollout is a whole copy: its own file holds every end).

Cheap on every warm Turn: the line found is remembered per home (file, inode, offsets and its
bytes), and checked again with one `pread` of that line; a Turn not found there is looked for
in the last `TAIL_BYTES` of the file the last end was found in (the Turn that just ended is
at its end). Only a start that may walk the home (`search`) reads whole files, from the end.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 256 * 1024
"""How much of a file's end the no-search check reads for a Turn it does not know yet."""
FIRST_READ_BYTES = 16 * 1024
"""A scan's first read from a file's end: a Turn that just ended is in it."""
CHUNK_BYTES = 1 << 20
"""The step of a scan's later reads."""
END_TYPES = frozenset({"task_complete", "turn_aborted"})


@dataclass(frozen=True, slots=True)
class _Found:
    turn_id: str
    path: Path
    ino: int
    start: int
    line: bytes


def _is_end(line: bytes, turn_id: str) -> bool:
    """Whether `line` (no newline) is the `event_msg` that ends `turn_id`."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    if not isinstance(record, dict) or record.get("type") != "event_msg":
        return False
    payload = record.get("payload")
    return (
        isinstance(payload, dict)
        and payload.get("type") in END_TYPES
        and payload.get("turn_id") == turn_id
    )


def _scan(path: Path, turn_id: str, limit: int | None) -> _Found | None:
    """The line ending `turn_id` in `path`, read from its end (at most its last `limit`
    bytes); None when not there, or the file cannot be read."""
    needle = b'"turn_id":"' + turn_id.encode() + b'"'
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        hi = st.st_size
        floor = 0 if limit is None else max(0, hi - limit)
        carry = b""  # the start of the line the later read began inside
        step = min(FIRST_READ_BYTES, CHUNK_BYTES)
        while hi > floor:
            lo = max(floor, hi - step)
            step = CHUNK_BYTES
            buf = os.pread(fd, hi - lo, lo) + carry
            # Whole lines only: from the first newline on, unless this read starts the file.
            first = 0 if lo == 0 else buf.find(b"\n") + 1
            if lo > 0 and first == 0:
                carry, hi = buf, lo  # one line longer than the read: read on
                continue
            pos = buf.rfind(needle, first)
            while pos != -1:
                start = buf.rfind(b"\n", first, pos) + 1 or first
                end = buf.find(b"\n", pos)
                if end != -1 and _is_end(buf[start:end], turn_id):
                    return _Found(turn_id, path, st.st_ino, lo + start, buf[start : end + 1])
                pos = buf.rfind(needle, first, start)
            carry, hi = buf[:first], lo
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _still(found: _Found) -> bool:
    """Whether the remembered line is still in its file, at its place, byte for byte."""
    try:
        fd = os.open(found.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_ino != found.ino:
            return False
        return os.pread(fd, len(found.line), found.start) == found.line
    except OSError:
        return False
    finally:
        os.close(fd)


class TurnEnds:
    """Per home, the line that ended the last Turn asked about (see the module)."""

    def __init__(self) -> None:
        self._found: dict[Path, _Found] = {}
        self._lock = threading.Lock()

    def missing(
        self,
        home: Path,
        turn_id: str,
        tail: Path | None,
        files: Callable[[], Sequence[Path]],
        *,
        search: bool,
    ) -> bool | None:
        """Whether `turn_id`'s end is missing from the home's rollouts: False (found), True
        (not in any of `files()`, the thread's own rollout first, then its ancestors'), or
        None with `search` false when not found without reading more than a file's tail
        (`tail`: the thread's rollout when known without a walk)."""
        with self._lock:
            known = self._found.get(home)
        if known is not None and known.turn_id == turn_id and _still(known):
            return False
        tails = [p for p in (known.path if known is not None else None, tail) if p is not None]
        for path in dict.fromkeys(tails):
            found = _scan(path, turn_id, TAIL_BYTES)
            if found is not None:
                return self._keep(home, found)
        if not search:
            return None
        for path in files():
            found = _scan(path, turn_id, None)
            if found is not None:
                return self._keep(home, found)
        with self._lock:
            self._found.pop(home, None)
        return True

    def _keep(self, home: Path, found: _Found) -> bool:
        with self._lock:
            self._found[home] = found
        return False

    def forget(self, home: Path) -> None:
        with self._lock:
            self._found.pop(home, None)
