"""The issues' targets, exactly as the issues state them, and the tables `make bench` prints at
the end of a run: each target's value, limit, met/MISSED and value/limit, which benchmark
measured it (and at what size, how loaded and how fast the host was at its start), and, for a
missed one, the profile that bounds it. Issue 20's eleven targets come first, issue 36's last.

Each benchmark records its targets with `BenchResult.issue_target(key, ...)`, so the limit
lives here once; `collect` reads them back from the run's JSON (a re-run with `--only` merges
with the day's other results, so the tables always cover every target).
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
    number: str = ""
    """The target's number in its issue (issue 36 numbers its targets 1-6, several rows each);
    empty: the row's position."""
    info: bool = False
    """A figure printed beside its target to judge it by (what the machine allows), with no
    limit of its own: never met nor missed."""

    @property
    def direction(self) -> str:
        if self.info:
            return ""
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

PROVIDER_NAMES = ("tutti-agent", "codex", "claude-code")


def _i36(
    key: str, what: str, limit: float, module: str, number: str, *, higher: bool = False
) -> IssueTarget:
    return IssueTarget(f"36:{key}", what, limit, higher, module, number)


def _info36(key: str, what: str, module: str, number: str) -> IssueTarget:
    return IssueTarget(f"36:{key}", what, math.nan, False, module, number, info=True)


ISSUE36: tuple[IssueTarget, ...] = (
    *(
        _i36(
            f"fork-over-floor:{p}",
            f"host fork p50 / durability floor (bare p50 + the fork's syncs), {p}",
            1.25,
            "bench.fork_overhead",
            "1",
        )
        for p in PROVIDER_NAMES
    ),
    _i36(
        "floor-over-bare",
        "durability floor - bare fork p50, ms (the syncs a fork waits for), tutti-agent",
        1.5,
        "bench.fork_overhead",
        "1",
    ),
    _info36(
        "hop-floor",
        "hop floor: a no-work request through client → daemon → worker → app-server and back,"
        " beyond the app-server's pipes alone, ms (bench.hop_floor; the process view's minimum)",
        "bench.fork_overhead",
        "1",
    ),
    *(
        row
        for p in PROVIDER_NAMES
        for row in (
            _info36(
                f"hop-floor-at-fork-cadence:{p}",
                "hop floor at a fork's cadence: its out half after the idle a host fork comes"
                f" after, its back half the provider's own fork work after, ms, {p}"
                " (bench.hop_floor --gap --answer-gap)",
                "bench.fork_overhead",
                "1",
            ),
            _info36(
                f"fork-over-floors:{p}",
                "host fork p50 / (durability floor + hop floor at a fork's cadence), " + p,
                "bench.fork_overhead",
                "1",
            ),
        )
    ),
    *(
        row
        for p in PROVIDER_NAMES
        for row in (
            _i36(
                f"turn-overhead:{p}",
                f"host turn p50 - bare turn p50, ms, {p}",
                3.0,
                "bench.turn_overhead",
                "2",
            ),
            _i36(
                f"first-delta:{p}",
                f"first message.delta at the client after the provider emitted it, p50 ms, {p}",
                2.0,
                "bench.turn_overhead",
                "2",
            ),
            _i36(
                f"delta-batching:{p}",
                f"longest a delta waited in the host beyond the bare provider, ms, {p}",
                10.0,
                "bench.turn_overhead",
                "2",
            ),
        )
    ),
    _i36(
        "turn-floor",
        "turn floor: the claim's and the settlement's COMMITs + the cheapest `before` and"
        " `after` captures, ms (bench.turn_floor)",
        3.0,
        "bench.turn_overhead",
        "2",
    ),
    *(
        _i36(
            f"turn-over-floor:{p}",
            f"(host turn p50 - bare turn p50) / the turn floor of the same run, {p}"
            " (target 1's 1.25 applied to a Turn)",
            1.25,
            "bench.turn_overhead",
            "2",
        )
        for p in PROVIDER_NAMES
    ),
    *(
        row
        for p in PROVIDER_NAMES
        for row in (
            _info36(
                f"hop-floor-at-turn-cadence:{p}",
                "hop floor at a Turn's cadence: its out half after the idle a Turn's submit"
                f" comes after, its back half a delta's spacing after, ms, {p}"
                " (bench.hop_floor --gap --answer-gap)",
                "bench.turn_overhead",
                "2",
            ),
            _info36(
                f"turn-over-floors:{p}",
                "(host turn p50 - bare turn p50) / (turn floor + hop floor at a Turn's"
                f" cadence), {p}",
                "bench.turn_overhead",
                "2",
            ),
        )
    ),
    _i36(
        "forks-per-s",
        "forks committed/s at 16 clients, tutti-agent",
        300.0,
        "bench.throughput",
        "3",
        higher=True,
    ),
    _i36(
        "cpu-per-fork",
        "CPU ms per fork, whole daemon tree, tutti-agent",
        5.0,
        "bench.throughput",
        "3",
    ),
    _info36(
        "ceiling:forks-per-s",
        "ceiling: bare forks/s at 16 (tutti-agent's app-servers + the fork's syncs, no host)",
        "bench.fork_ceiling",
        "3",
    ),
    _info36(
        "ceiling:cpu-per-fork",
        "ceiling: CPU ms per bare fork at 16 (app-servers + the bare calls and syncs)",
        "bench.fork_ceiling",
        "3",
    ),
    _i36(
        "mutation-p99:turn.submit",
        "mutation p99 ms, 8 clients idle: turn.submit",
        20.0,
        "bench.mutations",
        "4",
    ),
    _i36(
        "mutation-p99:session.updateTitle",
        "mutation p99 ms, 8 clients idle: updateTitle",
        20.0,
        "bench.mutations",
        "4",
    ),
    _i36(
        "mutation-p99-ratio",
        "mutation p99 under fork load / idle (turn.submit + updateTitle)",
        1.5,
        "bench.mutations",
        "4",
    ),
    _info36(
        "floor:write-p99",
        "floor: durable write p99 with 8 writers, ms (bare apsw INSERT + fsync'd COMMIT)",
        "bench.write_floor",
        "4",
    ),
    _info36(
        "floor:store-write-p99",
        "floor: the store's own write p99 with 8 writers, ms (storage code, no daemon)",
        "bench.write_floor",
        "4",
    ),
    _i36("months:ready", "store of months: daemon start to ready, ms", 1000.0, "bench.months", "5"),
    _i36(
        "months:list-p99",
        "store of months: session list first page p99, ms",
        10.0,
        "bench.months",
        "5",
    ),
    _i36(
        "months:open-p99",
        "store of months: open a 10,000-Turn Session (get + newest timeline page) p99, ms",
        10.0,
        "bench.months",
        "5",
    ),
    _i36(
        "months:fork",
        "store of months: a fork through the big Session's last Turn, ms",
        1000.0,
        "bench.months",
        "5",
    ),
    _i36(
        "months:recovery",
        "store of months: recovery of 10,000 interrupted operations, ms",
        2000.0,
        "bench.months",
        "5",
    ),
    _i36(
        "months:rss",
        "store of months: daemon RSS with 10,000 Sessions touched, MB",
        150.0,
        "bench.months",
        "5",
    ),
    _i36(
        "big-fork",
        "1,000-Turn / 10,000-Message prepare + commit, ms",
        50.0,
        "bench.scale",
        "6",
    ),
)
BY_KEY: Mapping[str, IssueTarget] = {t.key: t for t in (*ISSUE20, *ISSUE36)}


