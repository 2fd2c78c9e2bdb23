"""`bench.throughput`'s levels fork the same sources by default (the 16-client window's first
four then hold every child levels 1 and 4 made of them), or with `FRESH_SOURCES_ENV` set each
level sources of its own, none forked before its window."""

from __future__ import annotations

from bench.throughput import level_sources

SIDS = [f"s{i}" for i in range(21)]


def test_the_levels_share_their_first_sources_by_default() -> None:
    got = level_sources(SIDS[:16], (1, 4, 16), fresh=False)
    assert got == [SIDS[:1], SIDS[:4], SIDS[:16]]


def test_fresh_levels_each_fork_sources_no_other_level_forks() -> None:
    got = level_sources(SIDS, (1, 4, 16), fresh=True)
    assert [len(level) for level in got] == [1, 4, 16]
    flat = [sid for level in got for sid in level]
    assert sorted(flat) == sorted(SIDS)  # every source used once, by one level
    assert len(set(flat)) == len(flat)
