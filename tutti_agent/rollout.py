"""Rollout files: the durable JSONL log of one thread under `TUTTI_AGENT_HOME/sessions`.

Owns the on-disk format (`{timestamp, ordinal, type, payload}` per line, first line
`session_meta`), crash-safe appends (flush + fsync per line) and tolerant reading (a torn
last line left by a killed process is ignored; any other bad line is corruption)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

from tutti_agent.errors import RolloutCorrupt


class LineType(StrEnum):
    SESSION_META = "session_meta"
    EVENT_MSG = "event_msg"
    RESPONSE_ITEM = "response_item"


@dataclass(frozen=True, slots=True)
class RolloutItem:
    """One logical history entry without its physical position (what a fork carries over)."""

    type: str
    payload: Mapping[str, Any]

    @property
    def event_type(self) -> str | None:
        if self.type == LineType.EVENT_MSG:
            return str(self.payload.get("type"))
        return None


@dataclass(frozen=True, slots=True)
class RolloutLine:
    """A persisted line: its ordinal is global across a Referenced lineage."""

    ordinal: int
    timestamp: str
    item: RolloutItem
    end_byte_offset: int  # offset just after this line in its physical file

    def to_json(self) -> str:
        return json.dumps(
            {
                "timestamp": self.timestamp,
                "ordinal": self.ordinal,
                "type": self.item.type,
                "payload": self.item.payload,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def sessions_dir(home: Path) -> Path:
    return home / "sessions"


def new_rollout_path(home: Path, thread_id: str, when: datetime | None = None) -> Path:
    when = when or datetime.now(UTC)
    day = sessions_dir(home) / f"{when:%Y}" / f"{when:%m}" / f"{when:%d}"
    return day / f"rollout-{when:%Y-%m-%dT%H-%M-%S}-{thread_id}.jsonl"


def iter_rollout_paths(home: Path) -> Iterator[Path]:
    root = sessions_dir(home)
    if root.is_dir():
        yield from sorted(root.glob("*/*/*/rollout-*.jsonl"))


def thread_id_of_path(path: Path) -> str:
    # rollout-YYYY-MM-DDTHH-MM-SS-<uuid>.jsonl: the uuid is the last 36 characters.
    return path.name[: -len(".jsonl")][-36:]


def find_rollout_path(home: Path, thread_id: str) -> Path | None:
    """Exact lookup by the thread id in the file name (never a prefix or fuzzy match)."""
    for path in iter_rollout_paths(home):
        if thread_id_of_path(path) == thread_id:
            return path
    return None


def read_rollout(path: Path) -> list[RolloutLine]:
    """Read every complete line; a torn last line (no newline, bad JSON) is dropped."""
    data = path.read_bytes()
    lines: list[RolloutLine] = []
    offset = 0
    while offset < len(data):
        newline = data.find(b"\n", offset)
        if newline < 0:
            break  # torn tail from a crash mid-write: the valid prefix stands
        raw = data[offset:newline]
        end = newline + 1
        try:
            obj = json.loads(raw)
            line = RolloutLine(
                ordinal=int(obj["ordinal"]),
                timestamp=str(obj["timestamp"]),
                item=RolloutItem(type=str(obj["type"]), payload=obj["payload"]),
                end_byte_offset=end,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RolloutCorrupt(
                f"corrupt rollout line at byte {offset} of {path}: {exc}"
            ) from None
        lines.append(line)
        offset = end
    return lines


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RolloutWriter:
    """Appends lines to one rollout; each append is durable before it returns."""

    def __init__(self, path: Path, next_ordinal: int, *, create: bool) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._next = next_ordinal
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file: BinaryIO = open(path, "xb")  # noqa: SIM115 - lives as long as the writer
            fsync_dir(path.parent)
        else:
            self._file = open(path, "r+b")  # noqa: SIM115
            self._truncate_torn_tail()
        self._offset = self._file.seek(0, os.SEEK_END)

    def _truncate_torn_tail(self) -> None:
        # A torn last line would glue onto the next append and corrupt it: cut it first.
        data = self._file.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            self._file.truncate(keep)
            self._file.flush()
            os.fsync(self._file.fileno())

    @property
    def next_ordinal(self) -> int:
        return self._next

    def append(self, item: RolloutItem) -> RolloutLine:
        with self._lock:
            line = RolloutLine(self._next, now_iso(), item, 0)
            data = (line.to_json() + "\n").encode()
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._offset += len(data)
            self._next += 1
            return RolloutLine(line.ordinal, line.timestamp, item, self._offset)

    def close(self) -> None:
        with self._lock:
            self._file.close()
