"""`make bench`: runs every benchmark in one process tree, prints their tables, and writes
`bench/results/<date>.json`, PNG plots beside it and `<date>.md` (the tables, for
docs/performance.md). `--quick` runs each benchmark for seconds instead of minutes.

At the end it prints issue 20's targets in one table, then issue 36's (value, limit,
met/MISSED, value/limit, what measured it, with the CPU probe and the load at its benchmark's
start; beside targets 3 and 4, information rows with no limit: the bare provider's ceiling and
the disk's write floor) and, for each missed one, the profile that bounds it
(`bench.targets`); the JSON keeps the same rows as `issue20Targets` and `issue36Targets`,
the markdown as its first sections.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import (
    checkpoint,
    fork_ceiling,
    fork_overhead,
    fork_path,
    months,
    mutations,
    overload,
    races,
    scale,
    targets,
    throughput,
    turn_checkpoints,
    turn_overhead,
    write_floor,
)
from bench.common import (
    REPO,
    BenchResult,
    Mode,
    Table,
    command_for,
    cpu_probe_ms,
    log,
    machine,
    mode_argv,
)
from bench.profile import QUIET_TIMEOUT_S, wait_until_quiet

LOADS_TITLE = (
    "1-minute load average (cores busy; CPU probe, bench.common.cpu_probe_ms, lower is faster)"
    " at each benchmark's start"
)
BENCHMARKS: tuple[tuple[str, Callable[[Mode], BenchResult]], ...] = (
    ("bench.fork_overhead", fork_overhead.run),
    ("bench.turn_overhead", turn_overhead.run),
    ("bench.mutations", mutations.run),
    ("bench.write_floor", write_floor.run),
    ("bench.races", races.run),
    ("bench.throughput", throughput.run),
    ("bench.fork_ceiling", fork_ceiling.run),
    ("bench.scale", scale.run),
    ("bench.months", months.run),
    ("bench.fork_path", fork_path.run),
    ("bench.overload", overload.run),
    ("bench.checkpoint", checkpoint.run),
    ("bench.turn_checkpoints", turn_checkpoints.run),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", action="append", default=[], help="e.g. bench.races")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    mode = Mode.SMOKE if args.smoke else Mode.QUICK if args.quick else Mode.FULL
    argv_all = mode_argv(mode)
    stamp = time.strftime("%Y-%m-%d")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = stamp if mode is Mode.FULL else f"{stamp}-{mode.value}"
    started = time.monotonic()
    results, failures = [], []
    for module, run in BENCHMARKS:
        if args.only and module not in args.only:
            continue
        # What the previous benchmark left running (its daemon tree exiting, write-back of its
        # stores) is not this one's load: start each on a quiet machine, as far as it gets.
        quiet = wait_until_quiet(timeout_s=2 * QUIET_TIMEOUT_S[mode.value])
        probe = cpu_probe_ms()
        log(
            f"running {module} ({mode.value}); {quiet:.2f} cores busy at start,"
            f" CPU probe {probe:.0f} ms"
        )
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        try:
            result = run(mode)
        except Exception as exc:  # noqa: BLE001 - report it and go on with the others
            traceback.print_exc()
            failures.append(f"{module}: {type(exc).__name__}: {exc}")
            continue
        result.seconds = time.monotonic() - t0
        result.command = command_for(module, argv_all)
        result.figures["loadAverage1mAtStart"] = round(load, 2)
        result.figures["busyCoresAtStart"] = round(quiet, 2)
        result.figures["cpuProbeMsAtStart"] = probe
        print(result.render() + "\n", flush=True)
        results.append(result)
    json_path = args.out / f"{stem}.json"
    merged = [r.to_json() for r in results]
    if args.only and json_path.exists():
        # Re-running some benchmarks keeps the others of the same day's result.
        previous = json.loads(json_path.read_text())
        rerun = {r.name for r in results}
        kept = [b for b in previous["benchmarks"] if b["name"] not in rerun]
        order = [m for m, _ in BENCHMARKS]
        merged = sorted(
            kept + merged,
            key=lambda b: order.index(b["command"].split()[2]) if b["command"] else 0,
        )
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mode": mode.value,
        "command": command_for("bench.run_all", argv_all),
        "machine": machine(),
        "seconds": round(time.monotonic() - started, 1),
        "failures": failures,
        "benchmarks": merged,
    }
    if args.only:
        doc["rerun"] = list(args.only)
    issue20 = targets.collect(merged)
    doc["issue20Targets"] = issue20
    issue36 = targets.collect(merged, targets.ISSUE36)
    doc["issue36Targets"] = issue36
    json_path.write_text(json.dumps(doc, indent=1))
    loads = ", ".join(
        f"{b['command'].split()[2] if b['command'] else b['name']} "
        f"{b['figures'].get('loadAverage1mAtStart', 'n/a')}"
        f" ({b['figures'].get('busyCoresAtStart', 'n/a')} cores busy,"
        f" CPU probe {b['figures'].get('cpuProbeMsAtStart', 'n/a')} ms)"
        for b in merged
    )
    title = f"issue 20 targets ({mode.value} run, {doc['date']})"
    bound_lines = targets.bounds(issue20)
    title36 = f"issue 36 targets ({mode.value} run, {doc['date']})"
    bound36 = targets.bounds(issue36)
    md = [f"Run {doc['date']} ({mode.value}), `{doc['command']}`, machine {doc['machine']}", ""]
    md += [f"{LOADS_TITLE}: {loads}", ""]
    md += [targets.table(issue36, title36, "issue 36").markdown(), ""]
    md += ["Measured by:", "", *targets.measured_lines(issue36), ""]
    if bound36:
        md += ["What bounds each missed target:", "", "```", *bound36, "```", ""]
    md += [targets.table(issue20, title).markdown(), ""]
    md += ["Measured by:", "", *targets.measured_lines(issue20), ""]
    if bound_lines:
        md += ["What bounds each missed target:", "", "```", *bound_lines, "```", ""]
    for b in merged:
        md += [f"### {b['name']}", "", f"`{b['command']}`", ""]
        md += [_markdown_table(t) + "\n" for t in b["tables"]]
        if b["targets"]:
            md += ["| target | value | limit | verdict |", "|---|---|---|---|"]
            md += [
                f"| {t['what']} | {t['value']} | {t['direction']} {t['limit']} | "
                f"{'met' if t['met'] else 'MISSED'} |"
                for t in b["targets"]
            ]
            md.append("")
    (args.out / f"{stem}.md").write_text("\n".join(md))
    written: list[Path] = []
    if not args.no_plots:
        try:
            from bench.plots import plot_all

            written = plot_all(doc, args.out, stem)
        except ImportError as exc:
            log(f"no plots: {exc} (install the bench extra: pip install -e '.[bench]')")
    print(targets.table(issue20, title).render(), flush=True)
    print("\nmeasured by:\n" + "\n".join(targets.measured_lines(issue20)), flush=True)
    if bound_lines:
        print("\nwhat bounds each missed target:\n" + "\n".join(bound_lines), flush=True)
    # Issue 36's targets last: the table a run ends on.
    print("\n" + targets.table(issue36, title36, "issue 36").render(), flush=True)
    print("\nmeasured by:\n" + "\n".join(targets.measured_lines(issue36)), flush=True)
    if bound36:
        print("\nwhat bounds each missed target:\n" + "\n".join(bound36), flush=True)
    print(f"\n{LOADS_TITLE}: {loads}", flush=True)
    log(f"wrote {json_path}" + "".join(f", {p.name}" for p in written))
    for failure in failures:
        log(f"FAILED {failure}")
    return 1 if failures else 0


def _markdown_table(t: dict) -> str:
    return Table(t["title"], tuple(t["columns"]), tuple(tuple(r) for r in t["rows"])).markdown()


if __name__ == "__main__":
    sys.exit(main())
