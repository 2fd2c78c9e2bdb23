"""Benchmark 2: mutations under fork load. 8 clients each submit turns, update the title and read
the timeline of their own Session; measured once alone and once while 8 other clients fork 8
other Sessions continuously. Reports p50/p99 per mutation and the p99 ratio (target ≤ 2).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Latency, Mode, Table, bench_main, log, pick, ratio
from bench.harness import BenchDaemon, create_session, last_settled_turn, run_turn
from bench.loadgen import ClientSpec, latencies, run_clients
from bench.profile import TreeProfile

MODULE = "bench.mutations"
KINDS = ("turn.submit", "session.updateTitle", "session.timeline")


def run(mode: Mode) -> BenchResult:
    mutators = pick(mode, 8, 8, 2)
    forkers = pick(mode, 8, 8, 2)
    duration = pick(mode, 20.0, 5.0, 1.0)
    result = BenchResult("mutations with and without fork load", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-mutations-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        try:
            c = daemon.client()
            log(f"mutations: {mutators} mutators, {forkers} forkers, {duration:.0f} s per phase")
            mut_sids = [create_session(c, f"mut {i}") for i in range(mutators)]
            fork_sids = [create_session(c, f"src {i}") for i in range(forkers)]
            for sid in mut_sids:
                run_turn(c, sid, "warm up")  # live app-server, like the forked sources
            boundaries = {}
            for sid in fork_sids:
                for i in range(3):
                    run_turn(c, sid, f"source turn {i}")
                boundaries[sid] = last_settled_turn(c, sid)
            ws = "ws-bench"
            mut_specs = [ClientSpec("mutate", {"ws": ws, "sid": sid}) for sid in mut_sids]
            fork_specs = [
                ClientSpec("fork", {"ws": ws, "sid": sid, "turn_id": boundaries[sid]})
                for sid in fork_sids
            ]
            log("mutations: phase A (no fork load)")
            alone = run_clients(daemon.api, mut_specs, duration, events=daemon.events)
            log("mutations: phase B (with fork load)")
            profile = TreeProfile(daemon.pid, tmp / "mutations.pyspy.txt", use_py_spy=False)
            loaded = run_clients(
                daemon.api,
                mut_specs + fork_specs,
                duration,
                events=daemon.events,
                on_start=profile.start,
            )
            profile.stop()
        finally:
            daemon.stop()

    a = [r for recs in alone for r in recs]
    b = [r for recs in loaded[:mutators] for r in recs]
    forks = [r for recs in loaded[mutators:] for r in recs]
    rows = []
    figures: dict[str, Any] = {"alone": {}, "underForkLoad": {}}
    for kind in (*KINDS, "all"):
        la = Latency.of(latencies(a, None if kind == "all" else kind))
        lb = Latency.of(latencies(b, None if kind == "all" else kind))
        figures["alone"][kind] = la
        figures["underForkLoad"][kind] = lb
        rows.append(
            (
                kind,
                la.n / duration,
                la.p50,
                la.p99,
                lb.n / duration,
                lb.p50,
                lb.p99,
                ratio(lb.p99, la.p99),
            )
        )
    committed = sum(1 for r in forks if r.get("reason") == "committed")
    errors_a = sum(1 for r in a if r["status"] >= 400)
    errors_b = sum(1 for r in b if r["status"] >= 400)
    result.tables.append(
        Table(
            f"{mutators} mutation clients on their own Sessions, ms "
            f"(B: + {forkers} clients forking other Sessions)",
            ("mutation", "A req/s", "A p50", "A p99", "B req/s", "B p50", "B p99", "p99 B/A"),
            tuple(rows),
        )
    )
    fork_rate = committed / duration
    result.tables.append(
        Table(
            "load during phase B",
            ("forks committed", "forks/s", "mutation errors A", "mutation errors B"),
            ((committed, fork_rate, errors_a, errors_b),),
        )
    )
    figures.update(
        forksCommitted=committed,
        forksPerSecond=fork_rate,
        errors={"alone": errors_a, "underForkLoad": errors_b},
        cpuSecondsPhaseB=profile.cpu,
        clients={"mutators": mutators, "forkers": forkers, "durationS": duration},
    )
    result.figures = figures
    overall = ratio(figures["underForkLoad"]["all"].p99, figures["alone"]["all"].p99)
    result.target("p99 ratio, all mutations (B/A)", overall, 2.0, higher_is_better=False)
    result.notes.append(
        "CPU seconds in phase B by process kind: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(profile.cpu.items()))
        + f" (over {duration:.0f} s on {_cores()} cores)"
    )
    return result


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
