"""The start-up sweep of runtime folders (`actors.runtime_dirs.sweep`) alone, in-process, on a
copy of a big store (`bench.months`' cache: 100,000 Sessions): the CPU, wall and RSS growth of
one sweep in a fresh process — what a daemon's start pays — for each source tree given, run in
interleaved pairs (tree A, tree B, A, B, ...) so the machine's load falls on both alike.

The copy keeps the cache's runtimes/ (one Session folder: the big Session's), or with
`--folders N` gets N more, each an existing Session's folder (runtimes/<ws>/<session>/
with its provider home, empty): a store whose Sessions each left a folder, the sweep's "many"
branch. Owned folders are kept, so every run sees the same disk.

    build/venv/bin/python -m bench.start_sweep --home CACHE_HOME --trees BASE_TREE,. \\
        [--pairs 8] [--folders 20000] [--scratch DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import apsw

from bench.harness import WS

CHILD = r"""
import json, sys, time
from pathlib import Path
from actors import runtime_dirs
from storage.store import Store

def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

home = Path(sys.argv[1])
store = Store.open(home / "store.sqlite3")
r0, c0, w0 = rss(), time.process_time(), time.perf_counter()
runtime_dirs.sweep(store, home / "runtimes")
w1, c1, r1 = time.perf_counter(), time.process_time(), rss()
store.close()
print(json.dumps({"wall_ms": (w1 - w0) * 1000, "cpu_ms": (c1 - c0) * 1000,
                  "rss_mb": (r1 - r0) / 1e6}))
"""


def prepare(cache: Path, work: Path, folders: int) -> None:
    """A copy of the cache's store and runtimes/, with `folders` Session folders added."""
    work.mkdir(parents=True)
    for name in ("store.sqlite3", "store.sqlite3-wal"):
        if (cache / name).exists():
            shutil.copyfile(cache / name, work / name)
    shutil.copytree(cache / "runtimes", work / "runtimes", symlinks=True)
    if folders:
        conn = apsw.Connection(str(work / "store.sqlite3"))
        ids = [
            str(r[0])
            for r in conn.execute(
                "SELECT session_id FROM sessions WHERE workspace_id = ? ORDER BY session_id"
                " DESC LIMIT ?",
                (WS, folders),
            )
        ]
        conn.close()
        for sid in ids:
            (work / "runtimes" / WS / sid / "tutti-agent-home").mkdir(parents=True, exist_ok=True)


def one(tree: Path, work: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(work)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.start_sweep", description=__doc__)
    ap.add_argument("--home", type=Path, required=True, help="a bench.months cache home")
    ap.add_argument("--trees", required=True, help="comma-separated source trees (A,B)")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--folders", type=int, default=0)
    ap.add_argument("--scratch", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="start-sweep-", dir=args.scratch))
    try:
        work = scratch / "home"
        prepare(args.home, work, args.folders)
        runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
        for i in range(args.pairs):
            order = trees if i % 2 == 0 else list(reversed(trees))
            for tree in order:
                got = one(tree, work)
                runs[str(tree)].append(got)
                print(f"pair {i} {tree}: {json.dumps(got)}", flush=True)
        summary: dict[str, Any] = {"folders": args.folders, "pairs": args.pairs, "trees": {}}
        for tree, got in runs.items():
            summary["trees"][tree] = {
                k: round(statistics.median(g[k] for g in got), 2)
                for k in ("wall_ms", "cpu_ms", "rss_mb")
            }
        if len(trees) == 2:
            a, b = (runs[str(t)] for t in trees)
            pairs = list(zip(a, b, strict=True))
            summary["b_lower_cpu_pairs"] = sum(y["cpu_ms"] < x["cpu_ms"] for x, y in pairs)
            summary["b_lower_wall_pairs"] = sum(y["wall_ms"] < x["wall_ms"] for x, y in pairs)
        print(json.dumps(summary, indent=1))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
