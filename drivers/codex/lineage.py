"""A Codex fork child's lineage: where a committed child's state came from (recorded in its
runtime context, re-bound from at resume, seed 000 §10), the ancestors a Codex 0.171
Referenced rollout reads through `forked_from_id` in a home, and the strict reader of that
lineage that proves a bound child readable from its own home alone (`prove_codex_child`).

The proof's reader (`read_rollout_lineage`), of the Codex 0.171 rollout format: every rollout
of the lineage present exactly once under the target home, every line a complete record with
contiguous ordinals, `session_meta.id` naming its file's thread, each Referenced link
(`forked_from_id` + `forked_from_ordinal_exclusive` / `history_base`) reaching a line of its
parent that exists, with the recorded byte offset; then the turns (`task_started` …
`task_complete`/`turn_aborted`) of the logical history."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.app_server.fork import ReaderNotApplicable, prefix_problem
from drivers.binder import (
    ROLLOUT_DIRS,
    BinderError,
    ParsedRollout,
    read_regular,
    rollout_matches,
)
from tutti_agent.rollout import REFUSED, fast_loads

CONTEXT_KEY = "codex"
"""The driver's own key in a Session's runtime context: `{home, threadId, forkSource}`."""


@dataclass(frozen=True, slots=True)
class ForkLineage:
    """Where a committed fork child's provider state came from: the home and thread of its
    direct source. Re-binding from it at resume repairs a child whose copy was lost."""

    source_home: str
    source_thread_id: str

    def to_wire(self) -> dict[str, str]:
        return {"home": self.source_home, "threadId": self.source_thread_id}


def fork_lineage_of(
    home: Path, thread_id: str, runtime_context: Mapping[str, Any]
) -> ForkLineage | None:
    """The fork source of a Session, from its canonical runtime context.

    A fork child inherits its source's context frozen at prepare (seed 000 §5), so a `codex`
    entry naming another home and another thread is the direct source; once the child has run,
    its own entry names itself and keeps the recorded `forkSource`.
    """
    entry = runtime_context.get(CONTEXT_KEY)
    if not thread_id or not isinstance(entry, Mapping):
        return None
    recorded_home, recorded_thread = entry.get("home"), entry.get("threadId")
    if recorded_thread == thread_id:
        source = entry.get("forkSource")
        if (
            isinstance(source, Mapping)
            and isinstance(source.get("home"), str)
            and isinstance(source.get("threadId"), str)
            and source["home"] != str(home)
        ):
            return ForkLineage(source["home"], source["threadId"])
        return None
    if (
        isinstance(recorded_home, str)
        and isinstance(recorded_thread, str)
        and recorded_thread
        and recorded_home != str(home)
    ):
        return ForkLineage(recorded_home, recorded_thread)
    return None


def rollout_path(home: Path, thread_id: str) -> Path | None:
    suffix = f"-{thread_id}.jsonl"
    for dirname in ROLLOUT_DIRS:
        root = home / dirname
        if root.is_dir() and not root.is_symlink():
            for path in sorted(root.rglob(f"rollout-*{suffix}")):
                return path
    return None


def session_meta(path: Path) -> Mapping[str, Any]:
    with path.open("rb") as fh:
        first = json.loads(fh.readline())
    payload = first.get("payload") if isinstance(first, dict) else None
    if not isinstance(first, dict) or first.get("type") != "session_meta":
        raise ValueError(f"{path}: first line is not session_meta")
    return payload if isinstance(payload, dict) else {}


def rollout_lineage(home: Path, thread_id: str) -> list[str]:
    """The thread and the ancestors its rollout references in `home`, child first. A Codex
    0.171 child only holds its own lines and reads the rest through `forked_from_id`."""
    chain: list[str] = []
    current: str | None = thread_id
    while current and current not in chain and len(chain) < 64:
        chain.append(current)
        path = rollout_path(home, current)
        if path is None:
            break
        try:
            parent = session_meta(path).get("forked_from_id")
        except (OSError, ValueError):
            break
        current = parent if isinstance(parent, str) and parent else None
    return chain


# --------------------------------------------------------------------------- the proof's reader

MAX_LINEAGE_DEPTH = 64
_DECODE = json.JSONDecoder().decode


def _standard_ascii(raw: bytes) -> Any:
    return _DECODE(raw.decode("ascii"))


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """One complete rollout line, and where it physically lives."""

    thread_id: str  # the thread whose file holds the line
    ordinal: int
    type: str
    payload: Mapping[str, Any]
    end_byte_offset: int  # offset just past the line's newline in that file


@dataclass(frozen=True, slots=True)
class RolloutSegment:
    thread_id: str
    path: Path
    meta: Mapping[str, Any]
    records: tuple[RolloutRecord, ...]


@dataclass(frozen=True, slots=True)
class RolloutLineage:
    """A thread's logical history: its ancestors' lines through each fork point, then its own."""

    thread_id: str
    segments: tuple[RolloutSegment, ...]  # oldest ancestor first, the thread itself last
    records: tuple[RolloutRecord, ...]

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.segments[-1].meta


class LineageBroken(Exception):
    """The lineage cannot be read from this home; the message says where and why."""


def _records(
    data: bytes, thread_id: str, where: str, decoded: Sequence[Any] | None = None
) -> list[RolloutRecord]:
    """Every line of a rollout; a torn or malformed line anywhere is a broken lineage (the
    binder wrote complete, validated files: anything else was changed after it). `decoded`:
    each line's JSON value already decoded from exactly these bytes (the binder's parse of
    the file it wrote, `ParsedRollout.records`), taken instead of decoding again; every check
    below still runs on it."""
    if not data:
        raise LineageBroken(f"{where}: empty rollout")
    if not data.endswith(b"\n"):
        raise LineageBroken(f"{where}: torn last line")
    out: list[RolloutRecord] = []
    offset = 0
    lines = data.split(b"\n")
    del lines[-1]  # after the last newline: nothing
    if decoded is not None and len(decoded) != len(lines):
        decoded = None  # not this file's lines: decoded here
    if decoded is None:
        # Each line decoded as the standard library reads it: by orjson where that returns
        # the same (`tutti_agent.rollout.fast_loads`), else, in an all-ASCII file, through the
        # decoder's text path, in any other through `json.loads` of the line's bytes.
        standard = _standard_ascii if data.isascii() else json.loads
        loads = fast_loads(data, standard)
        values: list[Any] = []
        for number, raw in enumerate(lines, 1):
            try:
                try:
                    values.append(loads(raw))
                except REFUSED:
                    values.append(standard(raw))
            except ValueError as exc:
                raise LineageBroken(f"{where}: line {number} is not JSON ({exc})") from None
        decoded = values
    for number, (raw, obj) in enumerate(zip(lines, decoded, strict=True), 1):
        offset += len(raw) + 1
        if not isinstance(obj, dict):
            raise LineageBroken(f"{where}: line {number} is not an object")
        ordinal, kind, payload = obj.get("ordinal"), obj.get("type"), obj.get("payload")
        if (
            not isinstance(ordinal, int)
            or isinstance(ordinal, bool)
            or not isinstance(kind, str)
            or not isinstance(payload, dict)
            or "timestamp" not in obj
        ):
            raise LineageBroken(f"{where}: line {number} is not a rollout record")
        if out and ordinal != out[-1].ordinal + 1:
            raise LineageBroken(f"{where}: ordinal gap at line {number}")
        out.append(RolloutRecord(thread_id, ordinal, kind, payload, offset))
    return out


def _fork_point(meta: Mapping[str, Any], first_ordinal: int, where: str) -> tuple[int, Any]:
    """(end ordinal exclusive, history_base or None) of a Referenced child's parent prefix;
    every field that states the end ordinal must agree with the child's first ordinal."""
    ends = {first_ordinal}
    value = meta.get("forked_from_ordinal_exclusive")
    if value is not None:
        if not isinstance(value, int):
            raise LineageBroken(f"{where}: malformed forked_from_ordinal_exclusive")
        ends.add(value)
    base = meta.get("history_base")
    if base is not None:
        if (
            not isinstance(base, Mapping)
            or not isinstance(base.get("thread_id"), str)
            or not isinstance(base.get("end_ordinal_exclusive"), int)
            or not isinstance(base.get("end_byte_offset"), int)
        ):
            raise LineageBroken(f"{where}: malformed history_base")
        ends.add(base["end_ordinal_exclusive"])
    if len(ends) != 1:
        raise LineageBroken(f"{where}: fork point stated inconsistently {sorted(ends)}")
    return first_ordinal, base


