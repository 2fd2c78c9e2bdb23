"""The durability floor of one fork on this machine's disk (issue 20, rows 1 and 3): what a
host fork must wait for beyond the bare provider's own call even if every other cost were zero.

The saga's laws make a fork wait, one after the other, for the store's fsync'd transactions
(a warm fork: dispatching and committed, one `fdatasync` of the WAL each; its prepared and
provider_accepted are lazy writes the next fsync takes to the disk, docs/design/store.md and
design/fork-saga.md "A lazy prepare"; a fork that re-attests or makes a tree fsyncs prepared
too) and for
the worker's crash-durable copy of the child into its own home (seed 000 §8). The binder issues
its fsyncs in rounds (`drivers.binder.atomic_write_all`): the syncs of a round run
together, the rounds one after the other — any child, Copied or Referenced, takes two
(`SYNC_ROUNDS`): every file's bytes, then, after the renames, their directories. The child's
new directories (a fresh target home's chain) are made durable by `DirsAhead` while the
provider forks, so they are not on the path: on a small warm fork the two rounds are one temp
file of the child's size fsynced, then its rename and one directory fsynced (design/fork-saga.md,
"The durability order"). `bench.fork_syscalls --strace` counts the store's COMMITs per fork; this
module times an SQLite COMMIT in WAL mode with `synchronous=FULL`, and exactly the binder's two
rounds for a child rollout of `CHILD_BYTES` into a fresh directory (`round_latencies`) on the
same filesystem, and adds:

    floor = bare p50 + store COMMITs × COMMIT p50 + worker rounds × round p50

where a round's p50 is that of each sample's two rounds halved (so the product is the p50 of
the bind's syncs; each round's own p50 is printed beside it). Until 2026-12-02 a round was timed
as five new directories fsynced together, the binder's widest round before `DirsAhead`: ~5× what
a warm fork's rounds take on this disk.

`floor / bare` is then the best p50 ratio a host fork can reach on this disk without weakening a
durability law (the acknowledgement's sync is not on the fork's path and is left out).

    build/venv/bin/python -m bench.sync_floor [--bare-ms 8.5] [--forks 10] [--child-bytes 8192]
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
from drivers.binder import SYNC_ROUNDS

SAMPLES = 200
WORKER_ROUNDS = SYNC_ROUNDS
"""A child's bind: every file's bytes, then the directories of their names (the binder's own
count, pinned by tests/drivers/test_binder_fsyncs)."""
CHILD_BYTES = 8192
"""A small fork child's rollout (a 5-turn tutti-agent source's child is 8,108 bytes, a
10-turn one's 15,328)."""


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


@dataclass(frozen=True, slots=True)
class Rounds:
    """The binder's two rounds, timed sample by sample: `bytes` (the temp file written and
    fsynced), `names` (renamed onto its target, its directory fsynced) and `both` (their sum
    per sample, halved: one round's share, what `Floor` multiplies by the rounds)."""

    bytes: Latency
    names: Latency
    both: Latency


def round_latencies(
    directory: Path, samples: int = SAMPLES, child_bytes: int = CHILD_BYTES
) -> Rounds:
    """The worker's syncs on a small warm fork's path, as the binder issues them
    (`drivers.binder.begin_atomic_write_all` for one file whose directory exists and is
    durable, as `DirsAhead` leaves it): each sample a fresh day directory, made durable first
    (not timed); then round 1, a temp file of `child_bytes` written and fsynced, and round 2,
    its rename onto the rollout's name and the directory's fsync."""
    from drivers.binder import fsync_dir

    data = os.urandom(child_bytes)
    first: list[float] = []
    second: list[float] = []
    for i in range(samples):
        day = directory / f"home{i}"
        day.mkdir()
        fsync_dir(directory)
        tmp = day / ".rollout.jsonl.bind.tmp"
        t0 = time.perf_counter()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        t1 = time.perf_counter()
        os.replace(tmp, day / "rollout.jsonl")
        fsync_dir(day)
        t2 = time.perf_counter()
        first.append(1000 * (t1 - t0))
        second.append(1000 * (t2 - t1))
    return Rounds(
        Latency.of(first),
        Latency.of(second),
        Latency.of((a + b) / 2 for a, b in zip(first, second, strict=True)),
    )


