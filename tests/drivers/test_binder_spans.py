"""The binder's validated spans (`drivers.binder.ParsedSpans`): a second child of the same source
takes the lines it shares byte for byte with one validated before instead of decoding them
again, and the readability proof takes what it derived from them (lines, lean reduction) — and
a child that differs from the kept span anywhere, at any length, is decoded and judged as if
nothing were kept (a changed turn id in the middle of the span still ends the proof in a
problem: a span matched by anything but its bytes would pass it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tutti_agent
from drivers.binder import (
    BinderError,
    ParsedSpans,
    RolloutBinder,
    iter_rollouts,
    parse_rollout,
    rollout_matches,
)
from drivers.tutti_agent import prove_tutti_child
from drivers.tutti_proof import LEAN_RUN, LINES, known_lines
from tests.tutti_agent.items import explicit_turn, user_msg
from tests.tutti_agent.storeutil import write_root
from tutti_agent.fork import ForkOptions, ForkService, ThroughTurn
from tutti_agent.history import build_turns, reduce_run
from tutti_agent.rollout import read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)
VERSION = tutti_agent.__version__
TURNS = ["t1", "t2", "t3"]


def _source(tmp_path: Path) -> tuple[ThreadStore, str]:
    store = ThreadStore(tmp_path / "source")
    items = [it for t in TURNS for it in explicit_turn(t, f"u-{t}", f"a-{t}")]
    return store, write_root(store, items)


def _child(store: ThreadStore, root: str, through: str = "t2") -> str:
    child = ForkService(store).fork(root, ForkOptions(boundary=ThroughTurn(through))).child
    assert child is not None
    return child.thread_id


def _file(home: Path, thread_id: str) -> Path:
    [path] = rollout_matches(home, thread_id)
    return path


def test_a_second_child_takes_the_span_and_the_proof_its_lines_and_reduction(
    tmp_path: Path,
) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    prefix = TURNS[:2]
    first, second = _child(store, root), _child(store, root)
    r1 = binder.bind(store.home, tmp_path / "a", first)
    assert (binder.spans.hits, binder.spans.misses) == (0, 1)
    assert prove_tutti_child(tmp_path / "a", first, root, prefix, VERSION, r1.parsed) is None
    r2 = binder.bind(store.home, tmp_path / "b", second)
    assert binder.spans.hits == 1
    [(path, parsed)] = r2.parsed.items()
    assert parsed.span is not None and LINES in parsed.span.span.derived
    # The records taken are the ones a decode of the file returns.
    assert parsed.records == parse_rollout(Path(path).read_bytes(), second).records
    assert prove_tutti_child(tmp_path / "b", second, root, prefix, VERSION, r2.parsed) is None
    assert LEAN_RUN in parsed.span.span.derived
    # The lines the proof assembled are the ones a read of the file returns.
    target = ThreadStore(tmp_path / "b")
    assert target.adopt_decoded(
        Path(path), parsed.data, parsed.records, known_lines(parsed, Path(path))
    )
    assert list(target.load(second).lines) == read_rollout(Path(path))
    # It still judges: another prefix is refused with everything reused.
    assert prove_tutti_child(tmp_path / "b", second, root, TURNS[:1], VERSION, r2.parsed)


def test_a_child_whose_span_differs_by_one_byte_is_decoded_and_refused(tmp_path: Path) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    first, second = _child(store, root), _child(store, root)
    binder.bind(store.home, tmp_path / "a", first)
    # The second child's copied lines changed at the same length: t1 → t9 in the middle.
    path = _file(store.home, second)
    data = path.read_bytes()
    head = data.index(b"\n") + 1
    changed = data[:head] + data[head:].replace(b'"t1"', b'"t9"')
    assert len(changed) == len(data) and changed != data
    path.write_bytes(changed)
    receipt = binder.bind(store.home, tmp_path / "b", second)
    assert binder.spans.hits == 0  # no span of the first child matches these bytes
    [parsed] = receipt.parsed.values()
    assert parsed.records == parse_rollout(changed, second).records
    problem = prove_tutti_child(tmp_path / "b", second, root, TURNS[:2], VERSION, receipt.parsed)
    assert problem is not None and "t9" in problem


@pytest.mark.parametrize("where", ["first", "last"])
def test_the_ordinals_are_checked_across_a_spans_ends(tmp_path: Path, where: str) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    first, second = _child(store, root), _child(store, root)
    binder.bind(store.home, tmp_path / "a", first)
    path = _file(store.home, second)
    data = path.read_bytes()
    head = data.index(b"\n") + 1
    last = data.rindex(b"\n", 0, len(data) - 1) + 1
    if where == "first":  # the child's own first line now claims an ordinal past the span's
        line = data[:head]
        assert b'"ordinal":0' in line
        data = line.replace(b'"ordinal":0', b'"ordinal":5') + data[head:]
    else:  # its last line an ordinal inside the span's
        line = data[last:]
        ordinal = parse_rollout(path.read_bytes(), second).records[-1]["ordinal"]
        data = data[:last] + line.replace(f'"ordinal":{ordinal}'.encode(), b'"ordinal":1')
    path.write_bytes(data)
    with pytest.raises(BinderError, match="ordinal not increasing"):
        binder.bind(store.home, tmp_path / "b", second)
    assert binder.spans.hits == 1  # the span was taken, and its ends still judged


def test_a_span_at_another_offset_and_a_longer_prefix(tmp_path: Path) -> None:
    """A child whose own first line has another length (another cwd) takes the span at its
    offset; a fork through a later Turn takes the earlier span as the start of its own."""
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    first = _child(store, root)
    other = (
        ForkService(store)
        .fork(root, ForkOptions(boundary=ThroughTurn("t2"), cwd="/a/much/longer/working/directory"))
        .child
    )
    assert other is not None
    later = _child(store, root, "t3")
    r0 = binder.bind(store.home, tmp_path / "a", first)
    assert prove_tutti_child(tmp_path / "a", first, root, TURNS[:2], VERSION, r0.parsed) is None
    cases = [(other.thread_id, tmp_path / "b", TURNS[:2]), (later, tmp_path / "c", TURNS)]
    for hits, (child, home, prefix) in enumerate(cases, start=1):
        receipt = binder.bind(store.home, home, child)
        assert binder.spans.hits == hits
        assert prove_tutti_child(home, child, root, prefix, VERSION, receipt.parsed) is None
        [parsed] = receipt.parsed.values()
        path = _file(home, child)
        assert parsed.records == parse_rollout(path.read_bytes(), child).records
        # The proof's lines (the span's at this offset) are what a read of the file returns.
        assert parsed.span is not None
        taken = ThreadStore(home)
        assert taken.adopt_decoded(path, parsed.data, parsed.records, known_lines(parsed, path))
        assert list(taken.load(child).lines) == read_rollout(path)


def test_a_bound_copy_cut_after_a_span_hit_is_read_from_disk_and_refused(tmp_path: Path) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    first, second = _child(store, root), _child(store, root)
    binder.bind(store.home, tmp_path / "a", first)
    receipt = binder.bind(store.home, tmp_path / "b", second)
    assert binder.spans.hits == 1
    [copied] = list(iter_rollouts(tmp_path / "b"))
    data = copied.read_bytes()
    copied.write_bytes(data[: data.index(b"\n") + 1])  # what the tamper failpoint does
    problem = prove_tutti_child(tmp_path / "b", second, root, TURNS[:2], VERSION, receipt.parsed)
    assert problem is not None and "no longer holds the bytes the binder wrote" in problem


def test_spans_not_used_are_dropped(tmp_path: Path) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder(spans=ParsedSpans(idle_s=60.0))
    binder.bind(store.home, tmp_path / "a", _child(store, root))
    assert len(binder.spans) == 1
    assert binder.spans.sweep(time.monotonic() + 30.0) == 0  # used within the idle time
    assert binder.spans.sweep(time.monotonic() + 61.0) == 1
    assert len(binder.spans) == 0


def test_the_spans_are_bounded(tmp_path: Path) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder(spans=ParsedSpans(max_spans=1))
    binder.bind(store.home, tmp_path / "a", _child(store, root, "t1"))
    other = ThreadStore(tmp_path / "source")
    root2 = write_root(other, explicit_turn("x1", "u", "a"))
    binder.bind(store.home, tmp_path / "b", _child(store, root2, "x1"))
    assert len(binder.spans) == 1
    small = RolloutBinder(spans=ParsedSpans(max_bytes=10))
    small.bind(store.home, tmp_path / "c", _child(store, root))
    assert len(small.spans) == 0


def test_a_reduction_resumed_from_a_run_is_the_reduction() -> None:
    items = [it for t in ["a", "b", "c", "d"] for it in explicit_turn(t, f"u-{t}", f"r-{t}")]
    open_last = [*items, *explicit_turn("e", "u-e", "r-e", closed=False)]
    for history in (items, open_last, [user_msg("legacy"), *items]):
        for with_items in (True, False):
            whole = build_turns(history, with_items=with_items)
            for start in range(0, 3):
                for stop in range(start, len(history) + 1):
                    run = reduce_run(history, start, stop, with_items=with_items)
                    assert build_turns(history, with_items=with_items, run=run) == whole


def test_a_span_is_kept_inside_the_bytes_it_was_validated_in(tmp_path: Path) -> None:
    store, root = _source(tmp_path)
    child = _child(store, root)
    data = store.path_of(child).read_bytes()
    parsed = parse_rollout(data, child, ParsedSpans())
    assert parsed.span is not None
    span = parsed.span.span
    # No copy of the body: the span is a window of the validated bytes themselves.
    assert span.source is data
    assert span.view().tobytes() == data[data.index(b"\n") + 1 : data.rindex(b"\n", 0, -1) + 1]
    assert known_lines(parsed, Path("x")) is not None


def test_a_child_through_an_earlier_turn_takes_the_spans_leading_lines(tmp_path: Path) -> None:
    """A span whose rollout goes further than the child (its source forked through a later
    Turn, or validated ahead of the fork) gives the child the run of its whole lines the child
    holds from its start; the rest is decoded, and the proof judges the child as any other."""
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    later, earlier = _child(store, root, "t3"), _child(store, root, "t1")
    binder.bind(store.home, tmp_path / "a", later)
    [kept] = binder.spans._spans
    receipt = binder.bind(store.home, tmp_path / "b", earlier)
    assert binder.spans.hits == 1
    [parsed] = receipt.parsed.values()
    data = _file(store.home, earlier).read_bytes()
    assert parsed.records == parse_rollout(data, earlier).records
    # Every line the child copied (all but its first and last) is the span's decoded line.
    copied = len(parsed.records) - 2
    assert 0 < copied < len(kept.records)
    assert all(parsed.records[1 + i] is kept.records[i] for i in range(copied))
    assert parsed.records[-1] is not kept.records[copied]
    proof = prove_tutti_child(tmp_path / "b", earlier, root, TURNS[:1], VERSION, receipt.parsed)
    assert proof is None


def test_a_byte_changed_in_the_leading_lines_ends_the_run_before_its_line(tmp_path: Path) -> None:
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    later, earlier = _child(store, root, "t3"), _child(store, root, "t2")
    binder.bind(store.home, tmp_path / "a", later)
    [kept] = binder.spans._spans
    path = _file(store.home, earlier)
    data = path.read_bytes()
    head = data.index(b"\n") + 1
    at = data.index(b'"t2"', head)  # a byte of t2's first line, at the same length
    changed = data[:at] + b'"t8"' + data[at + 4 :]
    path.write_bytes(changed)
    line = changed.count(b"\n", 0, at)  # the changed line's index (0: the first line)
    receipt = binder.bind(store.home, tmp_path / "b", earlier)
    assert binder.spans.hits == 1
    [parsed] = receipt.parsed.values()
    assert parsed.records == parse_rollout(changed, earlier).records
    assert all(parsed.records[i] is kept.records[i - 1] for i in range(1, line))
    assert parsed.records[line] is not kept.records[line - 1]  # decoded from its own bytes
    problem = prove_tutti_child(tmp_path / "b", earlier, root, TURNS[:2], VERSION, receipt.parsed)
    assert problem is not None and "t8" in problem


@pytest.mark.parametrize("block", [1, 3, 7, 64, 1 << 18])
def test_the_lines_a_span_holds_are_its_longest_common_run_of_whole_lines(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    import random

    import drivers.binder as binder_module

    monkeypatch.setattr(binder_module, "_COMPARE_BLOCK", block)
    rng = random.Random(block)
    lines = [b"x" * rng.randrange(0, 9) + b"\n" for _ in range(40)]
    body = b"".join(lines)
    span = binder_module.Span(b"HEAD\n" + body, 5, 5 + len(body), tuple({} for _ in lines), 1, 40)

    def naive(data: bytes, at: int) -> tuple[int, int]:
        n = size = 0
        for line in lines:
            if data[at + size : at + size + len(line)] != line:
                break
            n, size = n + 1, size + len(line)
        return n, size

    for _ in range(200):
        cut = rng.randrange(0, len(body) + 1)
        data = bytearray(b"first\n" + body[:cut] + rng.choice([b"", b"y", b"\n", body[cut:]]))
        if data[6:] and rng.random() < 0.5:  # one byte changed somewhere in the body
            i = rng.randrange(6, len(data))
            data[i] = (data[i] + 1) % 256
        got = span.lines_held(bytes(data), 6)
        assert got == naive(bytes(data), 6), (cut, bytes(data))


def test_a_source_validated_ahead_gives_the_child_its_copied_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`RolloutBinder.validate_ahead` parses the source's rollout into the spans; the child's
    bind takes the lines it copied from there (compared byte for byte), and the proof judges
    it as any other. Nothing is parsed ahead for a rollout under `AHEAD_MIN_BYTES`, nor twice
    for an unchanged one whose span is kept."""
    import drivers.binder as binder_module

    store, root = _source(tmp_path)
    child = _child(store, root, "t3")
    binder = RolloutBinder()
    assert binder.wants_ahead(store.home, root)
    assert not binder.validate_ahead(store.home, root)  # under AHEAD_MIN_BYTES: not parsed
    assert not binder.wants_ahead(store.home, root) and len(binder.spans) == 0
    monkeypatch.setattr(binder_module, "AHEAD_MIN_BYTES", 0)
    binder = RolloutBinder()
    assert binder.validate_ahead(store.home, root)
    [ahead] = binder.spans._spans
    assert not binder.wants_ahead(store.home, root)  # unchanged, its span kept
    receipt = binder.bind(store.home, tmp_path / "a", child)
    assert binder.spans.hits == 1
    [parsed] = receipt.parsed.values()
    assert len(parsed.records) - 2 >= len(ahead.records)
    assert all(parsed.records[1 + i] is ahead.records[i] for i in range(len(ahead.records)))
    assert prove_tutti_child(tmp_path / "a", child, root, TURNS, VERSION, receipt.parsed) is None
    # The child's body replaced the source's (it extends it): a source whose body a kept
    # span begins with is not parsed again.
    assert binder.wants_ahead(store.home, root)
    assert not binder.validate_ahead(store.home, root)
    assert not binder.wants_ahead(store.home, root)
    # A missing rollout, a bad id: nothing happens, nothing raises.
    assert not binder.validate_ahead(store.home, "no-such-thread")
    assert not binder.validate_ahead(store.home, "../bad id")


