"""The WAL checkpoint beside the mutations' COMMITs, variant against variant: runs
`bench.mutations` once per named variant, in the order given (interleave them: A,B,A,B), with
`bench/stall_site` stamping each group COMMIT, each checkpoint pass and the WAL's length, and
prints per run the mutations' p50 / p99 in phase 0 (one client) and phase A (eight), the
daemon's CPU per request, the COMMITs that overlapped a checkpoint against the others, the
checkpoints' lengths, the RESTART passes the checkpointer made with the writer baton held (how
long the writers waited on each) and the WAL's greatest length.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall_checkpoint OUT \\
        main=/tmp/base mark250=$TREE@250 mark4000=$TREE@4000 --order main,mark250,... [--quick]

`NAME=TREE@PAGES` runs TREE with the daemon's store checkpointing past PAGES WAL pages instead of
its `CHECKPOINT_PAGES` (`AGENTHOST_STALL_CHECKPOINT_PAGES`; the WAL's bound at least 16 × it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stall import MUTATIONS, _pct, load, run_once

PAGES_ENV = "AGENTHOST_STALL_CHECKPOINT_PAGES"


def _latency(records: list[dict[str, Any]], kind: str) -> str:
    ms = [r["t1"] - r["t0"] for r in records if r["kind"] == kind and r["status"] < 400]
    return f"{_pct(ms, 0.5):.1f} / {_pct(ms, 0.99):.1f}"


def _overlaps(row: dict[str, Any], spans: list[dict[str, Any]]) -> bool:
    return any(s["t0"] < row["t1"] and row["t0"] < s["t1"] for s in spans)


def summary(out: Path) -> dict[str, Any]:
    records, rows = load(out)
    daemon = [r for r in rows if r["proc"].startswith("daemon")]
    a = records["A"]
    start, end = min(r["t0"] for r in a), max(r["t1"] for r in a)
    in_a = [r for r in daemon if start <= r["t0"] <= end]
    ckpts = [r for r in in_a if r["kind"] == "wal_checkpoint"]
    restarts = [r for r in in_a if r["kind"] == "wal_restart_pass"]
    commits = [r for r in in_a if r["kind"] == "commit"]
    beside = [r["ms"] for r in commits if _overlaps(r, ckpts)]
    others = [r["ms"] for r in commits if not _overlaps(r, ckpts)]
    wal = [int(r["detail"]) for r in daemon if r["kind"] == "wal_pages"]
    text = (out / "bench.txt").read_text()
    cpu = re.findall(r"daemon CPU ([0-9.]+) ms per request", text)
    got = {
        "run": out.name,
        "phase0": {k: _latency(records["0"], k) for k in MUTATIONS},
        "phaseA": {k: _latency(a, k) for k in MUTATIONS},
        "daemonCpuMsPerRequestAlone": float(cpu[0]) if cpu else None,
        "commitsBesideCheckpoint": [len(beside), _pct(beside, 0.5), _pct(beside, 0.99)],
        "commitsOther": [len(others), _pct(others, 0.5), _pct(others, 0.99)],
        "checkpointsInA": [
            len(ckpts),
            _pct([r["ms"] for r in ckpts], 0.5),
            _pct([r["ms"] for r in ckpts], 1.0),
        ],
        "walRestartsInA": [len(restarts), _pct([r["ms"] for r in restarts], 1.0)],
        "walMaxPages": max(wal, default=0),
    }
    print(
        f"== {out.name}: phase 0 p50 / p99 ms submit {got['phase0'][MUTATIONS[0]]}, rename"
        f" {got['phase0'][MUTATIONS[1]]}; daemon CPU {got['daemonCpuMsPerRequestAlone']} ms per"
        f" request alone\n   phase A submit {got['phaseA'][MUTATIONS[0]]}, rename"
        f" {got['phaseA'][MUTATIONS[1]]}\n   phase A COMMITs beside a checkpoint n / p50 / p99"
        f" {len(beside)} / {_pct(beside, 0.5):.1f} / {_pct(beside, 0.99):.1f} ms, others"
        f" {len(others)} / {_pct(others, 0.5):.1f} / {_pct(others, 0.99):.1f}; checkpoints n /"
        f" p50 / max {len(ckpts)} / {got['checkpointsInA'][1]:.1f} /"
        f" {got['checkpointsInA'][2]:.1f} ms; RESTART passes with the baton held"
        f" {len(restarts)} (longest {got['walRestartsInA'][1]:.1f} ms); WAL at most"
        f" {got['walMaxPages']} pages"
    )
    sys.stdout.flush()
    return got


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", type=Path, help="a folder for the runs' files")
    p.add_argument("variants", nargs="+", help="NAME=TREE[@PAGES] of each variant")
    p.add_argument("--order", required=True, help="the names, comma-separated, run in order")
    p.add_argument("--quick", action="store_true", help="bench.mutations --quick")
    p.add_argument("--smoke", action="store_true", help="seconds; proves it runs (tests)")
    p.add_argument("--read", action="store_true", help="report OUT's earlier runs only")
    args = p.parse_args(argv)
    variants = dict(v.split("=", 1) for v in args.variants)
    results = []
    for i, name in enumerate(args.order.split(",")):
        out = args.out / f"{i}-{name}"
        if not args.read:
            tree, _, pages = variants[name].partition("@")
            os.environ.pop(PAGES_ENV, None)
            if pages:
                os.environ[PAGES_ENV] = pages
            mode = ["--quick", "--smoke"] if args.smoke else ["--quick"] if args.quick else []
            run_once(Path(tree).resolve(), out, mode, 0.0)
        results.append({"variant": name, **summary(out)})
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
