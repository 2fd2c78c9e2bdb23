"""Probe: the daemon tree's CPU per host Turn at nanosecond resolution, for A/B runs of two
trees. `bench.turn_overhead`'s CPU per Turn comes from `/proc/PID/stat` (10 ms ticks: over a
`--quick` run's 15 Turns a step of 0.67 ms per Turn, as large as the change being asked
about). This runs the same measured window (`bench.turn_overhead.measure`: a tutti-agent
Session on the timed fake model, 20 deltas 2 ms apart, host and bare Turns interleaved) for
`N` Turns, and reads each process kind's CPU as the sum of its live threads'
`/proc/PID/task/TID/schedstat` run time (ns) and their voluntary context switches (wake-ups).
A thread that ends inside the window is not counted (a warm Turn starts none in the daemon:
`strace -f` sees no `clone` there). Prints one line:

    probe=13ms load=2.32 turns=100 | app-server=5.57ms daemon=7.08ms worker=3.40ms | cs:…

It imports `bench.*` from `PYTHONPATH`, so one copy measures any tree, old or new:

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python /path/to/bench/turn_cpu.py [N] [--by-comm]

`--by-comm` prints, before that line, each kind's run time per Turn by the kernel's thread name
(libzmq's I/O threads are `ZMQbg/IO/0`; Python's threads carry the process's name).

`--pairs M --against TREE` runs this probe in interleaved pairs (`bench.ab_pairs`: one run in
each tree a pair, the order alternating), each run by the tree's own interpreter with the tree
on `PYTHONPATH`, and prints each kind's CPU ms and wake-ups a Turn: each tree's median, the
pairs in which this tree was higher (all; by which ran first), the median pair delta, and the
command that reruns it (`--quick`: 2 pairs of 6 Turns, seconds):

    build/venv/bin/python -m bench.turn_cpu --pairs 12 --against /tmp/base-tree 60
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import bench.profile as profile
import bench.turn_overhead as turn_overhead
from bench.common import cpu_probe_ms
from bench.harness import ProcSample

BY_COMM: dict[str, float] = {}
"""With `--by-comm`: run time (s) by process kind and the kernel's thread name (`comm`: libzmq
names its threads `ZMQbg/…`; Python 3.11 leaves its own threads the process's name)."""


def task_sums(pid: int, kind: str = "") -> tuple[int, int]:
    """(run time in ns, voluntary context switches) summed over `pid`'s live threads."""
    ns = switches = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for tid in tids:
        try:
            key = None
            if kind:
                with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                    key = f"{kind}:{fh.read().strip()}"
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                run = int(fh.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                told = [ln for ln in fh if ln.startswith("voluntary_ctxt_switches")]
        except OSError:
            continue  # the thread ended between the listing and the reads: none of it counts
        ns += run
        if key is not None:
            BY_COMM[key] = BY_COMM.get(key, 0.0) + run / 1e9
        switches += sum(int(ln.split()[1]) for ln in told)
    return ns, switches


def fine_by_kind(samples: list[ProcSample]) -> dict[str, float]:
    """CPU seconds per process kind from live threads' run time, and `cs:<kind>` wake-ups."""
    out: dict[str, float] = {}
    for s in samples:
        ns, switches = task_sums(s.pid, s.kind if SPLIT[0] else "")
        out[s.kind] = out.get(s.kind, 0.0) + ns / 1e9
        out[f"cs:{s.kind}"] = out.get(f"cs:{s.kind}", 0.0) + switches
    return out


SPLIT = [False]


# One run of this probe in the tree it runs in: the file by its path, so the tree's `bench/` is
# not first on `sys.path` (its `profile.py` would shadow the standard library's).
_RUN_PROBE = """
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def probe_figures(line: str) -> dict[str, float]:
    """The probe's line as figures a Turn: `<kind> ms` and `cs:<kind>` (wake-ups)."""
    figures: dict[str, float] = {}
    for part in line.split(" | ")[1:]:
        for item in part.split():
            key, _, value = item.partition("=")
            if value.endswith("ms"):
                figures[f"{key} ms"] = float(value[:-2])
            elif key.startswith("cs:"):
                figures[key] = float(value)
    return figures


def probe_in(tree: Path, turns: int) -> Mapping[str, float]:
    """One run of this probe on `tree`'s code: its figures a Turn."""
    from bench.ab_pairs import run_in_tree

    out = run_in_tree(tree, ["-c", _RUN_PROBE, str(Path(__file__).resolve()), str(turns)])
    return probe_figures(out.strip().splitlines()[-1])


def pairs_main(argv: Sequence[str], pairs: int, against: Path, turns: int) -> int:
    from bench.ab_pairs import AGAINST, THIS, interleave, print_pairs, summary
    from bench.common import ab_trees, log

    log(f"turn CPU: {pairs} pairs of {turns} Turns")
    got = interleave(ab_trees(against), pairs, lambda tree: probe_in(tree, turns))
    kinds = sorted(got[0].figures[THIS], key=lambda k: (k.startswith("cs:"), k))
    title = f"CPU ms and wake-ups a Turn ({turns} Turns a run), {AGAINST} vs {THIS}"
    print_pairs("bench.turn_cpu", argv, [summary(title, got, kinds)])
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.turn_cpu", description=__doc__)
    ap.add_argument("turns", nargs="?", type=int, default=100, help="Turns a run")
    ap.add_argument("--by-comm", action="store_true", help="run time by thread name too")
    ap.add_argument("--pairs", type=int, default=0, help="interleaved A/B pairs with --against")
    ap.add_argument("--against", type=Path, default=None, help="the other tree (the base)")
    ap.add_argument("--quick", action="store_true", help="with --pairs: 2 pairs of 6 Turns")
    args = ap.parse_args(argv)
    if args.pairs or args.against is not None:
        if args.against is None or (args.pairs < 1 and not args.quick):
            ap.error("--pairs M and --against TREE go together")
        pairs, turns = (2, 6) if args.quick else (args.pairs, args.turns)
        return pairs_main(argv, pairs, args.against, turns)
    SPLIT[0] = args.by_comm
    turns_asked = args.turns
    samples: list[dict[str, float]] = []
    real_fine = fine_by_kind

    def fine(ps: list[ProcSample]) -> dict[str, float]:
        BY_COMM.clear()
        out = real_fine(ps)
        samples.append(dict(BY_COMM))
        return out

    profile.cpu_by_kind = fine  # TreeProfile reads the tree through this name
    probe = cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="turn-cpu-") as tmp:
        m = turn_overhead.measure("tutti-agent", Path(tmp), turns_asked, 2)
    turns = max(1, len(m["host"]))
    cpu: dict[str, float] = m["cpu"]
    ms = " ".join(
        f"{k}={1000 * v / turns:.2f}ms" for k, v in sorted(cpu.items()) if not k.startswith("cs:")
    )
    cs = " ".join(f"{k}={v / turns:.1f}" for k, v in sorted(cpu.items()) if k.startswith("cs:"))
    load = os.getloadavg()[0]
    if SPLIT[0] and len(samples) >= 2:
        a, b = samples[0], samples[-1]
        split = " ".join(
            f"{k}={1000 * (v - a.get(k, 0.0)) / turns:.2f}ms" for k, v in sorted(b.items())
        )
        print(f"by thread name: {split}", flush=True)
    print(f"probe={probe:.0f}ms load={load:.2f} turns={turns} | {ms} | {cs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
