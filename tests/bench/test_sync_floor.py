"""The durability floor `bench.fork_overhead` prints beside its fork ratios: the syncs on
a fork's path come from strace's counts (less the acknowledgement's), each kind of sync is
timed on the real filesystem, and the floor adds them to the bare provider's p50."""

from __future__ import annotations

from pathlib import Path

from bench.common import Latency
from bench.sync_floor import Floor, commit_latency, round_latency, store_commits_on_the_fork_path


def test_the_fork_path_commits_leave_out_the_acknowledgement() -> None:
    calls = {
        "daemon": {"fdatasync": 5.0, "read": 13.0},
        "worker": {"fsync": 8.0, "mkdir": 6.0},  # timed as rounds, not counted
        "app-server": {"fsync": 2.0},  # the bare provider pays these too
    }
    assert store_commits_on_the_fork_path(calls) == 4.0
    assert store_commits_on_the_fork_path({}) == 0.0


def test_the_floor_is_the_bare_call_plus_every_sync_in_turn() -> None:
    floor = Floor(
        bare_ms=10.0,
        store_commits=4.0,
        worker_rounds=3,
        commit=Latency.of([1.0, 1.0, 1.0]),
        sync_round=Latency.of([0.5, 0.5, 0.5]),
    )
    assert floor.sync_ms == 5.5
    assert floor.floor_ms == 15.5
    assert floor.best_ratio == 1.55
    assert "a ratio of 1.55" in floor.line()
    assert floor.to_json()["bestRatio"] == 1.55


def test_each_kind_of_sync_is_timed_on_the_real_filesystem(tmp_path: Path) -> None:
    commits = commit_latency(tmp_path, samples=5)
    rounds = round_latency(tmp_path, samples=5, width=3)
    assert commits.n == 5 and commits.p50 > 0
    assert rounds.n == 5 and rounds.p50 > 0
    # Each timed round made one new directory in each of its parents durable.
    assert sorted(len(list(p.iterdir())) for p in tmp_path.glob("p*")) == [5, 5, 5]
