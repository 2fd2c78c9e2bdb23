"""Issue 20's targets, exactly as the issue states them, and the one table `make bench` prints
at the end of a run: each target's value, limit, met/MISSED and value/limit, which benchmark
measured it (and at what size), and, for a missed one, the profile that bounds it.

Each benchmark records its issue-20 targets with `BenchResult.issue_target(key, ...)`, so the
limit lives here once; `collect` reads them back from the run's JSON (a re-run with `--only`
merges with the day's other results, so the table always covers every target).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import Table


@dataclass(frozen=True, slots=True)
class IssueTarget:
    key: str
    what: str
    """The figure as issue 20's table names it."""
    limit: float
    higher_is_better: bool
    module: str
    """The benchmark that measures it."""

    @property
    def direction(self) -> str:
        return ">=" if self.higher_is_better else "<="


def _ratio(provider: str) -> IssueTarget:
    return IssueTarget(
        f"fork-ratio:{provider}",
        f"host fork p50 / bare provider p50, {provider}",
        1.3,
        False,
        "bench.fork_overhead",
    )


ISSUE20: tuple[IssueTarget, ...] = (
    _ratio("tutti-agent"),
    _ratio("codex"),
    _ratio("claude-code"),
    IssueTarget(
        "forks-per-s",
        "forks committed/s at 16 clients, tutti-agent, distinct sources",
        50.0,
        True,
        "bench.throughput",
    ),
    IssueTarget(
        "mutation-p99:turn.submit",
        "mutation p99 ms, 8 clients, no fork load: turn.submit",
        50.0,
        False,
        "bench.mutations",
    ),
    IssueTarget(
        "mutation-p99:session.updateTitle",
        "mutation p99 ms, 8 clients, no fork load: updateTitle",
        50.0,
        False,
        "bench.mutations",
    ),
    IssueTarget(
        "mutation-p99-ratio",
        "mutation p99 under fork load / without (turn.submit + updateTitle)",
        2.0,
        False,
        "bench.mutations",
    ),
    IssueTarget(
        "reads-per-s",
        "reads/s with 8 clients (session.get + fork.get)",
        5000.0,
        True,
        "bench.scale",
    ),
    IssueTarget(
        "reads-p99",
        "read p99 ms with 8 clients (session.get + fork.get)",
        10.0,
        False,
        "bench.scale",
    ),
    IssueTarget(
        "prepare-commit",
        "1,000-Turn / 10,000-Message prepare + commit, ms",
        200.0,
        False,
        "bench.scale",
    ),
    IssueTarget(
        "cpu-per-fork",
        "CPU ms per fork, whole daemon tree, tutti-agent",
        30.0,
        False,
        "bench.throughput",
    ),
)
BY_KEY: Mapping[str, IssueTarget] = {t.key: t for t in ISSUE20}


def collect(benchmarks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per issue-20 target, in the issue's order, from the benchmarks' JSON records;
    a target no benchmark recorded (not run, failed) is a MISSED row saying so."""
    found: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}
    for bench in benchmarks:
        for t in bench.get("targets", []):
            if t.get("key") in BY_KEY:
                found[t["key"]] = (t, bench)
    rows: list[dict[str, Any]] = []
    for target in ISSUE20:
        row: dict[str, Any] = {
            "key": target.key,
            "what": target.what,
            "limit": target.limit,
            "direction": target.direction,
        }
        if target.key in found:
            t, bench = found[target.key]
            row.update(
                value=t["value"],
                met=bool(t["met"]),
                valueOverLimit=t["valueOverLimit"],
                measured=t.get("measured") or t["what"],
                command=bench.get("command", ""),
                profile=t.get("profile") or {},
                cpuProbeMs=(bench.get("figures") or {}).get("cpuProbeMsAtStart"),
            )
        else:
            row.update(
                value=None,
                met=False,
                valueOverLimit=None,
                measured=f"not measured: {target.module} did not run or failed",
                command="",
                profile={},
            )
        rows.append(row)
    return rows


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def table(rows: Sequence[Mapping[str, Any]], title: str) -> Table:
    """The targets; `measured_lines` says, by row number, what measured each one."""
    return Table(
        title,
        ("#", "target (issue 20)", "value", "limit", "verdict", "value/limit"),
        tuple(
            (
                i,
                r["what"],
                _num(r["value"]),
                f"{r['direction']} {r['limit']:g}",
                ("met" if r["met"] else "MISSED")
                + (" (not measured)" if r["value"] is None else ""),
                _num(r["valueOverLimit"]),
            )
            for i, r in enumerate(rows, 1)
        ),
    )


def measured_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What measured each row, with the host's speed when its benchmark started (a `make
    bench` run records `cpuProbeMsAtStart`; this VM's speed swings ~2x between minutes)."""
    return [
        f"{i}. {r['measured']}"
        + (f"; CPU probe {r['cpuProbeMs']:.0f} ms at its start" if r.get("cpuProbeMs") else "")
        for i, r in enumerate(rows, 1)
    ]


def bounds(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """For each missed target: what bounds it, from the profile its benchmark recorded."""
    out: list[str] = []
    shown: dict[tuple[str, ...], int] = {}
    for i, r in enumerate(rows, 1):
        if r["met"] or r["value"] is None and not r["profile"]:
            continue  # not measured at all: `measured_lines` says why
        out.append(
            f"{i}. MISSED {r['what']}: {_fmt(r['value'])} vs {r['direction']} {r['limit']:g}"
        )
        lines = tuple(r["profile"].get("lines") or ["(no profile recorded)"])
        if lines in shown:
            out.append(f"    the same profile as {shown[lines]}.")
            continue
        shown[lines] = i
        out += [f"    {line}" for line in lines]
        if r["command"]:
            out.append(f"    re-run: {r['command']}")
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{float(value):.3g}"
