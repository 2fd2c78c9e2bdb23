"""`bench.turn_overhead`'s INFO rows beside target 2: the hop floor at a Turn's cadence (its out
half after the idle a host Turn's submit came after, capped; its back half answered a delta's
spacing after the request) and host - bare over the turn floor plus that; the existing rows
keep their names."""

from __future__ import annotations

import time

import pytest

from bench import hop_floor
from bench.common import BenchResult, Latency, Mode
from bench.targets import ISSUE36, PROVIDER_NAMES
from bench.turn_floor import TurnFloor
from bench.turn_overhead import HOP_GAP_CAP_S, _cadence_hops, _cadence_targets


def test_the_rows_are_info_beside_target_2_after_the_existing_ones() -> None:
    keys = [t.key for t in ISSUE36]
    for p in PROVIDER_NAMES:
        for key in (f"36:turn-overhead:{p}", "36:turn-floor", f"36:turn-over-floor:{p}"):
            assert key in keys  # unchanged: other tooling reads them
        for key in (f"36:hop-floor-at-turn-cadence:{p}", f"36:turn-over-floors:{p}"):
            target = next(t for t in ISSUE36 if t.key == key)
            assert target.info and target.number == "2"
            assert keys.index(key) > keys.index(f"36:turn-over-floor:{p}")
    assert "36:hop-floor" in keys


@pytest.mark.timeout(60)
def test_the_hop_floor_at_a_turns_cadence_waits_the_turns_gaps_and_is_measured_once() -> None:
    measured: dict[tuple[float, float], hop_floor.HopFloor] = {}
    idle = Latency.of([500.0, 480.0, 520.0])  # Claude Code's half-second Turns: capped
    spacing = Latency.of([2.0, 2.1, 1.9])
    t0 = time.perf_counter()
    cadence = _cadence_hops(Mode.SMOKE, idle, spacing, measured)
    took = time.perf_counter() - t0
    assert cadence.gap_ms == HOP_GAP_CAP_S * 1000 and cadence.answer_gap_ms == 2.0
    assert cadence.chain.n == 10 and took >= 12 * 2 * (HOP_GAP_CAP_S + 0.002)
    assert cadence.out_ms > 0 and cadence.back_ms > 0
    # Another provider at the same gaps reuses the measurement.
    again = _cadence_hops(Mode.SMOKE, Latency.of([90.0]), Latency.of([2.04]), measured)
    assert again is cadence and len(measured) == 1


def test_the_rows_divide_host_minus_bare_by_both_floors() -> None:
    floor = TurnFloor(Latency.of([0.2]), Latency.of([0.1]), Latency.of([0.3]))  # 0.2+0.1+0.2
    ms = Latency.of([1.0])
    cadence = hop_floor.HopFloor(
        Latency.of([2.0]),
        Latency.of([0.5]),
        10.0,
        gap_ms=55.0,
        answer_gap_ms=2.0,
        chain_out=Latency.of([1.1]),
        chain_back=Latency.of([0.7]),
        pipe_out=Latency.of([0.2]),
        pipe_back=Latency.of([0.1]),
    )
    result = BenchResult("turn overhead", "", "smoke")
    _cadence_targets(result, "tutti-agent", 5.0, floor, cadence, Latency.of([54.0]), ms, ["a line"])
    hop, ratio = result.targets
    assert hop["key"] == "36:hop-floor-at-turn-cadence:tutti-agent" and hop["info"]
    assert hop["value"] == pytest.approx(0.9 + 0.6)
    assert "--gap 55 --answer-gap 2" in hop["measured"]
    assert ratio["key"] == "36:turn-over-floors:tutti-agent" and ratio["info"]
    assert ratio["value"] == pytest.approx(5.0 / (floor.floor_ms + 1.5), abs=1e-3)
