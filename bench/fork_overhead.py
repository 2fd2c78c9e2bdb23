"""Benchmark 1: fork overhead against the provider itself. Through the daemon socket,
`fork.create` → committed on a live source of N turns; in the same run, interleaved, the bare
provider calls the saga needs on an equally warm provider this benchmark runs itself
(the Tutti Agent: `thread/read` + `thread/fork`; Codex: the driver's calls, `thread/fork` with
`excludeTurns` + the child's Turns listed, the source's listed only when it changed; Claude Code:
`fork_session` through the checkpoint + the in-process read of the child). Reports p50/p99 of
both, their ratio, and where the host's time goes (the operation's durable stage timestamps,
and a py-spy/CPU profile of the process tree). Every available provider of `bench/providers.py`
is measured, in every mode.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import hop_floor, sync_floor
from bench.common import BenchResult, Latency, Mode, Table, bench_main, log, pick, ratio
from bench.harness import (
    BenchDaemon,
    acknowledge,
    create_session,
    fork_until_terminal,
    last_settled_turn,
    run_turn,
)
from bench.loadgen import now_ms
from bench.profile import TreeProfile, cpu_line, spy_lines
from bench.providers import PROVIDERS, ProviderEntry

MODULE = "bench.fork_overhead"
STAGES = ("prepare", "attest", "provider+bind", "commit", "reply")
HOP_GAP_CAP_S = 0.06
"""The longest idle the hop floor at a fork's cadence waits before each sample (as
`bench.turn_overhead`'s: from 30 ms of idle on, a chain's cost no longer moves here)."""


@dataclass(frozen=True, slots=True)
class ForkCadence:
    """The gaps one provider's host forks saw in this run and the hop floor measured at them.
    `idle`: before each host fork, since the host last answered this client (its previous
    acknowledgement; the bare fork ran in between); `since_fork`: since the previous fork came
    back committed; `answer`: the provider's own fork work (the paired bare fork), after which
    its answer starts back; `hops`: `bench.hop_floor` with its samples `idle` p50 apart and
    answered `answer` p50 after each request (each rounded to half a millisecond)."""

    idle: Latency
    since_fork: Latency
    answer: Latency
    hops: hop_floor.HopFloor

    @property
    def hop_ms(self) -> float:
        """The process view at this cadence: the out half plus the back half."""
        return self.hops.out_ms + self.hops.back_ms

    def words(self) -> str:
        return (
            f"bench.hop_floor --gap {self.hops.gap_ms:g} --answer-gap"
            f" {self.hops.answer_gap_ms:g} ({self.hops.chain.n} samples; a host fork came"
            f" {self.idle.p50:.2f} ms p50 after the host's previous answer,"
            f" {self.since_fork.p50:.2f} ms after the previous fork committed; the provider's"
            f" own fork work {self.answer.p50:.2f} ms p50)"
        )

    def line(self) -> str:
        return (
            f"hop floor at a fork's cadence {self.hop_ms:.2f} ms: out half"
            f" {self.hops.out_ms:.2f} ms after {self.hops.gap_ms:g} ms idle + back half"
            f" {self.hops.back_ms:.2f} ms answered {self.hops.answer_gap_ms:g} ms after the"
            f" request; {self.words()}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "hostIdleBeforeFork": self.idle.brief(),
            "sinceForkBefore": self.since_fork.brief(),
            "providerWork": self.answer.brief(),
            "hopMs": round(self.hop_ms, 3),
            "hopFloor": self.hops.to_json(),
        }


def _half_ms(value_ms: float) -> float:
    return round(value_ms * 2) / 2


def cadence_hops(
    mode: Mode,
    idle: Latency,
    since_fork: Latency,
    answer: Latency,
    measured: dict[tuple[float, float], hop_floor.HopFloor],
) -> ForkCadence:
    """The hop floor with each sample after the idle a host fork came after (its p50, at most
    `HOP_GAP_CAP_S`) and each answer the provider's own fork work (the bare p50) after its
    request. One measurement per (gap, answer gap), each rounded to half a millisecond, so
    providers whose gaps agree share it."""
    gap = min(idle.p50, HOP_GAP_CAP_S * 1000) if not math.isnan(idle.p50) else 0.0
    work = answer.p50 if not math.isnan(answer.p50) else 0.0
    key = (_half_ms(gap), _half_ms(work))
    if key not in measured:
        measured[key] = hop_floor.measure(
            pick(mode, 200, 100, 10), pick(mode, 20, 10, 2), key[0] / 1000, key[1] / 1000
        )
    return ForkCadence(idle, since_fork, answer, measured[key])


def stage_times(store_path: Path, ops: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-stage milliseconds from the operations' durable timestamps (read-only, after the
    daemon stopped): send → prepared → dispatching → provider_accepted → committed → reply."""
    conn = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True)
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    try:
        for op in ops:
            row = conn.execute(
                "SELECT created_at_ms, dispatched_at_ms, accepted_at_ms, completed_at_ms"
                " FROM fork_operations WHERE operation_id = ?",
                (op["operationId"],),
            ).fetchone()
            if row is None or None in row:
                continue
            created, dispatched, accepted, completed = row
            out["prepare"].append(created - op["t0"])
            out["attest"].append(dispatched - created)
            out["provider+bind"].append(accepted - dispatched)
            out["commit"].append(completed - accepted)
            out["reply"].append(op["t1"] - completed)
    finally:
        conn.close()
    return out


