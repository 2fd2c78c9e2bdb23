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

Codex's floor is its own (`measure_codex`), counted and sized through a real Codex daemon in
the same run: the same four syncs, its round 1 holding its own child's bytes (a Codex 0.171
child is Referenced: ~22 KB of `session_meta` and its few lines). What its bind issues beyond
that in round 1 — the source's rollout copied as the child's ancestor, the fresh target home's
directory chain — is timed and printed (`Rounds` `issued`), not counted: both are known before
`thread/fork` (the source is fenced and settled, its rollout unchanged by the fork), so no law
puts them after the provider's answer (design/fork-saga.md, "The durability order").

    build/venv/bin/python -m bench.sync_floor [--bare-ms 8.5] [--forks 10] [--child-bytes 8192]
        [--codex]
"""

from __future__ import annotations

import argparse
import os
import re
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

    @classmethod
    def of(cls, first: list[float], second: list[float]) -> Rounds:
        """From each sample's two rounds, ms."""
        halves = ((a + b) / 2 for a, b in zip(first, second, strict=True))
        return cls(Latency.of(first), Latency.of(second), Latency.of(halves))


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
    return Rounds.of(first, second)


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
    provider: str = "tutti-agent"
    """Whose forks the COMMITs were counted of and the child's bytes sized from."""
    child_bytes: int = CHILD_BYTES
    issued: Rounds | None = None
    """The bind's two rounds as it issues them, where it issues more than the floor counts
    (Codex: the ancestor's bytes and the new directories beside the child's); not counted."""
    counted: CodexSyncs | None = None
    """Codex's syncs and sizes a fork as counted through its daemon (`count_codex_syncs`)."""

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
            f"{self.provider} durability floor on this disk: {self.store_commits:g} store"
            " COMMITs ×"
            f" {self.commit.p50:.2f} ms + {self.worker_rounds} rounds of the worker's fsyncs ×"
            f" {self.sync_round.p50:.2f} ms{self._rounds_note()} = {self.sync_ms:.1f} ms of syncs"
            f" a fork waits for in turn, beyond the bare {self.bare_ms:.1f} ms: no host fork can"
            f" beat {self.floor_ms:.1f} ms, a ratio of {self.best_ratio:.2f}, without weakening a"
            " durability law"
        )

    def _rounds_note(self) -> str:
        if self.rounds is None:
            return ""
        note = (
            f" (the child's bytes {self.rounds.bytes.p50:.2f},"
            f" its name {self.rounds.names.p50:.2f} ms p50, a child of {self.child_bytes:,} bytes"
        )
        if self.issued is not None:
            note += (
                f"; as the bind issues them, the ancestor and the new directories too:"
                f" {self.issued.bytes.p50:.2f} + {self.issued.names.p50:.2f} ms, not counted"
            )
        return note + ")"

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
            "provider": self.provider,
            "childBytes": self.child_bytes,
            "issuedBytesRoundMs": None if self.issued is None else self.issued.bytes.brief(),
            "issuedNamesRoundMs": None if self.issued is None else self.issued.names.brief(),
            "countedPerFork": None if self.counted is None else self.counted.to_json(),
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


def issued_round_latencies(
    directory: Path, files: Sequence[int], new_dirs: int, samples: int = SAMPLES
) -> Rounds:
    """The bind's two rounds as `drivers.binder.begin_atomic_write_all` issues them for
    `files` (their sizes, all in one directory, as a Codex child and its ancestor are) below a
    chain of `new_dirs` directories it creates: round 1 the chain made, the temp files written,
    all fsynced with every created directory's parent; round 2 the renames and the names'
    directory fsynced."""
    from drivers.binder import begin_atomic_write_all

    data = [os.urandom(size) for size in files]
    first: list[float] = []
    second: list[float] = []
    for i in range(samples):
        leaf = directory / f"issued{i}"
        for k in range(max(0, new_dirs - 1)):
            leaf = leaf / f"d{k}"
        writes = [(leaf / f"rollout-{k}.jsonl", body) for k, body in enumerate(data)]
        t0 = time.perf_counter()
        names = begin_atomic_write_all(writes)
        t1 = time.perf_counter()
        names.wait()
        t2 = time.perf_counter()
        first.append(1000 * (t1 - t0))
        second.append(1000 * (t2 - t1))
    return Rounds.of(first, second)


