"""Where a mutation's time goes in `bench.mutations`' phase A, stage by stage: the benchmark
run with `bench/stages_site` stamping the daemon (see its docstring), each request's stamps
joined to the client's own `t0`/`t1` by its wire id, and p50 / p99 of every stage printed per
mutation, with each stage's mean over the slowest 2 % (where the p99's time goes).

    PYTHONPATH=$TREE build/venv/bin/python -m bench.mutation_stages [--full|--smoke] [--keep DIR]
    PYTHONPATH=$TREE build/venv/bin/python -m bench.mutation_stages --read DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Latency, cpu_probe_ms

SITE = Path(__file__).resolve().parent / "stages_site"
MUTATIONS = ("turn.submit", "session.updateTitle")
STAGES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("client → loop", ("t0",), ("recv",)),
    ("decode", ("recv",), ("decoded",)),
    ("dispatch", ("decoded",), ("dispatched",)),
    ("lane / actor queue", ("dispatched",), ("lane", "actor")),
    ("before the store", ("lane", "actor"), ("store_in",)),
    ("baton wait", ("store_in",), ("body_in",)),
    ("body", ("body_in",), ("body_out",)),
    ("COMMIT wait", ("body_out",), ("notify_in",)),
    ("events", ("notify_in",), ("store_out",)),
    ("store → reply", ("store_out",), ("reply",)),
    ("reply → sent", ("reply",), ("sent",)),
    ("sent → client", ("sent",), ("t1",)),
    ("store → client", ("store_out",), ("t1",)),
)
"""(name, start stamps, end stamps): the first of each present. `sent` is stamped once the send
returned, the interpreter taken back after it: "store → client" is the reply's whole way."""