def _segment(
    home: Path, thread_id: str, known: Mapping[str, ParsedRollout] | None = None
) -> RolloutSegment:
    try:
        matches = rollout_matches(home, thread_id)
    except OSError as exc:
        raise LineageBroken(f"{thread_id}: {exc}") from exc
    if len(matches) != 1:
        raise LineageBroken(f"{len(matches)} rollouts of {thread_id} under {home}")
    path = matches[0]
    try:
        data = read_regular(path)
    except (BinderError, OSError) as exc:
        raise LineageBroken(f"{path}: {exc}") from exc
    # Read back whole, always; only the decoding of the very bytes the binder validated and
    # wrote there is not done twice (a changed byte anywhere: decoded here).
    parsed = None if known is None else known.get(str(path))
    decoded = parsed.records if parsed is not None and parsed.data == data else None
    records = _records(data, thread_id, path.name, decoded)
    first = records[0]
    if first.type != "session_meta" or first.payload.get("id") != thread_id:
        raise LineageBroken(f"{path.name}: does not start with the session_meta of {thread_id}")
    return RolloutSegment(thread_id, path, first.payload, tuple(records))


def read_rollout_lineage(
    home: Path, thread_id: str, known: Mapping[str, ParsedRollout] | None = None
) -> RolloutLineage:
    """Resolve `thread_id`'s logical history from `home` alone (raises `LineageBroken`).

    A rollout starting at ordinal 0 holds its whole history (a root, or a Copied child); one
    starting past 0 is Referenced: it reads its `forked_from_id` parent's logical history up to
    its first ordinal. Where `history_base` pins the physical position of that boundary, the
    line must be in the named thread's own file and end at the recorded byte offset. `known`:
    the binder's parse of the files it just wrote, by path (`BindReceipt.parsed`): a file
    read back holding exactly those bytes takes their decoded lines (`_records`)."""
    chain: list[RolloutSegment] = []
    current: str | None = thread_id
    while current is not None:
        if any(s.thread_id == current for s in chain) or len(chain) >= MAX_LINEAGE_DEPTH:
            raise LineageBroken(f"lineage loops at {current}")
        seg = _segment(home, current, known)
        chain.append(seg)
        current = None
        first = seg.records[0].ordinal
        if first == 0:
            continue
        parent = seg.meta.get("forked_from_id")
        if not isinstance(parent, str) or not parent:
            raise LineageBroken(f"{seg.path.name}: starts at ordinal {first} without a parent")
        current = parent
    records: list[RolloutRecord] = list(chain[-1].records)
    for child, parent_seg in zip(reversed(chain[:-1]), reversed(chain[1:]), strict=True):
        # `records` is the parent's logical history: cut it at the child's fork point.
        end, base = _fork_point(child.meta, child.records[0].ordinal, child.path.name)
        if records[0].ordinal != 0 or records[-1].ordinal < end - 1:
            raise LineageBroken(
                f"{parent_seg.path.name}: its history ends before ordinal {end - 1}, which "
                f"{child.thread_id} reads through"
            )
        boundary = records[end - 1]
        if boundary.ordinal != end - 1:
            raise LineageBroken(f"{parent_seg.path.name}: ordinals are not contiguous")
        if base is not None and (
            boundary.thread_id != base["thread_id"]
            or boundary.end_byte_offset != base["end_byte_offset"]
        ):
            raise LineageBroken(
                f"{child.thread_id}: history_base {dict(base)} does not match ordinal "
                f"{end - 1} ({boundary.thread_id}, byte {boundary.end_byte_offset})"
            )
        records = records[:end] + list(child.records)
    return RolloutLineage(thread_id, tuple(reversed(chain)), tuple(records))


