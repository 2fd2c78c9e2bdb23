"""The read pool's work per request of `bench.mutations` (phase 0, A and B), by read method:
`bench.mutations` run with `bench/readprof_site` in the daemon (see its docstring).

    PYTHONPATH=$TREE build/venv/bin/python -m bench.read_profile [--profile] [--smoke] [--keep DIR]

Without `--profile`: per method the jobs, thread CPU, statements, rows, JSON values decoded and
reply bytes per job (counts do not depend on the machine's load; the CPU does). With
`--profile`: each pool thread under cProfile, the functions by own and cumulative time.
"""

from __future__ import annotations

import argparse
import json
import pstats
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.mutation_stages import print_start, run_mutations

SITE = Path(__file__).resolve().parent / "readprof_site"


def report(folder: Path, top: int = 30) -> list[str]:
    lines: list[str] = []
    for path in sorted(folder.glob("read-*.json")):
        got = json.loads(path.read_text())
        lines.append(f"mode {got['mode']}; per job of the read pool, by method:")
        lines.append(
            f"  {'method':<22} {'jobs':>6} {'cpu ms':>7} {'stmts':>6} {'rows':>6}"
            f" {'loads':>6} {'bytes':>7}"
        )
        for method, c in sorted(got["methods"].items(), key=lambda kv: -kv[1].get("jobs", 0)):
            n = c.get("jobs", 0) or 1
            lines.append(
                f"  {method:<22} {int(n):>6} {c.get('cpu_ms', 0) / n:>7.3f}"
                f" {c.get('statements', 0) / n:>6.2f} {c.get('rows', 0) / n:>6.1f}"
                f" {c.get('json_loads', 0) / n:>6.1f} {c.get('reply_bytes', 0) / n:>7.0f}"
            )
    profs = sorted(folder.glob("prof-*.pstats"))
    if profs:
        stats = pstats.Stats(str(profs[0]))
        for p in profs[1:]:
            stats.add(str(p))
        for key in ("tottime", "cumulative"):
            stats.sort_stats(key)
            lines.append(f"functions by {key}:")
            for func in stats.fcn_list[:top]:  # type: ignore[attr-defined]
                cc, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
                name = f"{Path(func[0]).parent.name}/{Path(func[0]).name}:{func[1]}({func[2]})"
                lines.append(
                    f"  {nc:>8} calls {tt * 1000:>9.1f} own {ct * 1000:>9.1f} cum ms  {name}"
                )
    return lines


def run(folder: Path, mode: str, profile: bool) -> None:
    run_mutations(
        SITE,
        folder,
        mode,
        {
            "AGENTHOST_READ_PROFILE": str(folder),
            "AGENTHOST_READ_PROFILE_MODE": "profile" if profile else "count",
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", action="store_true", help="cProfile each pool thread")
    parser.add_argument("--smoke", action="store_true", help="seconds; proves it runs")
    parser.add_argument("--keep", type=Path, help="keep the run's files in this folder")
    parser.add_argument("--read", type=Path, help="report an earlier run's folder")
    args = parser.parse_args(argv)
    if args.read is not None:
        print("\n".join(report(args.read)))
        return 0
    with tempfile.TemporaryDirectory(prefix="read-profile-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print_start()
        run(folder, "smoke" if args.smoke else "quick", args.profile)
        print("\n".join(report(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
