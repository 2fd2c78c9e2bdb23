"""bench/fork_threads.py's readers (the events counted a fork, the profile's rows by thread) and
bench/fork_daemon.py's `--own-workspaces` names; one short run of the probe itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from bench.fork_daemon import client_workspace
from bench.fork_threads import COUNTER_THREAD, EventCounter, event_rows, event_type, thread_rows

REPO = Path(__file__).resolve().parents[2]


def test_an_events_type_is_read_from_its_body() -> None:
    packed = msgpack.packb({"type": "fork.operation", "operation": {}})
    assert event_type(packed) == "fork.operation"
    assert event_type(msgpack.packb([1, 2])) == "?"
    assert event_type(b"\xc1") == "?"


def test_events_and_bytes_a_fork_and_what_the_clients_were_sent() -> None:
    counter = EventCounter("ipc:///nowhere")
    for body in (
        msgpack.packb({"type": "fork.operation", "x": "a" * 10}),
        msgpack.packb({"type": "fork.operation", "x": "a" * 10}),
        msgpack.packb({"type": "session.upserted"}),
    ):
        counter.add(body)
    rows = event_rows(counter.by_type, counter.bytes_by_type, forks=2, clients=16)
    assert rows["eventsPerFork"] == {"fork.operation": 1.0, "session.upserted": 0.5}
    assert rows["events"] == 1.5
    size = sum(counter.bytes_by_type.values())
    assert rows["bytes"] == size / 2
    # Each event is two frames (topic, body), sent to each of the 16 subscribers.
    assert rows["sentFramesToClients"] == 2 * 1.5 * 16
    assert rows["sentBytesToClients"] == size / 2 * 16


def test_thread_rows_leave_out_the_probes_own_thread_and_rank_by_own_time() -> None:
    f1, f2 = ("/x/a.py", 1, "slow"), ("/x/b.py", 2, "fast")
    stats = {
        "session": {f1: (10, 0.004, 0.004), f2: (30, 0.001, 0.001)},
        COUNTER_THREAD: {f1: (100, 1.0, 1.0)},
        "idle": {f2: (1, 0.0, 0.0)},
    }
    rows = thread_rows(stats, forks=10, top=1)
    assert set(rows) == {"session"}  # the probe's thread out; "idle" under 0.5 calls a fork
    assert rows["session"]["calls"] == 4.0
    assert rows["session"]["cpuMs"] == pytest.approx(0.5)
    assert [f["function"] for f in rows["session"]["top"]] == ["slow /x/a.py:1"]


def test_own_workspaces_are_no_prefix_of_one_another() -> None:
    """ZeroMQ's subscriptions are prefix matches: a client subscribed to its workspace must not
    be sent another client's events."""
    names = [client_workspace(n) for n in range(200)]
    assert len(set(names)) == 200
    assert not [(a, b) for a in names for b in names if a != b and b.startswith(a)]


@pytest.mark.timeout(300)
def test_the_probe_prints_a_forks_threads_and_events(tmp_path: Path) -> None:
    out_json = tmp_path / "threads.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.fork_threads",
            "--clients",
            "2",
            "--seconds",
            "2",
            "--top",
            "3",
            "--json",
            str(out_json),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out_json.read_text())
    assert result["forks"] > 0
    assert "session" in result["threads"] and COUNTER_THREAD not in result["threads"]
    assert result["events"]["eventsPerFork"].get("fork.operation", 0) >= 1
    assert result["items"]["API requests decoded (client -> daemon)"]