def compare_models(directory: Path, samples: int = SAMPLES) -> dict[str, Latency]:
    """Sample by sample, interleaved: a one-row COMMIT, the round this floor timed until
    2026-12-02 (a new directory in each of five parents, the five fsynced together), and the
    binder's two rounds as `round_latencies` times them. For the record of what changed."""
    from drivers.binder import fsync_dir, sync_together

    conn = apsw.Connection(str(directory / "compare.sqlite3"))
    parents = [directory / f"p{k}" for k in range(5)]
    for parent in parents:
        parent.mkdir()
    times: dict[str, list[float]] = {"commit": [], "fiveDirs": [], "bytes": [], "names": []}
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (v INTEGER)")
        for i in range(samples):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE; INSERT INTO t VALUES (?); COMMIT", (i,))
            t1 = time.perf_counter()
            for parent in parents:
                (parent / f"d{i}").mkdir()
            sync_together([lambda p=parent: fsync_dir(p) for parent in parents])  # type: ignore[misc]
            t2 = time.perf_counter()
            (directory / f"r{i}").mkdir()
            rounds = round_latencies(directory / f"r{i}", samples=1)
            times["commit"].append(1000 * (t1 - t0))
            times["fiveDirs"].append(1000 * (t2 - t1))
            times["bytes"].append(rounds.bytes.p50)
            times["names"].append(rounds.names.p50)
    finally:
        conn.close()
    return {k: Latency.of(v) for k, v in times.items()}


@dataclass(frozen=True, slots=True)
class Floor:
    bare_ms: float
    store_commits: float
    worker_rounds: int
    commit: Latency
    sync_round: Latency
    """One round's share of the binder's syncs (`Rounds.both`)."""
    rounds: Rounds | None = None

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
            f" {self.sync_round.p50:.2f} ms{self._rounds_note()} = {self.sync_ms:.1f} ms of syncs"
            f" a fork waits for in turn, beyond the bare {self.bare_ms:.1f} ms: no host fork can"
            f" beat {self.floor_ms:.1f} ms, a ratio of {self.best_ratio:.2f}, without weakening a"
            " durability law"
        )

    def _rounds_note(self) -> str:
        if self.rounds is None:
            return ""
        return (
            f" (the child's bytes {self.rounds.bytes.p50:.2f},"
            f" its name {self.rounds.names.p50:.2f} ms p50)"
        )

    def to_json(self) -> dict[str, object]:
        rounds = self.rounds
        return {
            "bareMs": self.bare_ms,
            "storeCommitsPerFork": self.store_commits,
            "workerSyncRounds": self.worker_rounds,
            "commitMs": self.commit.brief(),
            "syncRoundMs": self.sync_round.brief(),
            "bytesRoundMs": None if rounds is None else rounds.bytes.brief(),
            "namesRoundMs": None if rounds is None else rounds.names.brief(),
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
    bare_ms: float, forks: int = 10, turns: int = 5, child_bytes: int = CHILD_BYTES
) -> Floor:
    """Count the store's COMMITs of `forks` tutti-agent forks through a real daemon (strace),
    then time a COMMIT and the binder's two rounds in a fresh directory of the same
    filesystem."""
    from bench.fork_syscalls import measure as count_syscalls

    report = count_syscalls(forks=forks, turns=turns, warmup=2, strace=True)
    commits = store_commits_on_the_fork_path(report.calls_per_fork)
    with tempfile.TemporaryDirectory(prefix="bench-sync-floor-") as tmp:
        commit = commit_latency(Path(tmp))
        rounds = round_latencies(Path(tmp), child_bytes=child_bytes)
    return Floor(bare_ms, commits, WORKER_ROUNDS, commit, rounds.both, rounds)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_floor", description=__doc__)
    ap.add_argument("--bare-ms", type=float, default=8.5, help="the bare provider's fork p50")
    ap.add_argument("--forks", type=int, default=10)
    ap.add_argument("--child-bytes", type=int, default=CHILD_BYTES)
    ap.add_argument(
        "--compare-models",
        action="store_true",
        help="only time, interleaved, a COMMIT, the former five-directory round and the"
        " binder's two rounds (no daemon, no strace)",
    )
    args = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms at start")
    if args.compare_models:
        with tempfile.TemporaryDirectory(prefix="bench-sync-floor-") as tmp:
            for name, lat in compare_models(Path(tmp)).items():
                print(f"{name:9} p50 {lat.p50:.3f}  p90 {lat.p90:.3f} ms  (n={lat.n})")
        print(f"load {os.getloadavg()[0]:.2f} at the end")
        return 0
    floor = measure(args.bare_ms, forks=args.forks, child_bytes=args.child_bytes)
    print(floor.line())
    print(f"COMMIT {floor.commit.brief()}; round {floor.sync_round.brief()}")
    print(f"command: {sys.executable} -m bench.sync_floor", *(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
