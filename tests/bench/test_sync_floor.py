"""The durability floor `bench.fork_overhead` prints beside its fork ratios: the syncs on
a fork's path come from strace's counts (less the acknowledgement's), each kind of sync is
timed on the real filesystem, and the floor adds them to the bare provider's p50."""

from __future__ import annotations

from pathlib import Path

from bench.common import Latency
from bench.sync_floor import (
    Floor,
    Rounds,
    commit_latency,
    round_latencies,
    store_commits_on_the_fork_path,
)


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
    rounds = round_latencies(tmp_path, samples=5, child_bytes=3000)
    assert commits.n == 5 and commits.p50 > 0
    assert rounds.bytes.n == rounds.names.n == rounds.both.n == 5
    assert rounds.bytes.p50 > 0 and rounds.names.p50 > 0
    # Each sample wrote one child rollout of the size asked, under its name, and no temp file.
    homes = sorted(tmp_path.glob("home*"))
    assert len(homes) == 5
    for home in homes:
        assert [(f.name, f.stat().st_size) for f in home.iterdir()] == [("rollout.jsonl", 3000)]


def test_the_floor_prints_each_round_beside_the_share_it_multiplies() -> None:
    one = Latency.of([0.25, 0.25, 0.25])
    rounds = Rounds(Latency.of([0.3] * 3), Latency.of([0.2] * 3), one)
    floor = Floor(1.0, 2.0, 2, Latency.of([0.5] * 3), rounds.both, rounds)
    assert floor.sync_ms == 1.5  # 2 × 0.5 + 2 × 0.25
    assert "the child's bytes 0.30, its name 0.20 ms p50" in floor.line()
    figures = floor.to_json()
    assert figures["bytesRoundMs"]["p50"] == 0.3  # type: ignore[index]
    assert figures["namesRoundMs"]["p50"] == 0.2  # type: ignore[index]


def test_the_models_compared_are_each_timed_once_per_sample(tmp_path: Path) -> None:
    from bench.sync_floor import compare_models

    figures = compare_models(tmp_path, samples=3)
    assert set(figures) == {"commit", "fiveDirs", "bytes", "names"}
    assert all(lat.n == 3 and lat.p50 > 0 for lat in figures.values())


def test_the_issued_rounds_write_every_file_below_the_chain_they_create(tmp_path: Path) -> None:
    from bench.sync_floor import issued_round_latencies

    rounds = issued_round_latencies(tmp_path, (3000, 5000), new_dirs=3, samples=4)
    assert rounds.bytes.n == rounds.names.n == 4
    for i in range(4):
        leaf = tmp_path / f"issued{i}" / "d0" / "d1"
        assert sorted((f.name, f.stat().st_size) for f in leaf.iterdir()) == [
            ("rollout-0.jsonl", 3000),
            ("rollout-1.jsonl", 5000),
        ]


def test_a_floor_names_whose_it_is_and_the_rounds_it_did_not_count() -> None:
    one = Latency.of([0.25] * 3)
    rounds = Rounds(Latency.of([0.3] * 3), Latency.of([0.2] * 3), one)
    issued = Rounds(Latency.of([0.4] * 3), Latency.of([0.2] * 3), Latency.of([0.3] * 3))
    floor = Floor(1.0, 2.0, 2, Latency.of([0.5] * 3), one, rounds, "codex", 22871, issued)
    assert floor.sync_ms == 1.5  # the issued rounds are not counted
    assert floor.line().startswith("codex durability floor")
    assert "a child of 22,871 bytes" in floor.line()
    assert "0.40 + 0.20 ms, not counted" in floor.line()
    assert floor.to_json()["childBytes"] == 22871
