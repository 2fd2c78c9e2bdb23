"""The durability floor `bench.fork_overhead` prints beside issue 20's fork ratios: the syncs on
a fork's path come from strace's counts (less the acknowledgement's), each kind of sync is
timed on the real filesystem, and the floor adds them to the bare provider's p50."""

from __future__ import annotations

from pathlib import Path

from bench.common import Latency
from bench.sync_floor import (
    Floor,
    commit_latency,
    dir_fsync_latency,
    syncs_on_the_fork_path,
)


def test_the_fork_path_syncs_leave_out_the_acknowledgement() -> None:
    calls = {
        "daemon": {"fdatasync": 5.0, "read": 13.0},
        "worker": {"fsync": 8.0, "mkdir": 6.0},
        "app-server": {"fsync": 2.0},  # the bare provider pays these too
    }
    assert syncs_on_the_fork_path(calls) == (4.0, 8.0)
    assert syncs_on_the_fork_path({}) == (0.0, 0.0)


def test_the_floor_is_the_bare_call_plus_every_sync_in_turn() -> None:
    floor = Floor(
        bare_ms=10.0,
        daemon_syncs=4.0,
        worker_syncs=8.0,
        commit=Latency.of([1.0, 1.0, 1.0]),
        dir_fsync=Latency.of([0.5, 0.5, 0.5]),
    )
    assert floor.sync_ms == 8.0
    assert floor.floor_ms == 18.0
    assert floor.best_ratio == 1.8
    assert "a ratio of 1.80" in floor.line()
    assert floor.to_json()["bestRatio"] == 1.8


def test_each_kind_of_sync_is_timed_on_the_real_filesystem(tmp_path: Path) -> None:
    commits = commit_latency(tmp_path, samples=5)
    fsyncs = dir_fsync_latency(tmp_path, samples=5)
    assert commits.n == 5 and commits.p50 > 0
    assert fsyncs.n == 5 and fsyncs.p50 > 0
    assert len(list(tmp_path.glob("d*"))) == 5  # one new directory per timed fsync
