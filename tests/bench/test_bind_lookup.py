"""bench.bind_lookup times the binder's rollout lookup, and a whole bind, on homes of growing
size, and first checks every tree it loads finds exactly the one rollout asked for in each.
Counts and answers, never timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bind_lookup
from bench.bind_lookup import measure


def test_the_bench_times_each_home_size_once_per_sample() -> None:
    tree = Path(__file__).resolve().parents[2]
    figures = measure({"this": tree}, samples=3, sizes=[1, 12])
    assert sorted(figures) == [("this", 1), ("this", 12), ("this bind", 1), ("this bind", 12)]
    assert all(cpu.n == 3 for cpu in figures.values())


def test_the_bench_refuses_a_tree_whose_lookup_misses_the_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = Path(__file__).resolve().parents[2]
    real = bind_lookup._load

    def blind(path: Path, name: str) -> object:
        module = real(path, name)
        module.rollout_matches = lambda home, thread_id: []  # type: ignore[attr-defined]
        return module

    monkeypatch.setattr(bind_lookup, "_load", blind)
    with pytest.raises(RuntimeError, match="differ"):
        measure({"this": tree}, samples=1, sizes=[3])