def test_what_the_proof_derives_ahead_is_what_it_derives_itself(tmp_path: Path) -> None:
    """`derive_known` (run while the bind writes) leaves on the span the lines and the lean
    reduction the proof would make itself: the proof takes them (no second reduction), and
    they equal a reduction of the history read from the file."""
    from drivers.tutti_proof import derive_known, known_run

    store, root = _source(tmp_path)
    binder = RolloutBinder()
    first, second = _child(store, root), _child(store, root)
    binder.bind(store.home, tmp_path / "a", first)
    receipt = binder.bind(store.home, tmp_path / "b", second)
    [(path, parsed)] = receipt.parsed.items()
    assert parsed.span is not None
    derived = parsed.span.span.derived
    derived.clear()  # as if no proof had derived anything from this span yet
    derive_known(parsed, Path(path))
    lines, lean = derived[LINES], derived[LEAN_RUN]
    target = ThreadStore(tmp_path / "b")
    assert target.adopt_decoded(
        Path(path), parsed.data, parsed.records, known_lines(parsed, Path(path))
    )
    loaded = target.load(second)
    run = known_run(loaded, [parsed])
    assert run is lean[1] and derived[LINES] is lines  # taken, not made again
    use = parsed.span
    fresh = reduce_run(
        ThreadStore(tmp_path / "b").load(second).items,
        use.index,
        use.index + len(lines[1]),
        with_items=False,
    )
    assert run == fresh
    assert (
        prove_tutti_child(tmp_path / "b", second, root, TURNS[:2], VERSION, receipt.parsed) is None
    )


