"""The durability floor of one fork on this machine's disk (issue 20, rows 1 and 3): what a
host fork must wait for beyond the bare provider's own call even if every other cost were zero.

The saga's laws make a fork wait, one after the other, for the store's fsync'd transactions
(prepared, dispatching, provider_accepted, committed: one `fdatasync` of the WAL each) and for
the worker's crash-durable copy of the child into its own home (each new directory and the
file fsync'd, seed 000 §8). `bench.fork_syscalls --strace` counts those syncs per fork; this
module times the two kinds of sync on the same filesystem — an SQLite COMMIT in WAL mode with
`synchronous=FULL`, and a `mkdir` + `fsync` of the parent directory — and multiplies:

    floor = bare p50 + daemon syncs × COMMIT p50 + worker syncs × directory-fsync p50

`floor / bare` is then the best p50 ratio a host fork can reach on this disk without weakening a
durability law (the acknowledgement's sync is not on the fork's path and is left out).

    build/venv/bin/python -m bench.sync_floor [--bare-ms 8.5] [--forks 10]
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

from bench.common import Latency

SAMPLES = 200


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


def dir_fsync_latency(directory: Path, samples: int = SAMPLES) -> Latency:
    """A new directory made durable: `mkdir`, then `fsync` of its parent — what the worker's
    binder does for every directory of a fresh child home."""
    times: list[float] = []
    for i in range(samples):
        t0 = time.perf_counter()
        (directory / f"d{i}").mkdir()
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        times.append(1000 * (time.perf_counter() - t0))
    return Latency.of(times)


@dataclass(frozen=True, slots=True)
class Floor:
    bare_ms: float
    daemon_syncs: float
    worker_syncs: float
    commit: Latency
    dir_fsync: Latency

    @property
    def sync_ms(self) -> float:
        return self.daemon_syncs * self.commit.p50 + self.worker_syncs * self.dir_fsync.p50

    @property
    def floor_ms(self) -> float:
        return self.bare_ms + self.sync_ms

    @property
    def best_ratio(self) -> float:
        return self.floor_ms / self.bare_ms

    def line(self) -> str:
        return (
            f"durability floor on this disk: {self.daemon_syncs:g} store COMMITs ×"
            f" {self.commit.p50:.2f} ms + {self.worker_syncs:g} worker fsyncs ×"
            f" {self.dir_fsync.p50:.2f} ms = {self.sync_ms:.1f} ms of syncs a fork waits for in"
            f" turn, beyond the bare {self.bare_ms:.1f} ms: no host fork can beat"
            f" {self.floor_ms:.1f} ms, a ratio of {self.best_ratio:.2f}, without weakening a"
            " durability law"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "bareMs": self.bare_ms,
            "daemonSyncsPerFork": self.daemon_syncs,
            "workerSyncsPerFork": self.worker_syncs,
            "commitMs": self.commit.brief(),
            "dirFsyncMs": self.dir_fsync.brief(),
            "floorMs": round(self.floor_ms, 2),
            "bestRatio": round(self.best_ratio, 2),
        }


def syncs_on_the_fork_path(
    calls_per_fork: Mapping[str, Mapping[str, float]],
) -> tuple[float, float]:
    """(daemon, worker) syncs per fork from `bench.fork_syscalls`' strace counts; the daemon's
    count less the one of the acknowledgement, which comes after the fork's reply."""
    daemon = calls_per_fork.get("daemon", {})
    worker = calls_per_fork.get("worker", {})
    daemon_syncs = daemon.get("fdatasync", 0.0) + daemon.get("fsync", 0.0)
    worker_syncs = worker.get("fdatasync", 0.0) + worker.get("fsync", 0.0)
    return max(0.0, round(daemon_syncs - 1, 2)), round(worker_syncs, 2)


def measure(bare_ms: float, forks: int = 10, turns: int = 5) -> Floor:
    """Count the syncs of `forks` tutti-agent forks through a real daemon (strace), then time
    each kind of sync in a fresh directory of the same temporary filesystem."""
    from bench.fork_syscalls import measure as count_syscalls

    report = count_syscalls(forks=forks, turns=turns, warmup=2, strace=True)
    daemon_syncs, worker_syncs = syncs_on_the_fork_path(report.calls_per_fork)
    with tempfile.TemporaryDirectory(prefix="bench-sync-floor-") as tmp:
        commit = commit_latency(Path(tmp))
        dir_fsync = dir_fsync_latency(Path(tmp))
    return Floor(bare_ms, daemon_syncs, worker_syncs, commit, dir_fsync)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_floor", description=__doc__)
    ap.add_argument("--bare-ms", type=float, default=8.5, help="the bare provider's fork p50")
    ap.add_argument("--forks", type=int, default=10)
    args = ap.parse_args(argv)
    floor = measure(args.bare_ms, forks=args.forks)
    print(floor.line())
    print(f"command: {sys.executable} -m bench.sync_floor", *(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
