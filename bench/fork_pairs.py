"""Interleaved A/B of the worker's CPU a fork, for two trees, per provider: each sample is
`bench.fork_path`'s worker fork trace (`_trace_provider`: the real driver in process, a live
source of `--turns` Turns, `--forks` forks a side after an untimed warm-up, its sides `reuse`
and `reread` as that benchmark defines them) run by one tree's own code, and a pair is one
sample of each tree, their order alternating (`bench.ab_pairs`). Prints, per provider, each
tree's median of the samples' p50s — worker CPU ms a fork on both sides, wall ms a fork on
`reuse` (the app-server's fork: noise for the worker's code) — the pairs in which `this` was
higher and the median pair delta, then the command that reruns it:

    build/venv/bin/python -m bench.fork_pairs --against /tmp/base-tree \\
        [--provider codex] [--pairs 8] [--forks 15] [--turns 10] [--quick]

`--against` is the other tree (a checkout with `build/` linked to the shared venv); `this` is
the tree this module is in. Codex is left out where it is not installed.
`--quick`: 2 pairs of 2 forks a side on a 2-Turn source (seconds; proves it runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from bench.ab_pairs import AGAINST, THIS, interleave, print_pairs, run_in_tree, summary
from bench.common import Table, ab_trees, log

MODULE = "bench.fork_pairs"
PROVIDERS = ("tutti-agent", "codex")

# One sample, in the tree it runs in: that tree's `_trace_provider`, each side's p50s as JSON.
_SAMPLE = """
import json, statistics, sys, tempfile
from pathlib import Path
from bench.fork_path import _trace_provider
provider, forks, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with tempfile.TemporaryDirectory(prefix="fork-pairs-") as tmp:
    m = _trace_provider(provider, forks, turns, Path(tmp))
out = {}
for side in m["cpus"]:
    out[f"worker CPU ms, {side}"] = statistics.median(m["cpus"][side])
    out[f"wall ms, {side}"] = statistics.median(m["walls"][side])
print(json.dumps(out))
"""

FIGURES = ("worker CPU ms, reuse", "worker CPU ms, reread", "wall ms, reuse")


def sample(tree: Path, provider: str, forks: int, turns: int) -> Mapping[str, float]:
    """One trace of `forks` forks a side in `tree`: its figures (the last stdout line)."""
    out = run_in_tree(tree, ["-c", _SAMPLE, provider, str(forks), str(turns)])
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def providers(asked: str | None) -> list[str]:
    """The providers to pair: the one asked, or every one installed here."""
    from bench.providers import _codex_unavailable

    names = [asked] if asked else list(PROVIDERS)
    if "codex" in names and (why := _codex_unavailable()) is not None:
        log(f"codex left out: {why}")
        names.remove("codex")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.add_argument("--against", type=Path, required=True, help="the other tree (the base)")
    ap.add_argument("--provider", choices=PROVIDERS, default=None, help="one provider only")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--forks", type=int, default=15, help="timed forks a side in a sample")
    ap.add_argument("--turns", type=int, default=10, help="the source's Turns")
    ap.add_argument("--quick", action="store_true", help="2 pairs, 2 forks, 2 Turns")
    args = ap.parse_args(argv)
    pairs, forks, turns = (2, 2, 2) if args.quick else (args.pairs, args.forks, args.turns)
    trees = ab_trees(args.against)
    tables: list[Table] = []
    for provider in providers(args.provider):
        log(f"{provider}: {pairs} pairs of {forks} forks a side, a source of {turns} Turns")
        got = interleave(trees, pairs, partial(sample, provider=provider, forks=forks, turns=turns))
        tables.append(summary(f"{provider}: the worker's fork, {AGAINST} vs {THIS}", got, FIGURES))
    print_pairs(MODULE, argv, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
