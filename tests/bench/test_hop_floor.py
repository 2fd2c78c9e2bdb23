"""bench.hop_floor: a no-work request crosses the process view's path — a daemon process whose
loop hands it to an actor, a worker process, an app-server behind the worker's pipes — and the
bare side is the same request down an app-server's pipes from the bench itself; every process
it started is gone after."""

from __future__ import annotations

import os

import pytest

from bench.hop_floor import measure


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
    assert set(floor.to_json()) == {"hopsMs", "chain", "pipe", "cpuProbeMs"}
    assert _gone(floor.chain_server) and _gone(floor.pipe_server)
