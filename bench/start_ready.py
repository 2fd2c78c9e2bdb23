"""Benchmark: `agenthost serve` from its start to its ready line, A/B between two checkouts
(issue 36 target 5's "daemon start to ready"), interleaved: each round starts this checkout's
daemon and the other's one after the other, the order alternating, on a fresh copy of the same
home (empty, or a store given by `--store`), and prints per side the wall time to the ready
line and the daemon's CPU at it (`/proc/<pid>/stat` utime + stime: the accept shim's
re-execution keeps the pid, so both interpreters' CPU is counted).

Both checkouts' packages are byte-compiled first (`compileall`, as an install does): a source
tree run under `PYTHONDONTWRITEBYTECODE=1` otherwise compiles every module at every start,
which no installed daemon pays.

    build/venv/bin/python -m bench.start_ready --other /path/to/main-checkout [--rounds 8] \\
        [--store build/bench-cache/<months key>/store.sqlite3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import REPO, command_for, cpu_probe_ms, log
from bench.harness import byte_compile

MODULE = "bench.start_ready"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


def start_once(root: Path, store: Path | None, timeout: float = 120.0) -> tuple[float, float]:
    """(wall ms to the ready line, daemon CPU ms at it) of one `serve` of `root`'s code."""
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        (Path(tmp) / "user").mkdir()
        if store is not None:
            shutil.copy(store, home / "store.sqlite3")
        env = dict(os.environ)
        env.update(
            {"PYTHONPATH": str(root), "AGENTHOST_HOME": str(home), "HOME": str(Path(tmp) / "user")}
        )
        # The accept shim compiled once, as a user's cache keeps it (not on every fresh HOME).
        env.setdefault("AGENTHOST_NATIVE_DIR", str(REPO / "build" / "native"))
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenthost", "--home", str(home), "serve"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=tmp,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            wall = (time.perf_counter() - started) * 1000
            cpu = cpu_ms(proc.pid)
            if b'"ready"' not in line or time.perf_counter() - started > timeout:
                raise RuntimeError(f"{root}: no ready line ({line!r})")
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return wall, cpu


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.add_argument("--other", type=Path, required=True, help="the checkout to compare with")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--store", type=Path, default=None, help="a store.sqlite3 to start on")
    args = ap.parse_args(argv)
    sides = {"this": REPO, "other": args.other.resolve()}
    for root in sides.values():
        byte_compile(root)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    print(f"# serve → ready, A/B; this = {REPO}, other = {sides['other']}")
    print(f"# store: {args.store or 'empty home'}; load {load:.2f}, CPU probe {probe:.1f} ms")
    print("round  side   wall ms  CPU ms")
    for i in range(max(1, args.rounds)):
        order = ["this", "other"] if i % 2 == 0 else ["other", "this"]
        for name in order:
            log(f"start_ready: round {i + 1} {name}")
            wall, cpu = start_once(sides[name], args.store)
            results[name].append((wall, cpu))
            print(f"{i + 1:5d}  {name:5s}  {wall:7.0f}  {cpu:6.0f}")
    print(f"# after: load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms")
    print("side   median wall ms  median CPU ms  min wall ms  min CPU ms")
    for name, rows in results.items():
        walls, cpus = [w for w, _ in rows], [c for _, c in rows]
        print(
            f"{name:5s}  {statistics.median(walls):14.0f}  {statistics.median(cpus):13.0f}"
            f"  {min(walls):11.0f}  {min(cpus):10.0f}"
        )
    extra = [f"--other={args.other}", f"--rounds={args.rounds}"]
    if args.store is not None:
        extra.append(f"--store={args.store}")
    print(f"command: {command_for(MODULE, extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
