"""bench.bind_rounds times the binder's durable write and counts its rounds from the code it
loads: this tree's `atomic_write_all` waits for `SYNC_ROUNDS` rounds for a Referenced child
as for a Copied one (what bench.sync_floor multiplies), and `DirsAhead` makes a fresh target
home's chain durable one parent at a time on the calling thread (the bench's dated chain: six
parents, six rounds of one; docs/performance.md, forkw). Counts, never timings."""

from __future__ import annotations

from pathlib import Path

from bench.bind_rounds import measure
from drivers.binder import SYNC_ROUNDS


def test_the_bench_counts_the_binders_rounds_per_write() -> None:
    tree = Path(__file__).resolve().parents[2]
    figures = measure({"this": tree}, samples=3, lines=5)
    assert {kind: rounds for (_, kind), (_, _, rounds) in figures.items()} == {
        "referenced": SYNC_ROUNDS,
        "copied": SYNC_ROUNDS,
        "dirs-ahead": 6,
    }
    assert all(wall.n == 3 for wall, _, _ in figures.values())
