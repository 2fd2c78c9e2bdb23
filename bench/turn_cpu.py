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
"""

from __future__ import annotations

import os
import sys
import tempfile
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


def main(argv: list[str]) -> int:
    SPLIT[0] = "--by-comm" in argv
    argv = [a for a in argv if a != "--by-comm"]
    turns_asked = int(argv[0]) if argv else 100
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