def collect(
    benchmarks: Sequence[Mapping[str, Any]], issue: Sequence[IssueTarget] = ISSUE20
) -> list[dict[str, Any]]:
    """One row per target of `issue`, in the issue's order, from the benchmarks' JSON records;
    a target no benchmark recorded (not run, failed) is a MISSED row saying so."""
    keys = {t.key for t in issue}
    found: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}
    for bench in benchmarks:
        for t in bench.get("targets", []):
            if t.get("key") in keys:
                found[t["key"]] = (t, bench)
    rows: list[dict[str, Any]] = []
    for i, target in enumerate(issue, 1):
        row: dict[str, Any] = {
            "key": target.key,
            "number": target.number or str(i),
            "what": target.what,
            "limit": None if target.info else target.limit,
            "direction": target.direction,
            "info": target.info,
        }
        if target.key in found:
            t, bench = found[target.key]
            row.update(
                value=t["value"],
                met=None if target.info else bool(t["met"]),
                valueOverLimit=t["valueOverLimit"],
                measured=t.get("measured") or t["what"],
                command=bench.get("command", ""),
                profile=t.get("profile") or {},
                cpuProbeMs=(bench.get("figures") or {}).get("cpuProbeMsAtStart"),
                loadAverage=(bench.get("figures") or {}).get("loadAverage1mAtStart"),
                busyCores=(bench.get("figures") or {}).get("busyCoresAtStart"),
            )
        else:
            row.update(
                value=None,
                met=None if target.info else False,
                valueOverLimit=None,
                measured=f"not measured: {target.module} did not run or failed",
                command="",
                profile={},
            )
        rows.append(row)
    return rows


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def table(rows: Sequence[Mapping[str, Any]], title: str, issue: str = "issue 20") -> Table:
    """The targets; `measured_lines` says, by row number, what measured each one."""
    return Table(
        title,
        ("#", f"target ({issue})", "value", "limit", "verdict", "value/limit"),
        tuple(
            (
                r.get("number") or i,
                r["what"],
                _num(r["value"]),
                _limit(r),
                _verdict(r) + (" (not measured)" if r["value"] is None else ""),
                _num(r["valueOverLimit"]),
            )
            for i, r in enumerate(rows, 1)
        ),
    )


def _limit(row: Mapping[str, Any]) -> str:
    return "-" if row.get("info") else f"{row['direction']} {row['limit']:g}"


def _verdict(row: Mapping[str, Any]) -> str:
    if row.get("info"):
        return "info"
    return "met" if row["met"] else "MISSED"


def measured_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What measured each row, with the host's speed when its benchmark started (a `make
    bench` run records `cpuProbeMsAtStart`; this VM's speed swings ~2x between minutes) and
    how loaded the machine was then (1-minute load average, cores busy)."""
    return [
        f"{i}. {r['measured']}"
        + (f"; CPU probe {r['cpuProbeMs']:.0f} ms at its start" if r.get("cpuProbeMs") else "")
        + (
            f", load {r['loadAverage']:.2f} ({r.get('busyCores', 'n/a')} cores busy)"
            if r.get("loadAverage") is not None
            else ""
        )
        for i, r in enumerate(rows, 1)
    ]


def bounds(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """For each missed target: what bounds it, from the profile its benchmark recorded."""
    out: list[str] = []
    shown: dict[tuple[str, ...], int] = {}
    for i, r in enumerate(rows, 1):
        if r.get("info") or r["met"] or r["value"] is None and not r["profile"]:
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
