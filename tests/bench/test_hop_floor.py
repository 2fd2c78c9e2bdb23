"""bench.hop_floor: a no-work request crosses the process view's path — a daemon process whose
loop hands it to an actor, a worker process, an app-server behind the worker's pipes — and the
bare side is the same request down an app-server's pipes from the bench itself; every process
it started is gone after."""

from __future__ import annotations

import os
import time

import pytest

from bench.hop_floor import main, measure


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(60)
def test_hop_floor_crosses_every_process_and_stops_them() -> None:
    floor = measure(samples=20, warmup=3)
    assert floor.chain.n == floor.pipe.n == 20
    # Each way was answered by one app-server, and not the same one: the chain's is the
    # worker's child, behind the daemon.
    assert floor.chain_server > 0 and floor.pipe_server > 0
    assert floor.chain_server != floor.pipe_server
    # The chain carries the pipe's leg and more: its median cannot be below the pipe's.
    assert floor.chain.p50 > floor.pipe.p50
    assert floor.hops_ms == pytest.approx(floor.chain.p50 - floor.pipe.p50)
    assert "hop floor on this machine" in floor.line()
    assert {"hopsMs", "chain", "pipe", "cpuProbeMs"} <= set(floor.to_json())
    assert "back to back" in floor.line() and floor.to_json()["gapMs"] == 0.0
    assert _gone(floor.chain_server) and _gone(floor.pipe_server)


@pytest.mark.timeout(60)
def test_a_gap_idles_before_every_sample_both_ways_and_the_line_says_so() -> None:
    samples, warmup, gap = 10, 2, 0.03
    t0 = time.perf_counter()
    floor = measure(samples=samples, warmup=warmup, gap_s=gap)
    took = time.perf_counter() - t0
    # Each chain sample and each pipe sample came after its own gap.
    assert took >= (samples + warmup) * 2 * gap
    assert floor.gap_ms == 30.0 and floor.answer_gap_ms == 0.0
    assert "30 ms idle before each" in floor.line()
    assert floor.to_json()["gapMs"] == 30.0
    # Each way splits into its halves, stamped by the app-server that answered.
    for half in (floor.chain_out, floor.chain_back, floor.pipe_out, floor.pipe_back):
        assert half.n == samples and half.p50 > 0
    assert floor.chain_out.p50 < floor.chain.p50 and floor.chain_back.p50 < floor.chain.p50
    assert floor.out_ms == pytest.approx(floor.chain_out.p50 - floor.pipe_out.p50)
    # A chain wakes threads in three processes; the pipe only its echo: both counted.
    assert floor.chain_switches > 4 * floor.pipe_switches > 0


@pytest.mark.timeout(60)
def test_an_answer_gap_delays_each_answer_on_both_ways_and_cancels_out() -> None:
    floor = measure(samples=6, warmup=1, answer_gap_s=0.02)
    assert floor.answer_gap_ms == 20.0 and "answered 20 ms after read" in floor.line()
    # Both ways wait the same 20 ms in the app-server, which the halves leave out.
    assert floor.chain.p50 >= 20 and floor.pipe.p50 >= 20
    assert floor.chain_back.p50 < 20 and floor.pipe_back.p50 < 20
    assert floor.hops_ms < 20


@pytest.mark.timeout(60)
def test_the_command_takes_a_gap(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    assert main(["--samples", "5", "--warmup", "1", "--gap", "25"]) == 0
    assert time.perf_counter() - t0 >= 6 * 2 * 0.025
    out = capsys.readouterr().out
    assert "25 ms idle before each" in out
    assert "bench.hop_floor --samples 5 --gap 25" in out
