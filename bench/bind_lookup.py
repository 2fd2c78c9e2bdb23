"""The binder's rollout lookup alone (`drivers.binder.rollout_matches`), as a source home
grows: a source home holds every child the provider forked from it, in one directory per
day, and every bind lists all of it (the exact, unique match). Per home size (children in
the day's directory): CPU p50/p90 of one lookup of a child in the middle, and of one whole
bind (`RolloutBinder.bind`: the lookups, the symlink checks, the read, the validation, the
durable copy; the process's CPU, the sync threads' included) of a small child (a 20-line
rollout) from that home into a fresh target home whose day directory exists (as the fork's
`DirsAhead` leaves it, untimed).

With `--against TREE` (another checkout) both trees' binder modules look up the same homes
in one process, alternating which goes first sample by sample, so a loaded machine's drift
falls on both sides alike.

    build/venv/bin/python -m bench.bind_lookup [--samples 300] [--sizes 1,40,160,1000] \
        [--against /tmp/main]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench.bind_rounds import _load
from bench.common import Latency, ab_trees, cpu_probe_ms


def _home(root: Path, children: int) -> tuple[Path, str]:
    """A home with `children` rollouts in today's directory, one in an older day's and one
    archived (the layout a source home has after that many forks); the id of the middle one."""
    home = root / f"home-{children}"
    day = home / "sessions" / "2026" / "12" / "03"
    day.mkdir(parents=True)
    (home / "sessions" / "2026" / "12" / "02").mkdir()
    (home / "archived_sessions").mkdir()
    ids = [str(uuid.uuid4()) for _ in range(children)]
    for tid in ids:
        (day / f"rollout-2026-12-03T12-00-00-{tid}.jsonl").write_bytes(b"{}\n")
    older = home / "sessions" / "2026" / "12" / "02"
    (older / f"rollout-2026-12-02T12-00-00-{uuid.uuid4()}.jsonl").write_bytes(b"{}\n")
    return home, ids[len(ids) // 2]


def _child(thread_id: str, lines: int) -> bytes:
    out = [{"timestamp": "t", "ordinal": 0, "type": "session_meta", "payload": {"id": thread_id}}]
    out += [
        {"timestamp": "t", "ordinal": i, "type": "event", "payload": {"text": f"line {i}"}}
        for i in range(1, lines)
    ]
    return b"".join(json.dumps(o).encode() + b"\n" for o in out)


def measure(
    trees: dict[str, Path], samples: int, sizes: Sequence[int]
) -> dict[tuple[str, int], Latency]:
    """(side, children) → CPU ms per lookup; (side + " bind", children) → CPU ms per bind."""
    modules = {side: _load(tree, f"bench_lookup_{side}") for side, tree in trees.items()}
    cpus: dict[tuple[str, int], list[float]] = {}
    sides = list(modules)
    with tempfile.TemporaryDirectory(prefix="bench-bind-lookup-") as tmp:
        homes = {n: _home(Path(tmp), n) for n in sizes}
        for n, (home, tid) in homes.items():
            answers = {side: m.rollout_matches(home, tid) for side, m in modules.items()}
            if len({tuple(a) for a in answers.values()}) != 1 or len(answers[sides[0]]) != 1:
                raise RuntimeError(f"the trees' lookups differ at {n}: {answers}")
        for i in range(samples):
            order = sides if i % 2 == 0 else sides[::-1]
            for n, (home, tid) in homes.items():
                for side in order:
                    lookup = modules[side].rollout_matches
                    c0 = time.thread_time()
                    lookup(home, tid)
                    cpus.setdefault((side, n), []).append(1000 * (time.thread_time() - c0))
        binders = {side: m.RolloutBinder() for side, m in modules.items()}
        for n, (home, _) in homes.items():
            child = str(uuid.uuid4())
            day = home / "sessions" / "2026" / "12" / "03"
            (day / f"rollout-2026-12-03T12-00-00-{child}.jsonl").write_bytes(_child(child, 20))
            for i in range(samples):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    target = Path(tmp, "targets", side, str(n), str(i), "home")
                    (target / "sessions" / "2026" / "12" / "03").mkdir(parents=True)
                    c0 = time.process_time()
                    binders[side].bind(home, target, child)
                    cpus.setdefault((f"{side} bind", n), []).append(
                        1000 * (time.process_time() - c0)
                    )
    return {key: Latency.of(values) for key, values in cpus.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bind_lookup", description=__doc__)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--sizes", default="1,40,160,1000")
    ap.add_argument("--against", type=Path, help="another tree to interleave with this one")
    args = ap.parse_args(argv)
    trees = ab_trees(args.against)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms at start")
    results = measure(trees, args.samples, sizes)
    for (side, n), cpu in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{side:8} {n:5} children  CPU p50 {cpu.p50:.3f} p90 {cpu.p90:.3f} ms  (n={cpu.n})")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    print(f"command: {sys.executable} -m bench.bind_lookup", *(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