_SYNC_CALL = re.compile(r"^\d+\s+(fsync|fdatasync)\(\d+<([^>]*)>")
"""A sync's call in a `strace -f -y` log (a call `<unfinished ...>` counted once, its
`resumed` line not)."""


@dataclass(frozen=True, slots=True)
class CodexSyncs:
    """A Codex fork's syncs through a real daemon, per fork (`strace -f -y`): the daemon's
    (its store's COMMITs and the acknowledgement's), the worker's fsyncs of files (the bind's
    temp files) and of directories, and the bound rollouts' sizes (medians over the forks'
    target homes): the child's own and the ancestor's, the source's rollout copied with it."""

    daemon_syncs: float
    file_syncs: float
    dir_syncs: float
    child_bytes: int
    ancestor_bytes: int

    def to_json(self) -> dict[str, object]:
        return {
            "daemonSyncs": self.daemon_syncs,
            "workerFileSyncs": self.file_syncs,
            "workerDirSyncs": self.dir_syncs,
            "childBytes": self.child_bytes,
            "ancestorBytes": self.ancestor_bytes,
        }

    @property
    def store_commits(self) -> float:
        """Less the acknowledgement's, after the fork's reply (`store_commits_on_the_fork_path`)."""
        return max(0.0, round(self.daemon_syncs - 1, 2))

    @property
    def new_dirs(self) -> int:
        """The directories the bind created a fork (their parents fsynced in round 1): every
        directory fsync but the names' one of round 2."""
        return max(0, round(self.dir_syncs) - 1)


def _count_syncs(log: Path) -> tuple[int, int]:
    """(fsyncs of the bind's temp files, other fsyncs and fdatasyncs) in one `-f -y` log."""
    files = others = 0
    for line in log.read_text(errors="replace").splitlines():
        match = _SYNC_CALL.match(line)
        if match is None:
            continue
        if match.group(2).endswith(".tmp"):
            files += 1
        else:
            others += 1
    return files, others


def _bound_sizes(runtimes: Path) -> tuple[int, int]:
    """(child, ancestor) rollout sizes, medians over the target homes holding both: the child's
    first line names its parent (`forked_from_id`), the ancestor's does not."""
    import json
    import statistics

    children: list[int] = []
    ancestors: list[int] = []
    for home in runtimes.glob("*/*/codex-home"):
        found = sorted(home.rglob("rollout-*.jsonl"))
        if len(found) != 2:
            continue
        for path in found:
            with path.open("rb") as fh:
                meta = json.loads(fh.readline()).get("payload") or {}
            (children if meta.get("forked_from_id") else ancestors).append(path.stat().st_size)
    if not children or not ancestors:
        raise RuntimeError(f"no bound Codex child found under {runtimes}")
    return int(statistics.median(children)), int(statistics.median(ancestors))


