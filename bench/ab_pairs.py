"""Interleaved A/B pairs of two trees, for the drivers that compare a change with its base on a
loaded machine (`bench.fork_pairs`, `bench/turn_cpu.py --pairs`): each pair runs one sample in
each tree, one after the other, the first pair `against` first, the next `this` first, and so
on, so both trees see the same load and neither always runs second. A sample is a subprocess
of the tree's own interpreter with the tree as its working directory and `PYTHONPATH`, so the
tree's own code is measured. The summary of a figure: each tree's median over the pairs, in
how many pairs `this` was higher (over all pairs, and by which tree ran first), and the median
of the pairs' differences (`this` - `against`).
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Table, log

AGAINST, THIS = "against", "this"


@dataclass(frozen=True, slots=True)
class Pair:
    """One pair: which tree ran first, and each tree's figures (name → value)."""

    first: str
    figures: Mapping[str, Mapping[str, float]]


def run_in_tree(tree: Path, args: Sequence[str], timeout: float = 1800.0) -> str:
    """`python ARGS` of the tree's own venv, in the tree, with only the tree on `PYTHONPATH`;
    its stdout (its stderr, the progress, passes through)."""
    python = tree / "build" / "venv" / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [str(python), *args],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {shlex.join(args[:2])}… exited {done.returncode}")
    return done.stdout


def interleave(
    trees: Mapping[str, Path], pairs: int, sample: Callable[[Path], Mapping[str, float]]
) -> list[Pair]:
    """`pairs` pairs of one `sample` a tree, the order alternating from pair to pair."""
    names = list(trees)
    out: list[Pair] = []
    for i in range(pairs):
        order = names if i % 2 == 0 else names[::-1]
        figures: dict[str, Mapping[str, float]] = {}
        for name in order:
            log(f"pair {i + 1} of {pairs}: {name} ({trees[name]})")
            figures[name] = sample(trees[name])
        out.append(Pair(order[0], figures))
    return out


def summary(title: str, pairs: Sequence[Pair], figures: Sequence[str]) -> Table:
    """A row a figure: each tree's median, the pairs in which `this` was higher (all; with
    `against` first; with `this` first), and the median pair difference."""
    rows = []
    for figure in figures:
        a = [p.figures[AGAINST][figure] for p in pairs]
        b = [p.figures[THIS][figure] for p in pairs]
        deltas = [y - x for x, y in zip(a, b, strict=True)]
        rows.append(
            (
                figure,
                statistics.median(a),
                statistics.median(b),
                _higher(deltas, pairs, None),
                _higher(deltas, pairs, AGAINST),
                _higher(deltas, pairs, THIS),
                f"{statistics.median(deltas):+.3f}",
            )
        )
    return Table(
        title,
        (
            "figure",
            f"{AGAINST} (median)",
            f"{THIS} (median)",
            "pairs higher",
            f"{AGAINST} first",
            f"{THIS} first",
            "median pair delta",
        ),
        tuple(rows),
    )


def _higher(deltas: Sequence[float], pairs: Sequence[Pair], first: str | None) -> str:
    """`k of n`: the pairs (all, or those `first` ran first in) in which `this` was higher."""
    picked = [d for d, p in zip(deltas, pairs, strict=True) if first in (None, p.first)]
    return f"{sum(1 for d in picked if d > 0)} of {len(picked)}"


def reproduce(module: str, argv: Sequence[str]) -> str:
    """The command that reruns the pairs: from this tree, with `--against` made absolute."""
    here = Path(__file__).resolve().parent.parent
    args = [str(Path(a).resolve()) if prev == "--against" else a for prev, a in _pairs(argv)]
    run = shlex.join(["build/venv/bin/python", "-m", module, *args])
    return f"cd {shlex.quote(str(here))} && PYTHONPATH=. {run}"


def _pairs(argv: Sequence[str]) -> list[tuple[str, str]]:
    return list(zip(["", *argv[:-1]], argv, strict=True))


def print_pairs(module: str, argv: Sequence[str], tables: Sequence[Table]) -> None:
    for table in tables:
        print(table.render(), flush=True)
        print(flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at the end", flush=True)
    print(f"command: {reproduce(module, argv)}", flush=True)
