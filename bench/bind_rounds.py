"""The worker binder's durable write alone (`drivers.binder.atomic_write_all`), the part
of a fork's bind that waits for the disk: a Referenced child (its ancestor's rollout and its
own, one existing day directory, as `DirsAhead` leaves it) and a Copied child (one file). Per
write: wall and CPU p50/p90 and the rounds of syncs it waited for (`sync_together` calls,
and any fsync issued outside one, each a round of its own). A third kind, `dirs-ahead`, times
`DirsAhead(...).run()` making a fresh target home's chain (`home/sessions/YYYY/MM/DD` under an
existing `runtimes/`: `<id>` and five below it, six parents to fsync), what a fork does while the
provider forks.

With `--against TREE` (another checkout, e.g. `git archive main | tar -x -C /tmp/main`) the
same writes run from both trees' binder modules in one process, alternating which goes first
sample by sample, so a loaded machine's drift falls on both sides alike.

    build/venv/bin/python -m bench.bind_rounds [--samples 400] [--against /tmp/main]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.common import Latency, ab_trees, cpu_probe_ms

LINE = b'{"timestamp":"2026-12-02T07:00:00Z","ordinal":0,"type":"event","payload":{}}\n'
KINDS = (("referenced", 2), ("copied", 1))
DIRS_AHEAD = "dirs-ahead"


def _load(tree: Path, name: str) -> ModuleType:
    # `drivers/binder.py`; a tree from before the rollout files moved into it has them apart.
    path = tree / "drivers" / "binder.py"
    older = tree / "drivers" / "rollout_files.py"
    spec = importlib.util.spec_from_file_location(name, older if older.exists() else path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _counted(module: ModuleType) -> list[int]:
    """Count `module`'s rounds: every `sync_together` call, `fsync_dirs`' included, and every
    directory fsync issued outside one (a round of its own)."""
    calls: list[int] = []
    inside = [0]
    real: Callable[[Sequence[Callable[[], None]]], None] = module.sync_together
    real_dir: Callable[[Any], None] = module.fsync_dir

    def sync_together(fns: Sequence[Callable[[], None]]) -> None:
        calls.append(len(fns))
        inside[0] += 1
        try:
            real(fns)
        finally:
            inside[0] -= 1

    def fsync_dir(path: Any) -> None:
        if not inside[0]:
            calls.append(1)
        real_dir(path)

    setattr(module, "sync_together", sync_together)  # noqa: B010 - a module attribute
    setattr(module, "fsync_dir", fsync_dir)  # noqa: B010
    return calls


def measure(
    trees: dict[str, Path], samples: int, lines: int = 300
) -> dict[tuple[str, str], tuple[Latency, Latency, float]]:
    """(side, kind) → (wall ms, CPU ms, rounds per write)."""
    data = LINE * lines
    modules = {side: _load(tree, f"bench_binder_{side}") for side, tree in trees.items()}
    rounds = {side: _counted(m) for side, m in modules.items()}
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    counted: dict[tuple[str, str], int] = {}
    sides = list(modules)
    with tempfile.TemporaryDirectory(prefix="bench-bind-rounds-") as tmp:
        for i in range(samples):
            order = sides if i % 2 == 0 else sides[::-1]
            for kind, files in KINDS:
                for side in order:
                    day = Path(tmp, side, kind, str(i), "sessions", "2026", "12", "02")
                    day.mkdir(parents=True)
                    targets = [(day / f"rollout-{k}.jsonl", data) for k in range(files)]
                    before = len(rounds[side])
                    w0, c0 = time.perf_counter(), time.process_time()
                    modules[side].atomic_write_all(targets)
                    walls.setdefault((side, kind), []).append(1000 * (time.perf_counter() - w0))
                    cpus.setdefault((side, kind), []).append(1000 * (time.process_time() - c0))
                    counted[side, kind] = counted.get((side, kind), 0) + len(rounds[side]) - before
            for side in order:
                chain = Path(tmp, side, "runtimes", str(i), "home", "sessions", "2026", "12", "02")
                chain.parents[5].mkdir(parents=True, exist_ok=True)  # runtimes/ exists
                before = len(rounds[side])
                w0, c0 = time.perf_counter(), time.process_time()
                modules[side].DirsAhead(chain).run()
                walls.setdefault((side, DIRS_AHEAD), []).append(1000 * (time.perf_counter() - w0))
                cpus.setdefault((side, DIRS_AHEAD), []).append(1000 * (time.process_time() - c0))
                counted[side, DIRS_AHEAD] = (
                    counted.get((side, DIRS_AHEAD), 0) + len(rounds[side]) - before
                )
    return {
        key: (Latency.of(walls[key]), Latency.of(cpus[key]), counted[key] / samples)
        for key in walls
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bind_rounds", description=__doc__)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--against", type=Path, help="another tree to interleave with this one")
    args = ap.parse_args(argv)
    trees = ab_trees(args.against)
    print(f"load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms at start")
    for (side, kind), (wall, cpu, rounds) in sorted(measure(trees, args.samples).items()):
        print(
            f"{side:8} {kind:10} rounds {rounds:g}  wall p50 {wall.p50:.3f} p90 {wall.p90:.3f} ms"
            f"  CPU p50 {cpu.p50:.3f} ms  (n={wall.n})"
        )
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    print(f"command: {sys.executable} -m bench.bind_rounds", *(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