def test_the_memo_of_a_source_validated_ahead_keeps_no_dropped_span_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc
    import weakref

    import drivers.binder as binder_module

    monkeypatch.setattr(binder_module, "AHEAD_MIN_BYTES", 0)
    store, root = _source(tmp_path)
    binder = RolloutBinder()
    assert binder.validate_ahead(store.home, root)
    kept = weakref.ref(binder.spans._spans[0])
    binder.spans.clear()  # dropped, as the sweep or a longer span drops it
    gc.collect()
    assert kept() is None  # its records freed: ~67 MB for a 10,000-Turn source
    assert binder.wants_ahead(store.home, root)  # and validated again at the next fork


def test_a_child_is_compared_in_full_only_with_the_spans_whose_first_line_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker forking many sources keeps a span of each; a child of one of them holds no
    other's first line, and those spans cost one short compare each, not `lines_held`'s search
    for the first byte that differs (under 16 clients ~5 searches a fork, ~14 % of the bind's
    profiled time). The child still takes its own source's span."""
    import drivers.binder as binder_module

    binder = RolloutBinder()
    stores = []
    for i in range(5):
        store = ThreadStore(tmp_path / f"source-{i}")
        items = [it for t in TURNS for it in explicit_turn(t, f"u-{t} of {i}", f"a-{t} of {i}")]
        root = write_root(store, items)
        binder.bind(store.home, tmp_path / f"a-{i}", _child(store, root, "t3"))
        stores.append((store, root))
    assert len(binder.spans) == 5
    searched: list[object] = []
    real = binder_module.Span.lines_held

    def lines_held(span: binder_module.Span, data: bytes, at: int) -> tuple[int, int]:
        searched.append(span)
        return real(span, data, at)

    monkeypatch.setattr(binder_module.Span, "lines_held", lines_held)
    store, root = stores[2]
    earlier = _child(store, root, "t1")  # holds its source's span's leading lines only
    receipt = binder.bind(store.home, tmp_path / "b", earlier)
    assert len(searched) == 1
    [parsed] = receipt.parsed.values()
    assert parsed.records == parse_rollout(_file(store.home, earlier).read_bytes(), earlier).records
    assert (
        prove_tutti_child(tmp_path / "b", earlier, root, TURNS[:1], VERSION, receipt.parsed) is None
    )
