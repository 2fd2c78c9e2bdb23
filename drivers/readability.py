"""In-worker proof that a bound fork child is readable from its own home alone.

Seed 000 §7 and ARCHITECTURE.md require, before a fork may be `accepted`, that the child the
binder copied is readable from the target home with nothing from the source home. A fresh
app-server on the target home per fork would cost ~80 ms of interpreter start-up for
tutti-agent, more for Codex, so the proof is made with the provider's own history reader, in
the worker process, from the files of the target home only:

- **tutti-agent**: `tutti_agent.store.ThreadStore(target_home).load(child)` — the very lineage
  resolution its app-server runs for `thread/read` (history_base chain, byte offsets, ordinal
  contiguity, session_meta identity) — then `tutti_agent.history.build_turns`, the reduction
  its `thread/read` projects turns with. Only used when the package in this interpreter is
  the exact version the attested runtime reported (else: `ReaderNotApplicable`).
- **codex**: `read_rollout_lineage`, a strict reader of the Codex 0.171 rollout format: every
  rollout of the lineage present exactly once under the target home, every line a complete
  record with contiguous ordinals, `session_meta.id` naming its file's thread, each
  Referenced link (`forked_from_id` + `forked_from_ordinal_exclusive` / `history_base`)
  reaching a line of its parent that exists, with the recorded byte offset; then the turns
  (`task_started` … `task_complete`/`turn_aborted`) of the logical history.

Both proofs require: the child names the source as `forked_from_id`, its turns are exactly the
frozen prefix (ids, in order) and none of them is in progress. A problem is returned as text
(the driver turns it into `unknown`); a history this reader cannot judge raises
`ReaderNotApplicable` and the driver falls back to the spawned app-server's proof. Seed 000
§10's idempotent re-bind at the child's first resume stays the second line of defence.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.binder import BinderError, ParsedRollout, read_regular, rollout_matches
from tutti_agent.rollout import REFUSED, fast_loads

MAX_LINEAGE_DEPTH = 64
_DECODE = json.JSONDecoder().decode


def _standard_ascii(raw: bytes) -> Any:
    return _DECODE(raw.decode("ascii"))


class ReaderNotApplicable(Exception):
    """The in-worker reader cannot judge this child (another provider version, a history
    format it does not know); the caller must prove readability another way."""


# --------------------------------------------------------------------------- common checks


def _turn_problem(turns: Sequence[tuple[str | None, bool]], prefix: Sequence[str]) -> str | None:
    """`turns` as (id, in_progress) in history order; None when they are exactly `prefix`."""
    ids = [t for t, _ in turns]
    if ids != list(prefix):
        return f"target home shows turns {ids}, not the frozen prefix {list(prefix)}"
    busy = [t for t, in_progress in turns if in_progress]
    if busy:
        return f"target home shows turns {busy} still in progress"
    return None


# --------------------------------------------------------------------------- tutti-agent


def prove_tutti_child(
    home: Path,
    child_id: str,
    source_id: str,
    prefix: Sequence[str],
    runtime_version: str,
    known: Mapping[str, ParsedRollout] | None = None,
    *,
    litter: list[object] | None = None,
) -> str | None:
    """Prove a tutti-agent child readable from `home` with tutti_agent's own reader.

    `known`: the binder's validated bytes and decoded lines of the files it just bound, by
    path. The reader still finds, reads and compares each file in full; a file that holds
    exactly those bytes has its lines taken from the binder's decoding of them (the same
    JSON values a second decode would return) instead of decoding 60,000 lines again.
    `litter`: the reader's store and the child's history go there (freed by the caller after
    the verdict is answered: 120,000 line objects for a 10,000-Turn child), not freed here."""
    import tutti_agent
    from tutti_agent.errors import AppServerError, RolloutCorrupt
    from tutti_agent.history import TurnStatus, build_turns
    from tutti_agent.store import ThreadStore

    if tutti_agent.__version__ != runtime_version:
        # The app-server that will serve the child is another build: only it can judge.
        raise ReaderNotApplicable(
            f"in-worker tutti_agent {tutti_agent.__version__} != runtime {runtime_version}"
        )
    store = ThreadStore(home)
    if litter is not None:
        litter.append(store)  # its parse of the child, kept until the caller frees it
    try:
        for path, parsed in (known or {}).items():
            store.adopt_decoded(Path(path), parsed.data, parsed.records)
        history = store.load(child_id)
        if litter is not None:
            litter.append(history)
    except (AppServerError, RolloutCorrupt, OSError, ValueError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if history.forked_from_id != source_id:
        return f"child rollout names source {history.forked_from_id!r}, not {source_id!r}"
    # The reduction the app-server's `thread/read` projects turns with; only the turns' ids
    # and statuses are judged, so without their items (`turnItems: false`'s reduction).
    turns = build_turns(history.items, with_items=False)
    if any(t.id is None for t in turns):
        raise ReaderNotApplicable("the child's history holds legacy turns without ids")
    return _turn_problem([(t.id, t.status is TurnStatus.IN_PROGRESS) for t in turns], prefix)


# --------------------------------------------------------------------------- codex rollouts


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


def _records(data: bytes, thread_id: str, where: str) -> list[RolloutRecord]:
    """Every line of a rollout; a torn or malformed line anywhere is a broken lineage (the
    binder wrote complete, validated files: anything else was changed after it)."""
    if not data:
        raise LineageBroken(f"{where}: empty rollout")
    if not data.endswith(b"\n"):
        raise LineageBroken(f"{where}: torn last line")
    out: list[RolloutRecord] = []
    offset = 0
    lines = data.split(b"\n")
    del lines[-1]  # after the last newline: nothing
    # Each line decoded as the standard library reads it: by orjson where that returns the
    # same (`tutti_agent.rollout.fast_loads`), else, in an all-ASCII file, through the
    # decoder's text path, in any other through `json.loads` of the line's bytes.
    standard = _standard_ascii if data.isascii() else json.loads
    loads = fast_loads(data, standard)
    for number, raw in enumerate(lines, 1):
        offset += len(raw) + 1
        try:
            try:
                obj = loads(raw)
            except REFUSED:
                obj = standard(raw)
        except ValueError as exc:
            raise LineageBroken(f"{where}: line {number} is not JSON ({exc})") from None
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


def _segment(home: Path, thread_id: str) -> RolloutSegment:
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
    records = _records(data, thread_id, path.name)
    first = records[0]
    if first.type != "session_meta" or first.payload.get("id") != thread_id:
        raise LineageBroken(f"{path.name}: does not start with the session_meta of {thread_id}")
    return RolloutSegment(thread_id, path, first.payload, tuple(records))


def read_rollout_lineage(home: Path, thread_id: str) -> RolloutLineage:
    """Resolve `thread_id`'s logical history from `home` alone (raises `LineageBroken`).

    A rollout starting at ordinal 0 holds its whole history (a root, or a Copied child); one
    starting past 0 is Referenced: it reads its `forked_from_id` parent's logical history up to
    its first ordinal. Where `history_base` pins the physical position of that boundary, the
    line must be in the named thread's own file and end at the recorded byte offset."""
    chain: list[RolloutSegment] = []
    current: str | None = thread_id
    while current is not None:
        if any(s.thread_id == current for s in chain) or len(chain) >= MAX_LINEAGE_DEPTH:
            raise LineageBroken(f"lineage loops at {current}")
        seg = _segment(home, current)
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
    home: Path, child_id: str, source_id: str, prefix: Sequence[str]
) -> str | None:
    """Prove a Codex child readable from `home` alone with the rollout lineage reader."""
    try:
        lineage = read_rollout_lineage(home, child_id)
    except LineageBroken as exc:
        return f"lineage broken: {exc}"
    named = lineage.meta.get("forked_from_id")
    if named != source_id:
        return f"child rollout names source {named!r}, not {source_id!r}"
    turns = codex_turns(lineage.records)
    if any(t is None for t, _ in turns):
        raise ReaderNotApplicable("the child's history holds turns without ids")
    return _turn_problem(turns, prefix)
