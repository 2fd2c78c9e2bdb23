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

from collections.abc import Iterable, Sequence
from pathlib import Path

from drivers.binder import ParsedRollout, SpanUse
from tutti_agent.history import ReducedRun, extend_run, reduce_run
from tutti_agent.rollout import KnownLines, RolloutItem, RolloutLine, lines_of_decoded
from tutti_agent.store import ThreadHistory

LINES = "tutti_agent.lines"
"""`Span.derived` key: (byte offset the lines were built at, the span's `RolloutLine`s)."""
LEAN_RUN = "tutti_agent.lean_run"
"""`Span.derived` key: (record index, the span's lean `ReducedRun` at that index): a function
of the records and the index alone (a run holds record indices, no byte offset), so the
source's span reduced ahead serves a child that holds it at the same index."""


def known_lines(parsed: ParsedRollout, path: Path) -> KnownLines | None:
    """The span's lines of `parsed`: built now if no reader built them yet; moved to this
    offset if they were built at another (the source's, ahead of the fork: a child holds the
    span's bytes after a first line of its own length)."""
    use = parsed.span
    if use is None:
        return None
    span = use.span
    got = span.derived.get(LINES)
    if got is None:
        base = use.grown_from
        grown = None if base is None else base.derived.get(LINES)
        if base is not None and grown is not None:
            # The span it grew from, derived before (the source's, ahead of the fork): its
            # lines moved here, only the lines after them built.
            head = shifted(grown[1], use.start - grown[0])
            tail = lines_of_decoded(
                span.source,
                span.records[len(head) :],
                path,
                base=use.start + base.size,
                start=span.start + base.size,
                stop=span.stop,
            )
            lines_at = [*head, *tail]
        else:
            lines_at = lines_of_decoded(
                span.source, span.records, path, base=use.start, start=span.start, stop=span.stop
            )
        got = (use.start, lines_at)
        span.derived[LINES] = got
    elif got[0] != use.start:
        got = (use.start, shifted(got[1], use.start - got[0]))
        span.derived[LINES] = got
    lines: list[RolloutLine] = got[1]
    return KnownLines(use.index, use.start, lines)


def shifted(lines: list[RolloutLine], by: int) -> list[RolloutLine]:
    """`lines` with every end offset moved by `by` bytes: the lines `lines_of_decoded` builds
    from the same records at a base `by` bytes later (a line's offset is its base plus the
    lengths of the lines before it; nothing else of it depends on where it lies)."""
    new = tuple.__new__  # as in `lines_of_decoded`: no Python-level constructor call per line
    return [new(RolloutLine, (o, t, item, end + by)) for o, t, item, end in lines]


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
        if cached is not None and cached[0] == use.index:
            run: ReducedRun = cached[1]
            return run
        run = _lean_run(history.items, use, stop)
        use.span.derived[LEAN_RUN] = (use.index, run)
        return run
    return None


def derive_known(parsed: ParsedRollout, path: Path) -> None:
    """The span's lines (`known_lines`) and its lean reduction, made ahead of the proof (the
    binder's validation ahead runs this on the source, while the source is read and forked;
    the fork, on the child while the bind writes the files): the reduction of the span's
    lines' items at their record indices, which `known_run` takes only for a history holding
    those very lines there (it reduces `history.items[index:stop]`, the same items)."""
    known = known_lines(parsed, path)
    use = parsed.span
    if known is None or use is None or not known.lines:
        return
    cached = use.span.derived.get(LEAN_RUN)
    if cached is not None and cached[0] == use.index:
        return
    lines = known.lines
    items: list[RolloutItem] = [lines[0].item] * use.index  # before the span: never read
    items.extend(line.item for line in lines)
    run = _lean_run(items, use, use.index + len(lines))
    use.span.derived[LEAN_RUN] = (use.index, run)


def _lean_run(items: Sequence[RolloutItem], use: SpanUse, stop: int) -> ReducedRun:
    """The lean reduction of `items[use.index:stop]` (the span's lines' items): from the
    reduction of the span it grew from, when one was made at the same index (its lines are
    the first of these, the same items), else from the start."""
    grown = None if use.grown_from is None else use.grown_from.derived.get(LEAN_RUN)
    if grown is not None and grown[0] == use.index and grown[1].stop <= stop:
        return extend_run(grown[1], items, stop)
    return reduce_run(items, use.index, stop, with_items=False)
