"""What tutti-agent's in-worker readability proof reuses of a span the binder validated before
(`drivers.binder.ParsedSpans`): the span's `RolloutLine`s at its byte offset and its lean turn
reduction, each derived once from the span's records and kept with the span.

Both are functions of the span's records (and, for the lines, of the byte offset the span
starts at in the child's file, part of the key), and the records are a function of the span's
bytes, which the binder compared in full with the bound child's: a proof that takes them judges
what a proof deriving them again would. The proof still reads the bound file back whole
(`ThreadStore.adopt_decoded` compares it with the bytes the binder wrote), and every line
outside the span, the lineage checks, the ordinals and the prefix are judged as before."""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from pathlib import Path

from drivers.binder import ParsedRollout
from tutti_agent.history import ReducedRun, reduce_run
from tutti_agent.rollout import KnownLines, RolloutItem, RolloutLine, lines_of_decoded
from tutti_agent.store import ThreadHistory

LINES = "tutti_agent.lines"
"""`Span.derived` key: (byte offset the lines were built at, the span's `RolloutLine`s)."""
LEAN_RUN = "tutti_agent.lean_run"
"""`Span.derived` key: (byte offset, the span's lean `ReducedRun` at its record index)."""
_ITEM = itemgetter(2)
"""`RolloutLine.item` (its third field), read in C by `map`."""


def known_lines(parsed: ParsedRollout, path: Path) -> KnownLines | None:
    """The span's lines of `parsed` (built now if no proof built them at this offset yet)."""
    use = parsed.span
    if use is None:
        return None
    span = use.span
    got = span.derived.get(LINES)
    if got is None or got[0] != use.start:
        lines_at = lines_of_decoded(
            span.source, span.records, path, base=use.start, start=span.start, stop=span.stop
        )
        got = (use.start, lines_at)
        span.derived[LINES] = got
    lines: list[RolloutLine] = got[1]
    return KnownLines(use.index, use.start, lines)


def known_run(history: ThreadHistory, known: Iterable[ParsedRollout]) -> ReducedRun | None:
    """The lean reduction of a span whose very lines (`known_lines`) `history` holds where the
    span was found in its file (a single-file history, whose lines are its file's), or None."""
    if len(history.segments) != 1:
        return None
    for parsed in known:
        use = parsed.span
        got = None if use is None else use.span.derived.get(LINES)
        if use is None or got is None or got[0] != use.start:
            continue
        lines: list[RolloutLine] = got[1]
        stop = use.index + len(lines)
        if not lines or history.lines[use.index : stop] != tuple(lines):
            continue
        cached = use.span.derived.get(LEAN_RUN)
        if cached is not None and cached[0] == use.start:
            run: ReducedRun = cached[1]
            return run
        run = reduce_run(history.items, use.index, stop, with_items=False)
        use.span.derived[LEAN_RUN] = (use.start, run)
        return run
    return None


def derive_known(parsed: ParsedRollout, path: Path) -> None:
    """The span's lines (`known_lines`) and its lean reduction, made ahead of the proof (the
    fork runs this while the bind writes the files): the reduction of the span's lines' items
    at their record indices, which `known_run` takes only for a history holding those very
    lines there (it reduces `history.items[index:stop]`, the same items)."""
    known = known_lines(parsed, path)
    use = parsed.span
    if known is None or use is None or not known.lines:
        return
    cached = use.span.derived.get(LEAN_RUN)
    if cached is not None and cached[0] == use.start:
        return
    lines = known.lines
    items: list[RolloutItem] = [lines[0].item] * use.index  # before the span: never read
    items.extend(map(_ITEM, lines))  # `line.item for line in lines`, without a frame per line
    run = reduce_run(items, use.index, use.index + len(lines), with_items=False)
    use.span.derived[LEAN_RUN] = (use.start, run)
