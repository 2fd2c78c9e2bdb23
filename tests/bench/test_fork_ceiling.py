"""The fork ceiling `make bench` prints beside the throughput target: the bare provider's forks
at each level, the syncs a host fork cannot skip done with the binder's own code and a group
committer on real files, and the host measured in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import apsw
import pytest

from bench.fork_ceiling import Drive, GroupCommit, Source, Syncs, bare_window
from bench.providers import BareAppServer, _tutti_argv

REPO = Path(__file__).resolve().parents[2]


def test_every_waiting_writer_is_held_by_one_durable_commit_of_the_group(tmp_path: Path) -> None:
    committer = GroupCommit(tmp_path / "g.sqlite3")
    go = threading.Event()

    def writer() -> None:
        go.wait()
        for _ in range(25):
            committer.commit()

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(60)
    committer.close()
    assert committer.rows == 200
    # Writers that waited together shared a COMMIT (one fsync), never fewer rows than calls.
    assert 25 <= committer.commits < 200
    conn = apsw.Connection(str(tmp_path / "g.sqlite3"))
    try:
        assert conn.execute("SELECT count(*) FROM ops").fetchall() == [(200,)]
        assert conn.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
    finally:
        conn.close()


@pytest.mark.timeout(180)
def test_a_driver_fork_with_its_syncs_binds_each_child_into_a_fresh_target_home(
    tmp_path: Path,
) -> None:
    bare = BareAppServer(_tutti_argv(), "TUTTI_AGENT_HOME", tmp_path / "bare", {})
    committer = GroupCommit(tmp_path / "store.sqlite3")
    (tmp_path / "targets").mkdir()
    try:
        bare.run_turns(2, lambda k: f"turn {k}")
        source = Source(bare, tmp_path / "bare", tmp_path / "targets")
        for _ in range(3):
            source.fork_driver(Syncs(committer, 2))
        window = bare_window([source], Drive.DRIVER_SYNCS, 0.5, Syncs(committer, 2))
    finally:
        bare.close()
        committer.close()
    homes = list((tmp_path / "targets").iterdir())
    assert len(homes) == 3 + window.forks and window.forks > 0
    for home in homes:
        (bound,) = home.glob("sessions/rollout-*.jsonl")
        # The child's own bytes, as the provider wrote them in the source's home.
        (child,) = (tmp_path / "bare").glob(f"sessions/{bound.name}")
        assert bound.read_bytes() == child.read_bytes()
        assert not list(home.rglob("*.tmp"))
    # Each fork's two COMMITs, one before the provider call, one after the bind.
    assert committer.rows == 2 * len(homes)
    assert window.store_commits_held == 2 * window.forks
    assert window.app_server_cpu_s > 0 and window.bench_cpu_s > 0


@pytest.mark.timeout(300)
def test_the_smoke_run_prints_every_drive_and_the_host_with_the_ceiling_rows(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.fork_ceiling", "--smoke", "--json", str(tmp_path / "c.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "## forks/s by drive and concurrent clients" in out.stdout
    doc = json.loads((tmp_path / "c.json").read_text())
    windows = doc["figures"]["windows"]
    assert [(w["drive"], w["clients"]) for w in windows] == [
        ("bare", 1),
        ("bare", 2),
        ("driver", 2),
        ("driver+syncs", 1),
        ("driver+syncs", 2),
        ("host", 2),
    ]
    commits = doc["figures"]["storeCommitsPerFork"]
    assert commits >= 1
    for w in windows:
        assert w["forks"] > 0 and w["forksPerSecond"] > 0, w
        assert w["cpuMsPerFork"]["app-server"] > 0 and w["cpuMsPerFork"]["bench"] > 0, w
        assert w["cpuProbeMs"] > 0 and w["loadAverage1m"] is not None
        if w["drive"] == "driver+syncs":
            assert w["storeCommitsHeld"] == commits * w["forks"] and w["storeFsyncs"] > 0
    rows = {t["key"]: t for t in doc["targets"]}
    assert set(rows) == {"36:ceiling:forks-per-s", "36:ceiling:cpu-per-fork"}
    assert rows["36:ceiling:forks-per-s"]["value"] == round(windows[4]["forksPerSecond"], 3)
    for row in rows.values():
        assert row["info"] is True and row["met"] is None and row["limit"] is None
        assert row["value"] > 0 and row["profile"]["lines"]
        assert row["what"] in out.stdout
    assert doc["figures"]["hostOverCeiling"] == pytest.approx(
        windows[5]["forksPerSecond"] / windows[4]["forksPerSecond"], abs=1e-3
    )