def codex_turns(records: Sequence[RolloutRecord]) -> list[tuple[str | None, bool]]:
    """(turn id, in progress) per turn, as Codex projects turns from lifecycle events: a
    `task_started` opens one (closing a still-open one, which died), `task_complete` or
    `turn_aborted` closes it (naming it if its start did not)."""
    turns: list[tuple[str | None, bool]] = []
    open_id: str | None = None
    is_open = False
    for record in records:
        if record.type != "event_msg":
            continue
        kind = record.payload.get("type")
        turn_id = record.payload.get("turn_id")
        named = str(turn_id) if isinstance(turn_id, str) and turn_id else None
        if kind == "task_started":
            if is_open:
                turns.append((open_id, False))
            open_id, is_open = named, True
        elif kind in ("task_complete", "turn_aborted") and is_open:
            turns.append((open_id or named, False))
            open_id, is_open = None, False
    if is_open:
        turns.append((open_id, True))
    return turns


def prove_codex_child(
    home: Path,
    child_id: str,
    source_id: str,
    prefix: Sequence[str],
    known: Mapping[str, ParsedRollout] | None = None,
) -> str | None:
    """Prove a Codex child readable from `home` alone with the rollout lineage reader (`known`:
    the bind's parse of what it wrote, `read_rollout_lineage`)."""
    try:
        lineage = read_rollout_lineage(home, child_id, known)
    except LineageBroken as exc:
        return f"lineage broken: {exc}"
    named = lineage.meta.get("forked_from_id")
    if named != source_id:
        return f"child rollout names source {named!r}, not {source_id!r}"
    turns = codex_turns(lineage.records)
    if any(t is None for t, _ in turns):
        raise ReaderNotApplicable("the child's history holds turns without ids")
    return prefix_problem(turns, prefix)
