"""Benchmark 3: same-source races. Per source Session, one client forks it continuously (through
its latest settled Turn, ACKing each commit) while another submits turns, updates settings
(both fenced) and the title (not fenced) on that same Session.

Every applied fenced write is placed, by the durable time its reply shows, against the fork
operations' fence windows (prepare → terminal, read from the store afterwards): before a
prepare, after a release, or — a broken fence — inside one. Then the end state is checked:
nothing applied is lost, nothing rejected is present, every Turn is whole and settled, and
every committed child holds exactly the source's prefix through its boundary Turn.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Mode, Table, bench_main, log, pick
from bench.harness import WS, BenchDaemon, create_session, run_turn, timeline
from bench.loadgen import ClientSpec, Record, run_clients
from transport.client import ApiError, Client

MODULE = "bench.races"
FENCED = ("turn.submit", "session.updateSettings")


def _fence_windows(store: Path) -> dict[str, list[tuple[int, int, str, str]]]:
    """source → [(prepared ms, released ms, status, operation id)] for every operation."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT source_session_id, created_at_ms, completed_at_ms, status, operation_id"
            " FROM fork_operations"
        ).fetchall()
    finally:
        conn.close()
    out: dict[str, list[tuple[int, int, str, str]]] = {}
    for sid, created, completed, status, op_id in rows:
        out.setdefault(sid, []).append((created, completed or 2**62, status, op_id))
    return out


def _texts(turn: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(m["kind"], m["text"]) for m in turn["messages"]]


def check_end_state(
    c: Client, sid: str, mutations: list[Record], forks: list[Record]
) -> dict[str, int]:
    """Lost / half-applied counts for one source (each must be 0)."""
    turns = timeline(c, sid)
    user_texts = [t["messages"][0]["text"] if t["messages"] else None for t in turns]
    problems = {"lost": 0, "appliedThoughRejected": 0, "halfApplied": 0, "childMismatch": 0}
    for r in mutations:
        if r["kind"] == "turn.submit":
            present = user_texts.count(r["text"])
            if r["status"] < 400 and present != 1:
                problems["lost"] += 1
            if r["status"] >= 400 and present != 0:
                problems["appliedThoughRejected"] += 1
    for t in turns:
        kinds = [m["kind"] for m in t["messages"]]
        if t["phase"] != "settled" or kinds[:1] != ["user"] or "assistant" not in kinds:
            problems["halfApplied"] += 1
    applied_settings = [r for r in mutations if r["kind"] == "session.updateSettings"]
    applied_settings = [r for r in applied_settings if r["status"] < 400]
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    if applied_settings and session["settings"].get("bench") != applied_settings[-1]["value"]:
        problems["lost"] += 1
    by_id = {t["turnId"]: i for i, t in enumerate(turns)}
    for f in forks:
        target = f.get("targetAgentSessionId")
        if not target:
            continue
        try:
            child = timeline(c, target)
        except ApiError as err:
            # A child exists iff its operation committed (law 2).
            if f["reason"] == "committed" or err.status != 404:
                problems["childMismatch"] += 1
            continue
        if f["reason"] != "committed":
            problems["childMismatch"] += 1
            continue
        end = by_id.get(f["turnId"])
        expected = [_texts(t) for t in turns[: end + 1]] if end is not None else None
        if expected is None or [_texts(t) for t in child] != expected:
            problems["childMismatch"] += 1
    return problems