def count_codex_syncs(forks: int = 10, turns: int = 5, warmup: int = 2) -> CodexSyncs:
    """Fork a `turns`-Turn Codex source `forks` times through a real daemon (the fake model its
    only fake part), `strace -f -y` on the daemon and the Codex worker counting their syncs."""
    import shutil
    import signal
    import subprocess

    from bench.fork_syscalls import _pids_by_kind
    from bench.harness import (
        BenchDaemon,
        acknowledge,
        create_session,
        fork_until_terminal,
        last_settled_turn,
        run_turn,
    )
    from bench.providers import provider

    tool = shutil.which("strace")
    if tool is None:
        raise RuntimeError("strace is not installed")
    entry = provider("codex")
    with (
        entry.environment() as config,
        tempfile.TemporaryDirectory(prefix="sync-floor-codex-") as tmp_text,
    ):
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home", providers={"codex": config}).start()
        tracers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        try:
            c = daemon.client()
            sid = create_session(c, "sync-floor", provider="codex")
            for i in range(turns):
                run_turn(c, sid, f"turn {i}")
            boundary = last_settled_turn(c, sid)
            for _ in range(warmup):
                acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
            kinds = _pids_by_kind(daemon.pid)
            # The Codex worker: the one whose child is the app-server.
            app_servers = {s for s in kinds.get("app-server", [])}
            workers = [
                pid
                for pid in kinds.get("worker", [])
                if any(_parent(a) == pid for a in app_servers)
            ]
            for kind, pids in (("daemon", kinds.get("daemon", [])), ("worker", workers)):
                for pid in pids:
                    out = tmp / f"{kind}-{pid}.log"
                    cmd = [tool, "-f", "-y", "-e", "trace=fsync,fdatasync", "-o", str(out)]
                    proc = subprocess.Popen([*cmd, "-p", str(pid)], stderr=subprocess.DEVNULL)
                    tracers.append((kind, proc, out))
            _wait_attached([out for _, _, out in tracers])
            for _ in range(forks):
                op = fork_until_terminal(c, sid, boundary)
                if op["status"] != "committed":
                    raise RuntimeError(f"fork did not commit: {op}")
                acknowledge(c, op["operationId"])
            for _, proc, _ in tracers:
                proc.send_signal(signal.SIGINT)
            for _, proc, _ in tracers:
                proc.wait(30)
            daemon_syncs = file_syncs = dir_syncs = 0
            for kind, _, out in tracers:
                files, others = _count_syncs(out)
                if kind == "daemon":
                    daemon_syncs += files + others
                else:
                    file_syncs += files
                    dir_syncs += others
            child, ancestor = _bound_sizes(daemon.home / "runtimes")
        finally:
            for _, proc, _ in tracers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            daemon.stop()
    return CodexSyncs(
        round(daemon_syncs / forks, 2),
        round(file_syncs / forks, 2),
        round(dir_syncs / forks, 2),
        child,
        ancestor,
    )


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def _wait_attached(logs: Sequence[Path], timeout: float = 5.0) -> None:
    """Until every tracer has written its log's first bytes (it opens the log on attaching;
    a traced thread's first sync follows), at most `timeout`: then a second for the rest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(log.exists() for log in logs):
        time.sleep(0.01)
    time.sleep(1.0)


def _codex_rounds(
    directory: Path, syncs: CodexSyncs, samples: int = SAMPLES
) -> tuple[Rounds, Rounds]:
    """The child's two rounds (`round_latencies`) and the bind's as issued
    (`issued_round_latencies`), one sample of each in turn: a busy minute slows both alike."""
    taken: list[Rounds] = []
    issued: list[Rounds] = []
    files = (syncs.child_bytes, syncs.ancestor_bytes)
    for i in range(samples):
        sample = directory / f"sample{i}"
        sample.mkdir()
        taken.append(round_latencies(sample, samples=1, child_bytes=syncs.child_bytes))
        issued.append(issued_round_latencies(sample, files, syncs.new_dirs, samples=1))
    return _joined(taken), _joined(issued)


def _joined(samples: Sequence[Rounds]) -> Rounds:
    return Rounds(
        Latency.of(r.bytes.p50 for r in samples),
        Latency.of(r.names.p50 for r in samples),
        Latency.of(r.both.p50 for r in samples),
    )


def measure_codex(bare_ms: float, forks: int = 10, turns: int = 5) -> Floor:
    """Codex's own floor: its forks' store COMMITs counted and its bound child sized through a
    real Codex daemon (`count_codex_syncs`), then a COMMIT and the binder's two rounds for a
    child of that size timed; its bind's rounds as issued (the ancestor's bytes and the new
    directories beside the child's) timed beside them, not counted."""
    syncs = count_codex_syncs(forks=forks, turns=turns)
    with tempfile.TemporaryDirectory(prefix="bench-sync-floor-") as tmp:
        commit = commit_latency(Path(tmp))
        rounds, issued = _codex_rounds(Path(tmp), syncs)
    return Floor(
        bare_ms,
        syncs.store_commits,
        WORKER_ROUNDS,
        commit,
        rounds.both,
        rounds,
        provider="codex",
        child_bytes=syncs.child_bytes,
        issued=issued,
        counted=syncs,
    )


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
    ap.add_argument(
        "--codex",
        action="store_true",
        help="Codex's own floor: its syncs counted and its child sized through a Codex daemon",
    )
    args = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms at start")
    if args.codex:
        codex = measure_codex(args.bare_ms, forks=args.forks)
        print(f"codex a fork: {codex.counted}")
        print(codex.line())
        print(f"command: {sys.executable} -m bench.sync_floor", *(argv or sys.argv[1:]))
        return 0
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
