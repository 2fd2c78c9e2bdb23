"""The durability floor of one fork on this machine's disk (issue 20, rows 1 and 3): what a
host fork must wait for beyond the bare provider's own call even if every other cost were zero.

The saga's laws make a fork wait, one after the other, for the store's fsync'd transactions
(a warm fork: dispatching and committed, one `fdatasync` of the WAL each; its prepared and
provider_accepted are lazy writes the next fsync takes to the disk, docs/design/store.md and
design/fork-saga.md "A lazy prepare"; a fork that re-attests or makes a tree fsyncs prepared
too) and for
the worker's crash-durable copy of the child into its own home (seed 000 §8). The binder issues
its fsyncs in rounds (`drivers.rollout_files.atomic_write_all`): the syncs of a round run
together, the rounds one after the other — any child, Copied or Referenced, takes two
(`SYNC_ROUNDS`): every file's bytes with the new directories, then, after the renames, their
directories. `bench.fork_syscalls --strace` counts the store's COMMITs per fork; this module
times an SQLite COMMIT in WAL mode with `synchronous=FULL`, and a round of five directory fsyncs
issued together (`sync_together`, as the binder does) on the same filesystem, and adds:

    floor = bare p50 + store COMMITs × COMMIT p50 + worker rounds × round p50

`floor / bare` is then the best p50 ratio a host fork can reach on this disk without weakening a
durability law (the acknowledgement's sync is not on the fork's path and is left out).

    build/venv/bin/python -m bench.sync_floor [--bare-ms 8.5] [--forks 10] [--worker-rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import apsw

from bench.common import Latency, cpu_probe_ms
from drivers.rollout_files import SYNC_ROUNDS

SAMPLES = 200
WORKER_ROUNDS = SYNC_ROUNDS
"""A child's bind: every file's bytes, then the directories of their names (the binder's own
count, pinned by tests/drivers/test_binder_fsyncs)."""
ROUND_WIDTH = 5
"""Directories fsynced together in the binder's widest round (tests/drivers/test_binder_fsyncs)."""


def commit_latency(directory: Path, samples: int = SAMPLES) -> Latency:
    """One-row COMMITs of an SQLite database opened as the store opens its own (WAL,
    synchronous=FULL), each one fdatasync of the WAL."""
    conn = apsw.Connection(str(directory / "floor.sqlite3"))
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (v INTEGER)")
        times: list[float] = []
        for i in range(samples):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE; INSERT INTO t VALUES (?); COMMIT", (i,))
            times.append(1000 * (time.perf_counter() - t0))
        return Latency.of(times)
    finally:
        conn.close()


def round_latency(directory: Path, samples: int = SAMPLES, width: int = ROUND_WIDTH) -> Latency:
    """One round of the binder's syncs: a new directory in each of `width` parents, then every
    parent fsync'd at the same time (`drivers.rollout_files.sync_together`)."""
    from drivers.rollout_files import fsync_dir, sync_together

    parents = [directory / f"p{k}" for k in range(width)]
    for parent in parents:
        parent.mkdir()
    times: list[float] = []
    for i in range(samples):
        t0 = time.perf_counter()
        for parent in parents:
            (parent / f"d{i}").mkdir()
        sync_together([lambda p=parent: fsync_dir(p) for parent in parents])  # type: ignore[misc]
        times.append(1000 * (time.perf_counter() - t0))
    return Latency.of(times)


@dataclass(frozen=True, slots=True)
class Floor:
    bare_ms: float
    store_commits: float
    worker_rounds: int
    commit: Latency
    sync_round: Latency

    @property
    def sync_ms(self) -> float:
        return self.store_commits * self.commit.p50 + self.worker_rounds * self.sync_round.p50

    @property
    def floor_ms(self) -> float:
        return self.bare_ms + self.sync_ms

    @property
    def best_ratio(self) -> float:
        return self.floor_ms / self.bare_ms

    def line(self) -> str:
        return (
            f"durability floor on this disk: {self.store_commits:g} store COMMITs ×"
            f" {self.commit.p50:.2f} ms + {self.worker_rounds} rounds of the worker's fsyncs ×"
            f" {self.sync_round.p50:.2f} ms = {self.sync_ms:.1f} ms of syncs a fork waits for in"
            f" turn, beyond the bare {self.bare_ms:.1f} ms: no host fork can beat"
            f" {self.floor_ms:.1f} ms, a ratio of {self.best_ratio:.2f}, without weakening a"
            " durability law"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "bareMs": self.bare_ms,
            "storeCommitsPerFork": self.store_commits,
            "workerSyncRounds": self.worker_rounds,
            "commitMs": self.commit.brief(),
            "syncRoundMs": self.sync_round.brief(),
            "floorMs": round(self.floor_ms, 2),
            "bestRatio": round(self.best_ratio, 2),
        }


def store_commits_on_the_fork_path(calls_per_fork: Mapping[str, Mapping[str, float]]) -> float:
    """The daemon's syncs per fork from `bench.fork_syscalls`' strace counts, less the one of
    the acknowledgement, which comes after the fork's reply."""
    daemon = calls_per_fork.get("daemon", {})
    syncs = daemon.get("fdatasync", 0.0) + daemon.get("fsync", 0.0)
    return max(0.0, round(syncs - 1, 2))


def measure(
    bare_ms: float, forks: int = 10, turns: int = 5, worker_rounds: int = WORKER_ROUNDS
) -> Floor:
    """Count the store's COMMITs of `forks` tutti-agent forks through a real daemon (strace),
    then time a COMMIT and a round of fsyncs in a fresh directory of the same filesystem."""
    from bench.fork_syscalls import measure as count_syscalls

    report = count_syscalls(forks=forks, turns=turns, warmup=2, strace=True)
    commits = store_commits_on_the_fork_path(report.calls_per_fork)
    with tempfile.TemporaryDirectory(prefix="bench-sync-floor-") as tmp:
        commit = commit_latency(Path(tmp))
        sync_round = round_latency(Path(tmp))
    return Floor(bare_ms, commits, worker_rounds, commit, sync_round)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_floor", description=__doc__)
    ap.add_argument("--bare-ms", type=float, default=8.5, help="the bare provider's fork p50")
    ap.add_argument("--forks", type=int, default=10)
    ap.add_argument("--worker-rounds", type=int, default=WORKER_ROUNDS)
    args = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms at start")
    floor = measure(args.bare_ms, forks=args.forks, worker_rounds=args.worker_rounds)
    print(floor.line())
    print(f"COMMIT {floor.commit.brief()}; round {floor.sync_round.brief()}")
    print(f"command: {sys.executable} -m bench.sync_floor", *(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