def classify(
    mutations: list[Record], forks: list[Record], windows: list[tuple[int, int, str, str]]
) -> dict[str, int]:
    counts = {
        "appliedBeforePrepare": 0,
        "appliedAfterRelease": 0,
        "appliedNoForkInFlight": 0,
        "rejectedAsFenced": 0,
        "rejectedOther": 0,
        "appliedInsideFence": 0,
        "unfencedApplied": 0,
        "unfencedRejected": 0,
    }
    by_op = {op_id: (p, rel) for p, rel, _, op_id in windows}
    for r in mutations:
        if r["kind"] not in FENCED:
            counts["unfencedApplied" if r["status"] < 400 else "unfencedRejected"] += 1
            continue
        if r["status"] >= 400:
            fenced = r["reason"] == "agent_session_fork_in_progress"
            counts["rejectedAsFenced" if fenced else "rejectedOther"] += 1
            continue
        t = r["durableMs"]
        # Strictly inside (prepare, release): the fence let a write through. Equal ms is the
        # store's lock order within one clock tick, not a breach.
        if any(p < t < rel for p, rel, _, _ in windows):
            counts["appliedInsideFence"] += 1
            continue
        overlapping = [f for f in forks if f["t0"] <= r["t1"] and r["t0"] <= f["t1"]]
        ops = [by_op[f["operationId"]] for f in overlapping if f.get("operationId") in by_op]
        if not overlapping:
            counts["appliedNoForkInFlight"] += 1
        elif any(t <= prepared for prepared, _ in ops) or any(
            f["status"] >= 400 for f in overlapping
        ):
            # Ordered before the racing prepare (or the fork was refused because of it).
            counts["appliedBeforePrepare"] += 1
        else:
            counts["appliedAfterRelease"] += 1
    return counts


def run(mode: Mode) -> BenchResult:
    sources = pick(mode, 4, 2, 1)
    duration = pick(mode, 20.0, 5.0, 1.0)
    result = BenchResult("same-source races: forks vs mutations on one Session", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-races-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        try:
            c = daemon.client()
            log(f"races: {sources} sources, {duration:.0f} s")
            sids = [create_session(c, f"race {i}") for i in range(sources)]
            for sid in sids:
                for i in range(2):
                    run_turn(c, sid, f"seed {i}")
            specs = []
            for i, sid in enumerate(sids):
                specs.append(ClientSpec("fork", {"ws": WS, "sid": sid, "follow_latest": True}))
                specs.append(ClientSpec("race_mutate", {"ws": WS, "sid": sid, "tag": f"s{i}"}))
            records = run_clients(daemon.api, specs, duration, events=daemon.events)
            problems_total: dict[str, int] = {}
            per_source = []
            for i, sid in enumerate(sids):
                forks, muts = records[2 * i], records[2 * i + 1]
                problems = check_end_state(c, sid, muts, forks)
                per_source.append((sid, forks, muts, problems))
                for k, v in problems.items():
                    problems_total[k] = problems_total.get(k, 0) + v
        finally:
            daemon.stop()
        windows = _fence_windows(daemon.home / "store.sqlite3")

    counts: dict[str, int] = {}
    fork_outcomes: dict[str, int] = {}
    for sid, forks, muts, _ in per_source:
        for k, v in classify(muts, forks, windows.get(sid, [])).items():
            counts[k] = counts.get(k, 0) + v
        for f in forks:
            key = (
                f["reason"] if f["status"] < 400 else f"refused: {f.get('boundary') or f['reason']}"
            )
            fork_outcomes[key] = fork_outcomes.get(key, 0) + 1
    committed = fork_outcomes.get("committed", 0)
    applied = sum(counts[k] for k in counts if k.startswith("applied")) + counts["unfencedApplied"]
    result.tables.append(
        Table(
            f"fenced mutations (turn.submit, session.updateSettings) on {sources} sources "
            f"being forked, {duration:.0f} s",
            tuple(counts),
            (tuple(counts.values()),),
        )
    )
    result.tables.append(
        Table("fork attempts", tuple(fork_outcomes), (tuple(fork_outcomes.values()),))
    )
    result.tables.append(
        Table(
            "end state (each must be 0) and throughput",
            (*problems_total, "forks committed/s", "mutations applied/s"),
            ((*problems_total.values(), committed / duration, applied / duration),),
        )
    )
    violations = sum(problems_total.values()) + counts["appliedInsideFence"]
    result.figures = {
        "mutations": counts,
        "forks": fork_outcomes,
        "endState": problems_total,
        "violations": violations,
        "forksCommittedPerSecond": committed / duration,
        "mutationsAppliedPerSecond": applied / duration,
        "sources": sources,
        "durationS": duration,
    }
    result.target("lost + half-applied + fence breaches", violations, 0, higher_is_better=False)
    if not counts["rejectedAsFenced"]:
        result.notes.append("no mutation hit an active fence in this run (the race was not hit)")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