def _at(stamps: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in stamps:
            return stamps[name]
    return None


def report(folder: Path) -> list[str]:
    records = json.loads((folder / "records.json").read_text())["A"]
    stamps: dict[str, dict[str, float]] = {}
    commits: list[list[float]] = []
    holds: list[list[Any]] = []
    for path in sorted(folder.glob("stages-*.json")):
        got = json.loads(path.read_text())
        stamps.update(got["stamps"])
        commits.extend(got["commits"])
        holds.extend(got.get("holds", []))
    holds.sort(key=lambda h: h[0])
    lines: list[str] = []
    for kind in MUTATIONS:
        rows = []
        for r in records:
            if r["kind"] != kind or r["status"] >= 400 or r.get("id") not in stamps:
                continue
            rows.append({**stamps[r["id"]], "t0": r["t0"], "t1": r["t1"]})
        if not rows:
            lines.append(f"{kind}: no stamped request")
            continue
        rows.sort(key=lambda s: s["t1"] - s["t0"])
        tail = rows[-max(1, len(rows) // 50) :]
        total = Latency.of(s["t1"] - s["t0"] for s in rows)
        owners = sum(1 for s in rows if s.get("owner") == 1.0)
        tail_ms = sum(s["t1"] - s["t0"] for s in tail) / len(tail)
        lines.append(
            f"{kind}: {len(rows)} requests, total p50 / p99 {total.p50:.2f} / {total.p99:.2f} ms;"
            f" slowest 2 % ({len(tail)}) mean {tail_ms:.1f}"
            f" ms; ran its own body {owners}/{len(rows)}; reply sent off the transport loop"
            f" {sum(1 for s in rows if s.get('direct') == 1.0)}/{len(rows)}"
        )
        lines.append(f"  {'stage':<20} {'n':>5} {'p50':>7} {'p99':>7} {'tail mean':>9}")
        for name, start, end in STAGES:
            spans = []
            for s in rows:
                a, b = _at(s, start), _at(s, end)
                if a is not None and b is not None:
                    spans.append(b - a)
            tail_spans = [
                b - a
                for s in tail
                if (a := _at(s, start)) is not None and (b := _at(s, end)) is not None
            ]
            if not spans:
                continue
            lat = Latency.of(spans)
            tail_mean = sum(tail_spans) / len(tail_spans) if tail_spans else float("nan")
            lines.append(
                f"  {name:<20} {lat.n:>5} {lat.p50:>7.2f} {lat.p99:>7.2f} {tail_mean:>9.2f}"
            )
        for s in tail[-4:]:
            a, b = s.get("store_in"), s.get("body_in")
            if a is None or b is None:
                continue
            ahead = [h for h in holds if h[1] > a and h[0] < b]
            lines.append(
                f"  {s['t1'] - s['t0']:.1f} ms request, baton wait {b - a:.1f} ms behind"
                f" {len(ahead)} holds: "
                + ", ".join(
                    f"{h[3]} {h[1] - h[0]:.1f}" + (f"+{h[4]}" if h[4] else "") for h in ahead[:14]
                )
            )
    if records:
        start, end = min(r["t0"] for r in records), max(r["t1"] for r in records)
        inside = [c for c in commits if start <= c[0] <= end]
        lat = Latency.of(c[1] for c in inside)
        members = sum(c[2] for c in inside) / max(1, len(inside))
        lines.append(
            f"group COMMITs in phase A: {len(inside)}, p50 / p99 {lat.p50:.2f} / {lat.p99:.2f} ms,"
            f" {members:.2f} members each"
        )
        cpu: list[list[Any]] = []
        for path in sorted(folder.glob("stages-*.json")):
            cpu.extend(json.loads(path.read_text()).get("cpu", []))
        before = [c for c in cpu if c[0] <= start]
        after = [c for c in cpu if c[0] >= end]
        if before and after:
            first, last = before[-1], after[0]
            spent = {k: v - first[1].get(k, 0.0) for k, v in last[1].items()}
            span = last[0] - first[0]
            n = sum(1 for r in records if r["kind"] in MUTATIONS)
            lines.append(
                f"daemon CPU by thread over phase A ({span / 1000:.1f} s, {n} mutations):"
                f" {sum(spent.values()) / span:.2f} cores; ms per mutation: "
                + ", ".join(
                    f"{k} {v / max(1, n):.2f}"
                    for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
                    if v > 0
                )
            )
        by: dict[str, list[list[Any]]] = {}
        for h in holds:
            if start <= h[0] <= end:
                by.setdefault(h[3], []).append(h)
        lines.append(
            "baton holds in phase A by writer (n, p50 / p99 / max ms; then p50s of the holder's"
            " CPU, the COMMIT's wall and CPU, and the rest: waits for the interpreter or a CPU)"
        )
        for label, held in sorted(by.items(), key=lambda kv: -sum(h[1] - h[0] for h in kv[1])):
            spans = [h[1] - h[0] for h in held]
            lat = Latency.of(spans)
            line = (
                f"  {label:<28} {lat.n:>5} {lat.p50:>6.2f} / {lat.p99:>6.2f} / {max(spans):>6.1f}"
                f"  total {sum(spans):.0f}"
            )
            if all(len(h) >= 8 for h in held):
                cpu, cwall, ccpu = (Latency.of(h[i] for h in held).p50 for i in (5, 6, 7))
                rest = Latency.of(h[1] - h[0] - h[5] - (h[6] - h[7]) for h in held)
                line += (
                    f"; cpu {cpu:.2f}, COMMIT {cwall:.2f} (cpu {ccpu:.2f}),"
                    f" rest {rest.p50:.2f} / {rest.p99:.2f}"
                )
            lines.append(line)
        items: list[list[Any]] = []
        for path in sorted(folder.glob("stages-*.json")):
            items.extend(json.loads(path.read_text()).get("items", []))
        by_what: dict[str, list[list[Any]]] = {}
        for it in items:
            by_what.setdefault(str(it[0]).split(" ")[-1], []).append(it)
        if by_what:
            lines.append(
                "a Turn's writes (batched or alone) by kind (n, wall p50 / p99, CPU p50 / p99 ms):"
            )
            for what, got in sorted(by_what.items(), key=lambda kv: -len(kv[1])):
                wall, cpu = Latency.of(g[1] for g in got), Latency.of(g[2] for g in got)
                lines.append(
                    f"  {what:<28} {wall.n:>5} {wall.p50:>6.2f} / {wall.p99:>6.2f}"
                    f"  {cpu.p50:>6.2f} / {cpu.p99:>6.2f}"
                )
        lines.extend(_hold_calls(folder))
    return lines


def _hold_calls(folder: Path, top: int = 30) -> list[str]:
    """With `AGENTHOST_STAGES_HOLD_CALLS=1` (every phase, not phase A alone): per writer, the
    Python and C calls its holds made while holding the baton, per hold, and the most made."""
    got: dict[str, list[Any]] = {}
    for path in sorted(folder.glob("stages-*.json")):
        for label, (holds, calls) in json.loads(path.read_text()).get("hold_calls", {}).items():
            mine = got.setdefault(label, [0, {}])
            mine[0] += holds
            for key, n in calls.items():
                if not key.startswith("sitecustomize.py:"):
                    mine[1][key] = mine[1].get(key, 0) + n
    if not got:
        return []
    lines = ["calls made while holding the baton, by writer (every phase; per hold):"]
    for label, (holds, calls) in sorted(got.items(), key=lambda kv: -kv[1][0]):
        py = sum(n for k, n in calls.items() if not k.startswith("C:"))
        c = sum(n for k, n in calls.items() if k.startswith("C:"))
        lines.append(f"  {label}: {holds} holds, {py / holds:.1f} Python + {c / holds:.1f} C calls")
        for key, n in sorted(calls.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {n / holds:8.2f}  {key}")
    return lines


def run_mutations(site: Path, folder: Path, mode: str, extra: dict[str, str]) -> None:
    """`bench.mutations` (`full`, `quick` or `smoke`) in a fresh process with the `site`
    folder's `sitecustomize` loaded and `extra` in its environment; its output in
    `folder/mutations.log`."""
    tree = Path(__file__).resolve().parent.parent
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join((str(site), str(tree), os.environ.get("PYTHONPATH", "")))
    cmd = [sys.executable, "-m", "bench.mutations", *([] if mode == "full" else [f"--{mode}"])]
    with open(folder / "mutations.log", "w") as f:
        subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT, check=True)


def print_start() -> None:
    """The run's start line: UTC time, the 1-minute load and the CPU probe."""
    started = time.strftime("%H:%M:%S", time.gmtime())
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    print(f"start {started} UTC, load {load:.2f}, cpu probe {probe:.1f} ms")


def run(folder: Path, mode: str) -> None:
    run_mutations(
        SITE,
        folder,
        mode,
        {
            "AGENTHOST_MUTATION_STAGES": str(folder),
            "BENCH_MUTATIONS_RECORDS": str(folder / "records.json"),
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="the full-size phase A (20 s)")
    parser.add_argument("--smoke", action="store_true", help="seconds; proves it runs (tests)")
    parser.add_argument("--keep", type=Path, help="keep the run's files in this folder")
    parser.add_argument("--read", type=Path, help="report an earlier run's folder")
    args = parser.parse_args(argv)
    if args.read is not None:
        print("\n".join(report(args.read)))
        return 0
    with tempfile.TemporaryDirectory(prefix="mutation-stages-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print_start()
        run(folder, "full" if args.full else "smoke" if args.smoke else "quick")
        print("\n".join(report(folder)))
        summary: dict[str, Any] = {"folder": str(folder)}
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
