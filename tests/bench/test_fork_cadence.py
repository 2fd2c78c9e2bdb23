"""`bench.fork_overhead`'s INFO rows beside target 1: the gaps a host fork sees (the idle before
it, the bare fork run in between; the provider's own fork work before its answer), the hop
floor measured at them (`bench.hop_floor --gap --answer-gap`, shared by providers whose gaps
agree) and the host fork p50 over the durability floor plus that; the existing rows keep
their names."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from bench import hop_floor
from bench.common import BenchResult, Latency, Mode
from bench.fork_overhead import ForkCadence, _cadence_rows, cadence_hops, measure
from bench.providers import PROVIDERS
from bench.sync_floor import Floor
from bench.targets import ISSUE36, PROVIDER_NAMES


def test_the_rows_are_info_beside_target_1_after_the_existing_ones() -> None:
    keys = [t.key for t in ISSUE36]
    for p in PROVIDER_NAMES:
        for key in (f"36:fork-over-floor:{p}", "36:floor-over-bare", "36:hop-floor"):
            assert key in keys  # unchanged: other tooling reads them
        for key in (f"36:hop-floor-at-fork-cadence:{p}", f"36:fork-over-floors:{p}"):
            target = next(t for t in ISSUE36 if t.key == key)
            assert target.info and target.number == "1"
            assert target.module == "bench.fork_overhead"
            assert (
                keys.index("36:hop-floor") < keys.index(key) < keys.index(f"36:turn-overhead:{p}")
            )


@pytest.mark.timeout(120)
def test_each_host_fork_records_the_idle_before_it_with_the_bare_fork_in_between(
    tmp_path: Path,
) -> None:
    tutti = next(e for e in PROVIDERS if e.name == "tutti-agent")
    m = measure(tutti, tmp_path, turns=1, samples=4, warmup=1)
    idle, since, bare = m["hostIdleBefore"], m["sinceForkBefore"], m["bare"]
    # One gap before each timed fork but the first.
    assert m["host"].n == bare.n == 4 and idle.n == since.n == 3
    for i in range(3):
        # The bare fork of the previous sample ran inside the host's idle, and the idle since
        # the previous fork committed holds the acknowledgement's round trip as well.
        assert idle.samples[i] > bare.samples[i] > 0
        assert since.samples[i] > idle.samples[i]


@pytest.mark.timeout(90)
def test_the_hop_floor_at_a_forks_cadence_waits_the_forks_gaps_and_is_shared() -> None:
    measured: dict[tuple[float, float], hop_floor.HopFloor] = {}
    idle, since = Latency.of([10.2, 10.4, 9.9]), Latency.of([11.0, 11.5, 11.2])
    work = Latency.of([4.8, 5.1, 4.9])
    t0 = time.perf_counter()
    cadence = cadence_hops(Mode.SMOKE, idle, since, work, measured)
    took = time.perf_counter() - t0
    # The gaps rounded to half a millisecond: 10.2 → 10, 4.9 → 5.
    assert (cadence.hops.gap_ms, cadence.hops.answer_gap_ms) == (10.0, 5.0)
    assert cadence.hops.chain.n == 10
    # Every sample (warm-up included), both ways, idled the gap and was answered after the work.
    assert took >= 12 * 2 * (0.010 + 0.005)
    assert cadence.hops.chain.p50 >= 5 and cadence.hops.pipe.p50 >= 5
    assert cadence.hop_ms == pytest.approx(cadence.hops.out_ms + cadence.hops.back_ms)
    assert "--gap 10 --answer-gap 5" in cadence.words()
    # A provider whose gaps agree to the half millisecond shares the measurement.
    again = cadence_hops(Mode.SMOKE, Latency.of([9.8]), since, Latency.of([5.2]), measured)
    assert again.hops is cadence.hops and len(measured) == 1
    # A long idle (Codex's ~50 ms bare fork) is capped.
    capped = cadence_hops(Mode.SMOKE, Latency.of([500.0]), since, Latency.of([0.1]), measured)
    assert capped.hops.gap_ms == 60.0 and capped.hops.answer_gap_ms == 0.0
    assert len(measured) == 2


def _cadence(out: float, back: float) -> ForkCadence:
    hops = hop_floor.HopFloor(
        Latency.of([2.0]),
        Latency.of([0.5]),
        10.0,
        gap_ms=1.5,
        answer_gap_ms=1.5,
        chain_out=Latency.of([0.2 + out]),
        chain_back=Latency.of([0.1 + back]),
        pipe_out=Latency.of([0.2]),
        pipe_back=Latency.of([0.1]),
    )
    return ForkCadence(Latency.of([1.6]), Latency.of([2.6]), Latency.of([1.4]), hops)


def test_the_rows_divide_the_host_fork_by_both_floors() -> None:
    floor = Floor(1.4, 2.0, 1, Latency.of([0.25]), Latency.of([0.5]))  # syncs: 2×0.25+0.5 = 1
    back_to_back = hop_floor.HopFloor(Latency.of([0.6]), Latency.of([0.2]), 10.0)
    host, bare = Latency.of([5.0]), Latency.of([1.4])
    result = BenchResult("fork overhead", "", "smoke")
    cadences = {"tutti-agent": _cadence(0.3, 0.2), "codex": _cadence(0.5, 0.5)}
    measured = [("tutti-agent", host, bare), ("codex", Latency.of([30.0]), Latency.of([45.0]))]
    skipped = [("claude-code", "no CLI")]
    _cadence_rows(result, measured, floor, back_to_back, cadences, skipped)
    by_key = {t["key"]: t for t in result.targets}
    hop = by_key["36:hop-floor-at-fork-cadence:tutti-agent"]
    assert hop["info"] and hop["value"] == pytest.approx(0.5)
    assert "--gap 1.5 --answer-gap 1.5" in hop["measured"]
    over = by_key["36:fork-over-floors:tutti-agent"]
    # host 5.0 / (bare 1.4 + syncs 1.0 + hop 0.5)
    assert over["info"] and over["value"] == pytest.approx(5.0 / 2.9, abs=1e-3)
    assert over["profile"]["floorMs"] == pytest.approx(2.4)
    # host - floor = 2.6 ms, of which the hop floor 0.5 (19 %).
    assert any("2.60 ms, of which" in line and "19 %" in line for line in over["profile"]["lines"])
    # Codex's host is under its floor: the ratio still printed, no share of a negative excess.
    assert by_key["36:fork-over-floors:codex"]["value"] == pytest.approx(30.0 / 47.0, abs=1e-3)
    for key in ("36:hop-floor-at-fork-cadence:claude-code", "36:fork-over-floors:claude-code"):
        assert by_key[key]["value"] is None and "no CLI" in by_key[key]["measured"]
    (table,) = result.tables
    tutti, codex = table.rows
    assert tutti[0] == "tutti-agent" and tutti[8] == pytest.approx(0.5)  # hop at cadence
    assert tutti[9] == pytest.approx(0.4)  # back to back, beside it
    assert tutti[13] == pytest.approx(0.5 / 2.6)  # its share of host - floor
    assert math.isnan(codex[13])


def test_without_a_durability_floor_the_ratio_says_why() -> None:
    result = BenchResult("fork overhead", "", "smoke")
    measured = [("codex", Latency.of([30.0]), Latency.of([45.0]))]
    _cadence_rows(result, measured, None, None, {"codex": _cadence(0.3, 0.2)}, [])
    by_key = {t["key"]: t for t in result.targets}
    assert by_key["36:hop-floor-at-fork-cadence:codex"]["value"] == pytest.approx(0.5)
    ratio = by_key["36:fork-over-floors:codex"]
    assert ratio["value"] is None and "no durability floor" in ratio["measured"]
