"""What coincides with the mutations' phase-A stalls: runs `bench.mutations` with every process
stamped by `bench/stall_site` (the suspects on the clients' clock), then lines the slowest
requests up against the suspects.

A stall is three or more mutations of phase A over `--slow-ms` whose intervals share an
instant (one event held several clients at once); its window is that shared span. For each
suspect kind (a collector pause of some process, a group COMMIT, a WAL checkpoint, a timer
callback, a log record, a probe's late wake-up) it prints what overlapped each stall's window
and how often that kind overlaps a window of the same length at random in the same phase (the
chance a coincidence is only that).

    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall [--quick] [--runs N] [--lag-ms 2]
    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall --read DIR   # an earlier run's files

With `--sched` (root, `perf` installed) the kernel's switches are recorded across each run and
each of the daemon probe's long waits is told apart: its GIL's holder preempted, or the GIL
passed among the daemon's own running threads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SITE = Path(__file__).resolve().parent / "stall_site"
MUTATIONS = ("turn.submit", "session.updateTitle")
SMALL = {
    "wal_pages": float("inf"),
    "dirty": float("inf"),
    "writeback": float("inf"),
    "gc": 1.0,
    "commit": 3.0,
    "wal_checkpoint": 0.0,
    "wal_restart": 0.0,
    "wal_restart_pass": 0.0,
    "timer": 1.0,
    "log": 0.0,
    "lag": 0.0,
    "capture": 5.0,
    "gil_wait": 0.0,
    "request": float("inf"),
    "write": float("inf"),
    "body": float("inf"),
    "actor_message": 5.0,
    "on_submit": 5.0,
    "spawn": 0.0,
}
"""Rows shorter than this (ms) are not suspects (a 0.3 ms gen-0 pause holds nothing)."""


def run_once(
    tree: Path, out: Path, mode: list[str], lag_ms: float, nice: int = 0, sched: bool = False
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join((str(SITE), str(tree), env.get("PYTHONPATH", "")))
    env["AGENTHOST_STALL_DIR"] = str(out)
    env["BENCH_MUTATIONS_RECORDS"] = str(out / "records.json")
    if lag_ms > 0:
        env["AGENTHOST_STALL_LAG_MS"] = str(lag_ms)
    if nice:
        env["AGENTHOST_STALL_NICE_PROVIDERS"] = str(nice)
    cmd = [sys.executable, "-m", "bench.mutations", *mode]
    perf = None
    if sched:
        # The kernel's switches on every CPU, on CLOCK_MONOTONIC (perf takes no wall clock):
        # one offset maps them onto the stamps' wall clock.
        (out / "offset.txt").write_text(repr(time.time() * 1000 - time.monotonic() * 1000))
        perf = subprocess.Popen(
            [
                "perf",
                "record",
                "-q",
                "-e",
                "sched:sched_switch",
                "-a",
                "-k",
                "mono",
                "-o",
                str(out / "perf.data"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        with open(out / "bench.txt", "w") as f:
            subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT, check=True)
    finally:
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(60)
            with open(out / "sched.txt", "w") as f:
                subprocess.run(
                    ["perf", "script", "-i", str(out / "perf.data"), "-F", "pid,tid,time,trace"],
                    stdout=f,
                    stderr=subprocess.DEVNULL,
                    check=False,
                )
            (out / "perf.data").unlink(missing_ok=True)


def _kind_of(argv: list[str]) -> str:
    text = " ".join(argv)
    if "serve" in argv:
        return "daemon"
    if "drivers/worker" in text:
        return "worker"
    if "app-server" in text:
        return "app-server"
    if argv[:1] == ["-c"]:
        return "resource-tracker"
    return "bench/client"


def load(out: Path) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    records = json.loads((out / "records.json").read_text())
    rows: list[dict[str, Any]] = []
    for f in sorted(out.glob("*.jsonl")):
        lines = f.read_text().splitlines()
        if not lines:
            continue
        proc = f"{_kind_of(json.loads(lines[0]))}:{f.stem}"
        for line in lines[1:]:
            try:
                kind, start, dur, detail = json.loads(line)
            except ValueError:
                continue  # a line cut by the process's end
            rows.append(
                {
                    "kind": kind,
                    "t0": start,
                    "t1": start + dur,
                    "ms": dur,
                    "detail": detail,
                    "proc": proc,
                }
            )
    return records, rows


def stalls(
    a: list[dict[str, Any]], slow_ms: float
) -> list[tuple[float, float, list[dict[str, Any]]]]:
    """Clusters of ≥ 3 slow mutations sharing an instant: (window start, end, members)."""
    slow = sorted(
        (r for r in a if r["kind"] in MUTATIONS and r["t1"] - r["t0"] >= slow_ms),
        key=lambda r: r["t0"],
    )
    out: list[tuple[float, float, list[dict[str, Any]]]] = []
    group: list[dict[str, Any]] = []
    for r in slow:
        if group and r["t0"] < min(g["t1"] for g in group):
            group.append(r)
            continue
        if len(group) >= 3:
            out.append((max(g["t0"] for g in group), min(g["t1"] for g in group), group))
        group = [r]
    if len(group) >= 3:
        out.append((max(g["t0"] for g in group), min(g["t1"] for g in group), group))
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def submit_path(
    a: list[dict[str, Any]], rows: list[dict[str, Any]], start: float
) -> dict[str, Any]:
    """Each phase-A `turn.submit` split at its arrival on the daemon's transport loop and the
    start of its `TurnRunner.on_submit` (the wait between is the Session actor's inbox), with
    what that actor handled meanwhile. A client's Session is the one its submits' arrivals
    name most often."""
    arrivals: dict[str, list[float]] = defaultdict(list)
    handled: dict[str, list[dict[str, Any]]] = defaultdict(list)
    submits: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        detail = str(r["detail"])
        if r["kind"] == "request" and detail.startswith("turn.submit "):
            arrivals[detail.split(" ", 1)[1]].append(r["t0"])
        elif r["kind"] == "actor_message" and " " in detail:
            handled[detail.split(" ", 1)[1]].append(r)
        elif r["kind"] == "on_submit":
            submits[detail].append(r)
    mine = [r for r in a if r["kind"] == "turn.submit"]
    votes: dict[int, Counter[str]] = defaultdict(Counter)
    for r in mine:
        for sid, times in arrivals.items():
            if any(r["t0"] <= t <= r["t1"] for t in times):
                votes[r["client"]][sid] += 1
    sid_of = {c: v.most_common(1)[0][0] for c, v in votes.items() if v}
    split: list[dict[str, Any]] = []
    for r in mine:
        sid = sid_of.get(r["client"])
        if sid is None:
            continue
        got = [t for t in arrivals[sid] if r["t0"] <= t <= r["t1"]]
        runs = [x for x in submits[sid] if got and got[0] <= x["t0"] <= r["t1"]]
        if not got or not runs:
            continue
        arrived, began = got[0], runs[0]["t0"]
        before = [
            f"{str(x['detail']).split(' ')[0]} {x['ms']:.0f}"
            for x in handled[sid]
            if x["t1"] > arrived and x["t1"] <= began + 0.5 and x["ms"] >= 1.0
        ]
        split.append(
            {
                "ms": r["t1"] - r["t0"],
                "at": (r["t0"] - start) / 1000,
                "client": r["client"],
                "toDaemon": arrived - r["t0"],
                "inbox": began - arrived,
                "onSubmit": runs[0]["ms"],
                "behind": before,
            }
        )
    if not split:
        return {}
    print(f"turn.submit split ({len(split)} of {len(mine)}), p50 / p99 ms:")
    for key in ("ms", "toDaemon", "inbox", "onSubmit"):
        values = [x[key] for x in split]
        print(f"   {key:<9} {_pct(values, 0.5):6.1f} / {_pct(values, 0.99):6.1f}")
    print("   the slowest:")
    for x in sorted(split, key=lambda x: -x["ms"])[:10]:
        print(
            f"   {x['ms']:5.0f} ms at +{x['at']:.2f} s client {x['client']}: to the daemon"
            f" {x['toDaemon']:.1f}, inbox {x['inbox']:.1f} behind {x['behind']},"
            f" on_submit {x['onSubmit']:.1f}"
        )
    return {
        key: {"p50": _pct([x[key] for x in split], 0.5), "p99": _pct([x[key] for x in split], 0.99)}
        for key in ("ms", "toDaemon", "inbox", "onSubmit")
    }


_SWITCH = re.compile(
    r"\s*(\d+)/(\d+)\s+([\d.]+): prev_comm=.*? prev_pid=(\d+) prev_prio=\d+"
    r" prev_state=(\S+) ==> next_comm=.*? next_pid=(\d+)"
)


def preemption(out: Path, rows: list[dict[str, Any]], start: float, end: float) -> dict[str, int]:
    """With the kernel's switches (`--sched`): for each of the daemon probe's phase-A waits of
    8 ms or more off the run queue (the GIL, or the kernel), whether a daemon thread had been
    switched out runnable (preempted) at or before its start and was still off a CPU at its
    end — the GIL's holder preempted — and how much CPU the daemon's threads had inside it."""
    sched = out / "sched.txt"
    if not sched.exists():
        return {}
    offset = float((out / "offset.txt").read_text())
    daemon = {int(r["proc"].split(":")[1]) for r in rows if r["proc"].startswith("daemon:")}
    group: dict[int, int] = {}
    switches: list[tuple[float, int, str, int]] = []
    with open(sched) as f:
        for line in f:
            m = _SWITCH.match(line)
            if m is None:
                continue
            pid, tid, t, prev, state, nxt = m.groups()
            group[int(tid)] = int(pid)
            switches.append((float(t) * 1000 + offset, int(prev), state, int(nxt)))
    threads = {tid for tid, pid in group.items() if pid in daemon}
    waits = [
        r
        for r in rows
        if r["kind"] == "lag"
        and r["proc"].startswith("daemon:")
        and isinstance(r["detail"], (int, float))
        and r["ms"] - r["detail"] >= 8.0
        and start <= r["t0"] <= end
    ]
    found = {"waits": len(waits), "holderPreempted": 0}
    print("the daemon probe's waits off the run queue, against the kernel's switches:")
    for w in waits:
        a, b = w["t0"], w["t1"]
        out_at: dict[int, tuple[float, str]] = {}
        since: dict[int, float] = {}
        ran = 0.0
        for t, prev, state, nxt in switches:
            if t > b:
                break
            if t < a - 100:
                continue
            if prev in threads:
                out_at[prev] = (t, state)
                began = since.pop(prev, None)
                if began is not None and t > a:
                    ran += min(t, b) - max(began, a)
            if nxt in threads:
                out_at.pop(nxt, None)
                since[nxt] = t
        ran += sum(b - max(t, a) for t in since.values())
        held = [tid for tid, (t, state) in out_at.items() if state.startswith("R") and t <= a + 2]
        found["holderPreempted"] += bool(held)
        print(
            f"   +{(a - start) / 1000:.3f} s, {w['ms']:.0f} ms ({w['detail']} on the run queue):"
            f" preempted across it {held or 'none'}; daemon threads' CPU in it {ran:.1f} ms"
        )
    return found


def report(out: Path, slow_ms: float) -> dict[str, Any]:
    records, rows = load(out)
    a = records["A"]
    start = min(r["t0"] for r in a)
    end = max(r["t1"] for r in a)
    mut = sorted(r["t1"] - r["t0"] for r in a if r["kind"] in MUTATIONS)
    p50, p99 = mut[len(mut) // 2], mut[min(len(mut) - 1, int(0.99 * len(mut)))]
    print(
        f"== {out}: phase A {len(mut)} mutations, p50 {p50:.1f} p99 {p99:.1f} max {mut[-1]:.1f} ms"
    )
    # The phase's first requests arrive together and queue on one GIL: not the stall.
    found = [s for s in stalls(a, slow_ms) if s[0] - start > 500.0]
    every = [r for r in rows if r["t1"] >= start and r["t0"] <= end]
    in_a = [r for r in every if r["ms"] >= SMALL.get(r["kind"], 0.0)]
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in in_a:
        by_kind[f"{r['kind']}@{r['proc'].split(':')[0]}"].append(r)
    hits: Counter[str] = Counter()
    for w0, w1, members in found:
        lat = sorted((m["t1"] - m["t0"] for m in members), reverse=True)
        print(
            f"-- stall at +{(w0 - start) / 1000:.2f} s, shared window {w1 - w0:.1f} ms,"
            f" {len(members)} mutations {', '.join(f'{x:.0f}' for x in lat)} ms,"
            f" clients {sorted({m['client'] for m in members})}"
        )
        seen: set[str] = set()
        lo = min(m["t0"] for m in members)
        for r in sorted(in_a, key=lambda r: r["t0"]):
            if r["t1"] >= lo and r["t0"] <= w1:
                inside = r["t1"] >= w0
                print(
                    f"   {'*' if inside else ' '} {r['kind']:<15} {r['proc']:<20}"
                    f" +{(r['t0'] - start) / 1000:.3f} s {r['ms']:7.1f} ms {str(r['detail'])[:90]}"
                )
                if inside:
                    seen.add(f"{r['kind']}@{r['proc'].split(':')[0]}")
        hits.update(seen)
    # The chance a window of the same length, placed at random in phase A, meets each kind.
    rng = random.Random(1)
    widths = [w1 - w0 for w0, w1, _ in found] or [20.0]
    chance: dict[str, float] = {}
    for key, items in by_kind.items():
        n = 400
        met = 0
        for _ in range(n):
            w = rng.choice(widths)
            t = rng.uniform(start, end - w)
            met += any(r["t1"] >= t and r["t0"] <= t + w for r in items)
        chance[key] = met / n
    path = submit_path(a, every, start)
    kernel = preemption(out, rows, start, end)
    print(f"stalls: {len(found)}; suspect kind: stalls it overlapped / chance at random")
    for key in sorted(by_kind, key=lambda k: -hits[k]):
        print(f"   {key:<28} {hits[key]}/{len(found)}   {chance[key]:.2f}")
    return {
        "dir": str(out),
        "p50": p50,
        "p99": p99,
        "stalls": [
            {"atS": (w0 - start) / 1000, "windowMs": w1 - w0, "n": len(m)} for w0, w1, m in found
        ],
        "hits": dict(hits),
        "submitPath": path,
        "preemption": kernel,
        "rows": dict(Counter(f"{r['kind']}@{r['proc'].split(':')[0]}" for r in every)),
        "chance": chance,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="seconds; proves it runs (tests)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--lag-ms", type=float, default=2.0, help="the probe's sleep (0: no probe)")
    p.add_argument(
        "--nice-providers",
        type=int,
        default=0,
        help="the app-servers and workers this many nice levels down in every other run (odd ones)",
    )
    p.add_argument(
        "--sched",
        action="store_true",
        help="also record the kernel's switches on every CPU (`perf record`, root)",
    )
    p.add_argument("--slow-ms", type=float, default=0.0, help="default: 2 × phase A's p50")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-stall"))
    p.add_argument("--json", type=Path, default=None, help="also write each run's summary here")
    p.add_argument("--read", type=Path, nargs="*", help="report earlier runs' folders only")
    args = p.parse_args(argv)
    tree = Path(__file__).resolve().parent.parent
    dirs = list(args.read or [])
    if not dirs:
        for i in range(args.runs):
            d = args.out / f"{time.strftime('%H%M%S')}-{i}"
            mode = ["--quick", "--smoke"] if args.smoke else ["--quick"] if args.quick else []
            nice = args.nice_providers if i % 2 == 1 else 0
            run_once(tree, d, mode, args.lag_ms, nice, args.sched)
            (d / "nice.txt").write_text(str(nice))
            dirs.append(d)
    reports = []
    for d in dirs:
        slow = args.slow_ms
        if slow <= 0:
            a = json.loads((d / "records.json").read_text())["A"]
            mut = sorted(r["t1"] - r["t0"] for r in a if r["kind"] in MUTATIONS)
            slow = 2 * mut[len(mut) // 2]
        reports.append(report(d, slow))
    if args.json is not None:
        args.json.write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
