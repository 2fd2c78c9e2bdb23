"""Benchmark: start-up recovery of the interrupted fork operations of a store of months
(issue 36 target 5), in process, as the daemon's start runs it: what is done before the ready
line, split into the commits of the `provider_accepted` leftovers made there and everything
else (the status changes of the `prepared` and `dispatching` ones, the listing), then the
commits deferred past the ready line (`actors.recovery.DeferredCommits`). Each round runs on
a fresh copy of the store in a fresh process; the figures are wall and CPU seconds and the
number of COMMITs before ready (each one fsync).

The store is `bench.months`' cached one, of the size its flags give (the same flags):

    build/venv/bin/python -m bench.recovery --scale 0.03 --sessions 11000 --turns 50000 \\
        --big-turns 10000 --operations 10000 [--rounds 3]

To compare two checkouts, copy this file into the other one's bench/ and run each from its
own root against the same `AGENTHOST_BENCH_CACHE` (the daemon start of `bench.months` measures
the same recovery end to end).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO, command_for, cpu_probe_ms, log
from bench.months import Size, cached_home

MODULE = "bench.recovery"


def probe(path: str) -> dict[str, Any]:
    """One recovery of the store at `path` (consumed) as the daemon's start runs it: wall and
    CPU before the ready line, the commits' share, then the commits deferred past it (a
    checkout without deferral commits everything before ready: its deferred part is 0)."""
    from actors import recovery
    from storage.store import Store

    bound = getattr(recovery, "COMMITS_BEFORE_READY", None)
    kwargs: dict[str, Any] = {} if bound is None else {"commit_before_ready": bound}

    store = Store.open(path)
    spent = {"wall": 0.0, "cpu": 0.0}
    commit_many = store.fork_commit.commit_fork_operations

    def timed(ops: Any) -> tuple[int, int]:
        c, t = time.process_time(), time.perf_counter()
        try:
            return commit_many(ops)
        finally:
            spent["cpu"] += time.process_time() - c
            spent["wall"] += time.perf_counter() - t

    store.fork_commit.commit_fork_operations = timed  # type: ignore[method-assign]
    commits = store.db.write_stats.commits
    c, t = time.process_time(), time.perf_counter()
    report = recovery.recover_fork_operations(store, **kwargs)
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    commits = store.db.write_stats.commits - commits
    deferred = getattr(report, "deferred", ())
    before_ready = dict(spent)  # the deferred commits below go through the same wrapper
    deferred_commits = store.db.write_stats.commits
    c, t = time.process_time(), time.perf_counter()
    if deferred:
        after = recovery.DeferredCommits(store, deferred)
        after.start()
        after.wait()
        after.close()
    deferred_cpu, deferred_wall = time.process_time() - c, time.perf_counter() - t
    deferred_commits = store.db.write_stats.commits - deferred_commits
    out = {
        "wallS": wall,
        "cpuS": cpu,
        "commitsWallS": before_ready["wall"],
        "commitsCpuS": before_ready["cpu"],
        "restWallS": wall - before_ready["wall"],
        "restCpuS": cpu - before_ready["cpu"],
        "COMMITs": commits,
        "report": [report.failed, report.unknown, report.committed, report.errors],
        "deferred": len(deferred),
        "deferredWallS": deferred_wall,
        "deferredCpuS": deferred_cpu,
        "deferredCOMMITs": deferred_commits,
    }
    store.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--scale", type=float, default=0.03)
    for dim in ("sessions", "turns", "big-turns", "operations"):
        ap.add_argument(f"--{dim}", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.probe is not None:
        print(json.dumps(probe(args.probe)))
        return 0
    counts = {
        key: value
        for key in ("sessions", "turns", "big_turns", "operations")
        if (value := getattr(args, key)) is not None
    }
    size = Size.of(args.scale).with_counts(**counts)
    home = cached_home(size)
    print(f"# start-up recovery, in process: {size.describe()}")
    print(
        "round  CPU probe ms  wall s  CPU s  commits wall s  commits CPU s  rest wall s"
        "  rest CPU s  COMMITs  failed/unknown/committed/errors  deferred  after ready wall s"
        "  after ready CPU s  after ready COMMITs"
    )
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(max(1, args.rounds)):
            copy = Path(tmp) / "store.sqlite3"
            shutil.copy(home / "store.sqlite3", copy)
            os.sync()  # the copy written back first: recovery's fsyncs do not wait behind it
            probe_ms = cpu_probe_ms()
            log(f"recovery: round {i + 1}")
            done = subprocess.run(
                [sys.executable, "-m", MODULE, "--probe", str(copy)],
                check=True,
                capture_output=True,
                text=True,
                cwd=str(REPO),
            )
            p = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"{i + 1:5d}  {probe_ms:12.1f}  {p['wallS']:6.2f}  {p['cpuS']:5.2f}"
                f"  {p['commitsWallS']:14.2f}  {p['commitsCpuS']:13.2f}  {p['restWallS']:11.2f}"
                f"  {p['restCpuS']:10.2f}  {p['COMMITs']:7d}"
                f"  {'/'.join(map(str, p['report'])):>31s}"
                f"  {p['deferred']:8d}  {p['deferredWallS']:18.2f}  {p['deferredCpuS']:17.2f}"
                f"  {p['deferredCOMMITs']:19d}"
            )
            copy.unlink()
    extra = [f"--scale={args.scale:g}", f"--rounds={args.rounds}"]
    extra += [f"--{k.replace('_', '-')}={v}" for k, v in counts.items()]
    print(f"command: {command_for(MODULE, extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