def measure(entry: ProviderEntry, tmp: Path, turns: int, samples: int, warmup: int) -> dict:
    with entry.environment() as config:
        return _measure(entry, config, tmp, turns, samples, warmup)


def _measure(
    entry: ProviderEntry,
    config: dict[str, str],
    tmp: Path,
    turns: int,
    samples: int,
    warmup: int,
) -> dict:
    log(f"fork overhead: {entry.name}, source of {turns} turns, {samples} samples")
    daemon = BenchDaemon(tmp / "home", providers={entry.name: config} if config else {}).start()
    bare = None
    host_ms: list[float] = []
    bare_ms: list[float] = []
    cold_ms: list[float] = []
    ops: list[dict[str, Any]] = []
    idle_ms: list[float] = []
    """Before each timed host fork but the first: since the host last answered this client
    (the previous fork's acknowledgement); the bare fork ran in between."""
    since_fork_ms: list[float] = []
    """Before each timed host fork but the first: since the previous fork came back committed
    (the worker and its provider have had no request since)."""
    # The measured window runs without the sampler (py-spy takes CPU from the same two cores,
    # and only on the host's side); the profile comes from a shorter run after it.
    profile = TreeProfile(daemon.pid, tmp / "fork-overhead.pyspy.txt", use_py_spy=False)
    spied = TreeProfile(daemon.pid, tmp / "fork-overhead.pyspy.txt")
    try:
        c = daemon.client()
        sid = create_session(c, "overhead", provider=entry.name)
        for i in range(turns):
            run_turn(c, sid, f"turn {i}")
        boundary = last_settled_turn(c, sid)
        bare = entry.bare(tmp / "bare-home", turns, config)
        for _ in range(warmup):  # both sides warm: live app-servers, loaded threads
            acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
            bare.fork_once()
        profile.start()
        answered = committed = float("nan")
        for _ in range(samples):
            t0 = now_ms()
            if not math.isnan(answered):
                idle_ms.append(t0 - answered)
                since_fork_ms.append(t0 - committed)
            op = fork_until_terminal(c, sid, boundary)
            t1 = now_ms()
            if op["status"] != "committed":
                raise RuntimeError(f"fork did not commit: {op}")
            host_ms.append(t1 - t0)
            ops.append({"operationId": op["operationId"], "t0": t0, "t1": t1})
            acknowledge(c, op["operationId"])
            answered, committed = now_ms(), t1
            bare_ms.append(bare.fork_once())
        profile.stop()
        spied.start()
        for _ in range(max(3, samples // 5)):
            acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
        spied.stop()
        for _ in range(max(3, samples // 5)):
            cold_ms.append(bare.cold_read_once())
    finally:
        if bare is not None:
            bare.close()
        daemon.stop()
    stages = stage_times(daemon.home / "store.sqlite3", ops)
    return {
        "host": Latency.of(host_ms),
        "bare": Latency.of(bare_ms),
        "coldRead": Latency.of(cold_ms),
        "stages": {k: Latency.of(v) for k, v in stages.items()},
        "cpu": profile.cpu,
        "profile": spied.summary,
        "spyLines": spy_lines(spied),
        "forks": len(host_ms),
        "hostIdleBefore": Latency.of(idle_ms),
        "sinceForkBefore": Latency.of(since_fork_ms),
    }


def run(mode: Mode) -> BenchResult:
    turns = pick(mode, 10, 5, 2)
    samples = pick(mode, 150, 30, 4)
    warmup = pick(mode, 5, 3, 1)
    result = BenchResult("fork overhead vs the bare provider", "", mode.value)
    rows: list[tuple[Any, ...]] = []
    stage_rows: list[tuple[Any, ...]] = []
    skipped: list[tuple[str, str]] = []
    measured: list[tuple[str, Latency, Latency]] = []
    floor: sync_floor.Floor | None = None
    own_floors: dict[str, sync_floor.Floor] = {}
    """A provider's floor counted and sized through its own daemon (Codex's), where the
    tutti-agent floor's child and counts are not its own."""
    hops: hop_floor.HopFloor | None = None
    cadences: dict[str, ForkCadence] = {}
    at_cadence: dict[tuple[float, float], hop_floor.HopFloor] = {}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp_text:
        for entry in PROVIDERS:
            why = entry.unavailable()
            if why is not None:
                skipped.append((entry.name, why))
                continue
            m = measure(entry, Path(tmp_text) / entry.name, turns, samples, warmup)
            host, bare = m["host"], m["bare"]
            measured.append((entry.name, host, bare))
            r50, r99 = ratio(host.p50, bare.p50), ratio(host.p99, bare.p99)
            cold = m["coldRead"]
            rows.append(
                (
                    entry.name,
                    turns,
                    host.n,
                    host.p50,
                    host.p99,
                    bare.p50,
                    bare.p99,
                    r50,
                    r99,
                    cold.p50,
                )
            )
            for stage, lat in m["stages"].items():
                stage_rows.append((entry.name, stage, lat.p50, lat.p99))
            forks = max(1, m["forks"])
            cpu = {k: round(1000 * v / forks, 2) for k, v in m["cpu"].items()}
            result.figures[entry.name] = {
                "turns": turns,
                "host": host,
                "bare": bare,
                "coldRead": cold,
                "ratioP50": r50,
                "ratioP99": r99,
                "stages": m["stages"],
                "cpuMsPerFork": cpu,
                "profile": m["profile"].to_json() if m["profile"] else None,
            }
            stages_p50 = {k: lat.p50 for k, lat in m["stages"].items()}
            floor_lines: list[str] = []
            if entry.name == "tutti-agent" and shutil.which("strace") is not None:
                # After the measured window, on its own daemon: strace slows what it traces.
                floor = sync_floor.measure(bare.p50, forks=pick(mode, 10, 5, 2), turns=turns)
                result.figures[entry.name]["durabilityFloor"] = floor.to_json()
                floor_lines.append(floor.line())
            if entry.name == "codex" and shutil.which("strace") is not None:
                # Its own COMMITs counted and its own child sized (a ~22 KB Referenced one):
                # `bench.sync_floor.measure_codex`; its own daemon, after the measured window.
                own = sync_floor.measure_codex(bare.p50, forks=pick(mode, 10, 5, 2), turns=turns)
                own_floors[entry.name] = own
                result.figures[entry.name]["durabilityFloor"] = own.to_json()
                floor_lines.append(own.line())
            if hops is None:
                hops = hop_floor.measure(pick(mode, 400, 200, 20), pick(mode, 50, 20, 3))
                result.figures["hopFloor"] = hops.to_json()
            cadence = cadence_hops(
                mode, m["hostIdleBefore"], m["sinceForkBefore"], bare, at_cadence
            )
            cadences[entry.name] = cadence
            result.figures[entry.name]["hopFloorAtForkCadence"] = cadence.to_json()
            result.issue_target(
                f"fork-ratio:{entry.name}",
                r50,
                measured=f"bench.fork_overhead: {host.n} forks of a {turns}-turn source,"
                f" host {host.p50:.1f} / bare {bare.p50:.1f} ms",
                profile={
                    "lines": [
                        f"host p50 {host.p50:.1f} ms vs bare {bare.p50:.1f} ms"
                        f" (the provider's own calls, same run, interleaved)",
                        "host stages p50 ms (operation timestamps): "
                        + ", ".join(f"{k} {v:.1f}" for k, v in stages_p50.items()),
                        cpu_line(cpu, "ms per fork"),
                        *floor_lines,
                        cadence.line(),
                        *m["spyLines"],
                    ],
                    "stagesP50Ms": stages_p50,
                    "cpuMsPerFork": cpu,
                },
            )
            if m["profile"] is not None:
                result.notes += [f"{entry.name} profile: {x}" for x in m["profile"].lines(4)]
            result.notes.append(f"{entry.name} CPU ms per fork by process kind: {cpu}")
    result.tables.append(
        Table(
            "fork.create → committed (host) vs the bare provider calls, ms (app-servers:"
            " thread/read + thread/fork; claude-code: fork_session + child read)",
            (
                "provider",
                "turns",
                "n",
                "host p50",
                "host p99",
                "bare p50",
                "bare p99",
                "p50 ratio",
                "p99 ratio",
                "cold read p50",
            ),
            tuple(rows),
        )
    )
    result.tables.append(
        Table(
            "host stages from the operation's durable timestamps, ms",
            ("provider", "stage", "p50", "p99"),
            tuple(stage_rows),
        )
    )
    result.notes.append(
        "cold read: the source read from its home alone, as the driver proves readability"
        " (app-servers: a fresh server spawned + thread/read; claude-code: in-process SDK read)"
    )
    for name, why in skipped:
        result.notes.append(f"{name}: not measured: {why}")
        result.issue_target(
            f"fork-ratio:{name}",
            float("nan"),
            measured=f"not measured: {why}",
            profile={"lines": [f"{name} was not measured: {why}"]},
        )
    result.figures["skipped"] = dict(skipped)
    _issue36_rows(result, measured, floor, hops, skipped, own_floors)
    _cadence_rows(result, measured, floor, hops, cadences, skipped, own_floors)
    return result


def _cadence_rows(
    result: BenchResult,
    measured: Sequence[tuple[str, Latency, Latency]],
    floor: sync_floor.Floor | None,
    hops: hop_floor.HopFloor | None,
    cadences: Mapping[str, ForkCadence],
    skipped: Sequence[tuple[str, str]],
    own_floors: Mapping[str, sync_floor.Floor] | None = None,
) -> None:
    """The INFO rows beside target 1 (no limit; the target stands): the process view's floor at
    a fork's own cadence, and the host fork p50 over the durability floor plus that; and a
    table of the gaps, the halves and the share of host - floor the hop floor explains.
    `own_floors`: a provider's own floor, in place of `floor` (tutti-agent's)."""
    rows: list[tuple[Any, ...]] = []
    tutti_floor = floor
    for name, host, bare in measured:
        floor = (own_floors or {}).get(name, tutti_floor)
        cadence = cadences[name]
        hop = cadence.hop_ms
        result.issue_target(
            f"36:hop-floor-at-fork-cadence:{name}",
            hop,
            measured=f"{cadence.words()}: out {cadence.hops.out_ms:.2f} + back"
            f" {cadence.hops.back_ms:.2f} ms",
            profile={"lines": [cadence.line()]},
        )
        if floor is None:
            why = "no durability floor in this run (tutti-agent not measured, or strace missing)"
            result.issue_target(
                f"36:fork-over-floors:{name}", float("nan"), measured=why, profile={"lines": [why]}
            )
            continue
        floor_ms = bare.p50 + floor.sync_ms
        over = host.p50 - floor_ms
        lines = [
            floor.line(),
            cadence.line(),
            f"host p50 - durability floor = {over:.2f} ms, of which the hop floor at a fork's"
            f" cadence {hop:.2f} ms ({_share(hop, over)})",
        ]
        result.issue_target(
            f"36:fork-over-floors:{name}",
            ratio(host.p50, floor_ms + hop),
            measured=f"bench.fork_overhead: {host.n} forks; host p50 {host.p50:.1f} ms over"
            f" durability floor {floor_ms:.2f} + hop floor at a fork's cadence {hop:.2f} ms"
            f" ({cadence.words()})",
            profile={"lines": lines, "floorMs": floor_ms, "hopMs": hop},
        )
        rows.append(
            (
                name,
                cadence.idle.p50,
                cadence.since_fork.p50,
                cadence.answer.p50,
                cadence.hops.gap_ms,
                cadence.hops.answer_gap_ms,
                cadence.hops.out_ms,
                cadence.hops.back_ms,
                hop,
                hops.hops_ms if hops is not None else float("nan"),
                host.p50,
                floor_ms,
                over,
                hop / over if over > 0 else float("nan"),
                ratio(host.p50, floor_ms + hop),
            )
        )
    for name, why in skipped:
        for key in ("hop-floor-at-fork-cadence", "fork-over-floors"):
            result.issue_target(
                f"36:{key}:{name}",
                float("nan"),
                measured=f"not measured: {why}",
                profile={"lines": [f"{name} was not measured: {why}"]},
            )
    result.tables.append(
        Table(
            "the process view at a fork's cadence (bench.hop_floor's out half after the idle a"
            " host fork came after, its back half answered the provider's own fork work after"
            " the request), ms",
            (
                "provider",
                "idle before fork p50",
                "since previous fork p50",
                "provider work p50",
                "hop gap",
                "answer gap",
                "out half",
                "back half",
                "hop floor at cadence",
                "hop floor back to back",
                "host p50",
                "durability floor",
                "host - floor",
                "share of host - floor",
                "host / (floor + hop floor at cadence)",
            ),
            tuple(rows),
        )
    )


def _share(part: float, whole: float) -> str:
    if whole <= 0 or math.isnan(whole):
        return "host p50 is not above the floor"
    return f"{100 * part / whole:.0f} % of it"


def _issue36_rows(
    result: BenchResult,
    measured: Sequence[tuple[str, Latency, Latency]],
    floor: sync_floor.Floor | None,
    hops: hop_floor.HopFloor | None,
    skipped: Sequence[tuple[str, str]],
    own_floors: Mapping[str, sync_floor.Floor] | None = None,
) -> None:
    """Issue 36 target 1: each provider's host fork p50 against its durability floor in this
    run (its own bare p50 + the syncs a fork waits for, counted and timed by
    `bench.sync_floor` through a tutti-agent daemon: the saga's COMMITs and the binder's rounds
    are the same for every provider; Codex's counted and its child sized through a Codex
    daemon, `own_floors`), and that floor's distance from the bare call; beside them, the
    process view's hop floor (`bench.hop_floor`) and what the host adds beyond both."""
    if hops is not None:
        result.issue_target(
            "36:hop-floor",
            hops.hops_ms,
            measured=f"bench.hop_floor: {hops.chain.n} no-work requests, chain p50"
            f" {hops.chain.p50:.2f} ms, the app-server's pipes alone {hops.pipe.p50:.2f} ms",
            profile={"lines": [hops.line()]},
        )
    if floor is None:
        why = "no durability floor in this run (tutti-agent not measured, or strace missing)"
        for name, _, _ in measured:
            result.issue_target(
                f"36:fork-over-floor:{name}", float("nan"), measured=why, profile={"lines": [why]}
            )
        result.issue_target(
            "36:floor-over-bare", float("nan"), measured=why, profile={"lines": [why]}
        )
    else:
        for name, host, bare in measured:
            own = (own_floors or {}).get(name, floor)
            floor_ms = bare.p50 + own.sync_ms
            lines = [own.line()]
            if hops is not None:
                lines.append(
                    f"host p50 - floor - hop floor = {host.p50 - floor_ms - hops.hops_ms:.1f} ms:"
                    " the host's own work beyond what the process view and the durability laws"
                    f" make any host wait for ({hops.line()})"
                )
            result.issue_target(
                f"36:fork-over-floor:{name}",
                ratio(host.p50, floor_ms),
                measured=f"bench.fork_overhead: {host.n} forks; host p50 {host.p50:.1f} ms,"
                f" bare {bare.p50:.1f} ms, floor {floor_ms:.1f} ms (bare + {own.sync_ms:.1f}"
                f" ms of syncs, {own.provider}'s)",
                profile={"lines": lines, "floorMs": floor_ms, "bareMs": bare.p50},
            )
        result.issue_target(
            "36:floor-over-bare",
            floor.sync_ms,
            measured=f"bench.sync_floor: {floor.store_commits:g} store COMMITs ×"
            f" {floor.commit.p50:.2f} ms + {floor.worker_rounds} worker fsync rounds ×"
            f" {floor.sync_round.p50:.2f} ms beyond the bare {floor.bare_ms:.1f} ms",
            profile={"lines": [floor.line()]},
        )
    for name, why in skipped:
        result.issue_target(
            f"36:fork-over-floor:{name}",
            float("nan"),
            measured=f"not measured: {why}",
            profile={"lines": [f"{name} was not measured: {why}"]},
        )


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
