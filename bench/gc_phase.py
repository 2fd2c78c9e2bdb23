"""The daemon's garbage collections in the mutations' phase A, tree against tree: runs
`bench.mutations` once per named tree, in the order given (interleave them: A,B,A,B), with
`bench/stall_site` stamping each collection on the clients' clock, and prints, per run, the
gen-2 collections that fell in phase A (when, how long, how many objects freed), the young
collections' count and objects freed there, and the daemon's `AGENTHOST_GC_TIMING` summary.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.gc_phase OUT main=/tmp/base cut=$TREE \\
        --order main,cut,main,cut [--quick]

An object a collection frees is cyclic garbage (reference counting frees the rest): zero means
the requests of phase A left no reference cycle behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stall import MUTATIONS, load, run_once


def _freed(row: dict[str, Any]) -> int:
    return int(str(row["detail"]).split()[1])


def summary(out: Path) -> None:
    records, rows = load(out)
    a = records["A"]
    start = min(r["t0"] for r in a)
    end = max(r["t1"] for r in a)
    mut = sorted(r["t1"] - r["t0"] for r in a if r["kind"] in MUTATIONS)
    submits = sum(1 for r in a if r["kind"] == "turn.submit")
    gcs = [r for r in rows if r["proc"].startswith("daemon") and r["kind"] == "gc"]
    old = [r for r in gcs if str(r["detail"]).startswith("gen2")]
    in_a = [r for r in old if start <= r["t0"] <= end]
    young = [r for r in gcs if r not in old and start <= r["t0"] <= end]
    print(
        f"== {out.name}: phase A {(end - start) / 1000:.1f} s, {submits} submits, mutations"
        f" p50 {mut[len(mut) // 2]:.1f} p99 {mut[min(len(mut) - 1, int(0.99 * len(mut)))]:.1f} ms"
    )
    print(
        "   gen-2 in A (+s, ms, freed): "
        + (
            ", ".join(f"+{(r['t0'] - start) / 1000:.1f} {r['ms']:.2f} {_freed(r)}" for r in in_a)
            or "none"
        )
    )
    print(
        f"   gen-0/1 in A: {len(young)}, freed {sum(_freed(r) for r in young)};"
        f" gen-2 whole run: {len(old)}, freed {sum(_freed(r) for r in old)}"
    )
    timing = out / "gc.json"
    if timing.exists():
        print(f"   AGENTHOST_GC_TIMING: {json.dumps(json.loads(timing.read_text()))}")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", type=Path, help="a folder for the runs' files")
    p.add_argument("trees", nargs="+", help="NAME=PATH of each tree")
    p.add_argument("--order", required=True, help="the names, comma-separated, run in order")
    p.add_argument("--quick", action="store_true", help="bench.mutations --quick")
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.trees)
    for i, name in enumerate(args.order.split(",")):
        out = args.out / f"{i}-{name}"
        os.environ["AGENTHOST_GC_TIMING"] = str(out / "gc.json")
        run_once(Path(trees[name]).resolve(), out, ["--quick"] if args.quick else [], 0.0)
        summary(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
