"""bench.wake_cost: one wake-up, one-way, stamped by the woken side — a thread blocked on a
queue and a child process blocked on a pipe — back to back and after idle, on two CPUs and
pinned to one."""

from __future__ import annotations

import os

import pytest

from bench.wake_cost import measure as wake_measure
from bench.wake_cost import pipe_hop, thread_handoff


@pytest.mark.timeout(60)
def test_every_probe_placement_and_gap_is_measured() -> None:
    cost = wake_measure(samples=4, gap_s=0.005)
    assert cost.gap_ms == 5.0 and cost.n == 4
    assert len(cost.p50_us) == 12
    assert all(v >= 0 for v in cost.p50_us.values())
    lines = cost.lines()
    assert len(lines) == 4 and all("after 5 ms idle" in line for line in lines)
    assert all("after 5 ms spinning" in line for line in lines)


@pytest.mark.timeout(60)
def test_a_pinned_probe_runs_on_one_cpu_and_leaves_the_affinity_as_it_was() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    assert thread_handoff(3, 0.0, cpu).n == 3
    assert pipe_hop(3, 0.002, cpu).n == 3
    assert pipe_hop(3, 0.002, cpu, busy=True).n == 3
    assert os.sched_getaffinity(0) == before
