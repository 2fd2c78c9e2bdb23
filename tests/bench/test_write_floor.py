"""The write floor `make bench` prints beside the mutation targets: 8 writers through the
store's own code and through bare SQLite (each write its own fsync, or grouped) on real files,
and the mutations benchmark's phase A in the same run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.write_floor import WRITERS, WS, DeviceIo, _sessions, store_loop
from storage.store import Store

REPO = Path(__file__).resolve().parents[2]


def test_the_store_writers_leave_every_turn_settled_and_the_last_title(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.sqlite3")
    try:
        sids = _sessions(store, tmp_path)
        assert len(sids) == WRITERS
        found = store_loop(store, sids)(3, time.monotonic() + 0.3)
        n = len(found["turn.submit"])
        assert n > 0 and len(found["session.updateTitle"]) == n
        assert store.turns.active_turn(WS, sids[3]) is None
        assert store.sessions.get_session(WS, sids[3]).title == f"title {n}"
    finally:
        store.close()


@pytest.mark.timeout(300)
def test_the_smoke_run_prints_each_window_the_floor_rows_and_phase_a(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.write_floor", "--smoke", "--json", str(tmp_path / "w.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "## 8 threads writing back to back" in out.stdout
    doc = json.loads((tmp_path / "w.json").read_text())
    figures = doc["figures"]
    windows = figures["windows"]
    assert list(windows) == ["store", "apsw serial", "apsw grouped"]
    assert set(windows["store"]["latency"]) == {"turn.submit", "session.updateTitle"}
    for name in ("apsw serial", "apsw grouped"):
        assert set(windows[name]["latency"]) == {"write"}
    for w in windows.values():
        for lat in w["latency"].values():
            assert lat["n"] > 0 and lat["p99"] > 0
        assert w["cpuProbeMs"] > 0
        # The device's own counters, where this kernel has them (17 fields since Linux 5.5).
        if w["device"] is not None:
            assert w["device"]["writes"] > 0 and w["device"]["flushes"] >= 0
    grouped = windows["apsw grouped"]
    assert 0 < grouped["fsyncs"] <= grouped["latency"]["write"]["n"]
    assert figures["diskP99Ms"] == min(
        windows[n]["latency"]["write"]["p99"] for n in ("apsw serial", "apsw grouped")
    )
    for kind in ("turn.submit", "session.updateTitle"):
        assert figures["mutationsPhaseA"][kind]["n"] > 0
    rows = {t["key"]: t for t in doc["targets"]}
    assert set(rows) == {"36:floor:write-p99", "36:floor:store-write-p99"}
    assert rows["36:floor:write-p99"]["value"] == round(figures["diskP99Ms"], 3)
    for row in rows.values():
        assert row["info"] is True and row["met"] is None and row["limit"] is None
        assert row["value"] > 0 and row["what"] in out.stdout


def test_the_device_counters_give_each_window_the_disks_own_mean_service_times(
    tmp_path: Path,
) -> None:
    before = DeviceIo(writes=100, write_ms=50, flushes=10, flush_ms=3)
    after = DeviceIo(writes=300, write_ms=250, flushes=50, flush_ms=23)
    assert after.since(before) == {
        "writes": 200,
        "writeMsMean": 1.0,
        "flushes": 40,
        "flushMsMean": 0.5,
    }
    idle = after.since(after)
    assert idle["writes"] == 0 and math.isnan(idle["flushMsMean"])
    dev = os.stat(tmp_path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    if stat.exists() and len(stat.read_text().split()) >= 17:
        first = DeviceIo.of(tmp_path)
        (tmp_path / "f").write_bytes(b"x" * 4096)
        fd = os.open(tmp_path / "f", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        second = DeviceIo.of(tmp_path)
        assert first is not None and second is not None
        assert second.writes > first.writes
