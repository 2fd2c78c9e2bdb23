"""The daemon process freezes what start-up left out of its garbage collections
(`agenthost.gc_policy`), and with `AGENTHOST_GC_TIMING` records each collection's pause.

A real daemon process (real store, real worker and tutti-agent app-server); the summary is
the file the daemon writes when it stops."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from agenthost.gc_policy import GcTimings, freeze_start_up
from tests.support.daemon import DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(120)


def test_the_daemon_freezes_its_start_up_and_writes_its_gc_summary_at_stop(tmp_path: Path) -> None:
    summary = tmp_path / "gc.json"
    d = DaemonProcess(tmp_path / "home", env={"AGENTHOST_GC_TIMING": str(summary)}).start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        for i in range(3):
            assert run_turn(c, sid, f"turn {i}")["outcome"] == "completed"
    finally:
        assert d.stop() == 0
    out = json.loads(summary.read_text())
    # Start-up's objects (modules, pools, the catalog) sit in the permanent generation.
    assert out["frozen"] > 10_000, out
    for generation in ("gen0", "gen1", "gen2"):  # each collection's pause, by generation
        assert out[generation]["max"] >= out[generation]["p50"] >= 0.0, out


def test_gc_timings_count_each_collection_by_generation(tmp_path: Path) -> None:
    timings = GcTimings(str(tmp_path / "gc.json"))
    gc.callbacks.append(timings._on_gc)
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        timings.close()
    out = json.loads((tmp_path / "gc.json").read_text())
    assert out["gen0"]["n"] >= 1 and out["gen2"]["n"] >= 1, out
    assert timings._on_gc not in gc.callbacks


def test_freezing_moves_live_objects_out_of_the_collected_generations() -> None:
    before = gc.get_freeze_count()
    kept = [[] for _ in range(100)]  # containers: the collector tracks them
    try:
        freeze_start_up()
        assert gc.get_freeze_count() >= before + 100
    finally:
        gc.unfreeze()  # this is the test process, not a daemon: give them back
    assert kept
