"""The Claude worker loads the SDK as it starts and freezes what its start loaded out of every
later collection (`drivers.worker_gc`, `ClaudeDriver.warm_up`): a full collection in it no
longer walks the SDK's ~70,000 objects (20–40 ms on the loop thread relaying a Turn's deltas).

A real worker process, spawned by the supervisor; it reports its counts once frozen."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from drivers.supervisor import WorkerSupervisor
from drivers.worker_gc import GC_REPORT_ENV

pytestmark = pytest.mark.timeout(120)


def test_the_claude_worker_freezes_the_sdk_it_loads_as_it_starts(tmp_path: Path) -> None:
    reports = tmp_path / "gc"
    reports.mkdir()
    with WorkerSupervisor(tmp_path / "run", env_overrides={GC_REPORT_ENV: str(reports)}) as sup:
        pid = sup.request("claude-code", "worker.ping", {}, 60).result(90)["pid"]
        report = reports / f"{pid}.json"
        deadline = time.monotonic() + 90
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        counts = json.loads(report.read_text())
    # The SDK in the permanent generation (the driver alone is ~25,000 objects)...
    assert counts["frozen"] > 60_000, counts
    # ...and what a full collection still walks: what was made after the freeze.
    assert counts["tracked"] < 10_000, counts
