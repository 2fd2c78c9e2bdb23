"""SIGKILL a process in the middle of its group commits: every write it acknowledged is in the
store afterwards (a member returns only after the COMMIT that holds it returned), the file is
intact, and the workload did commit in groups (more than one write per COMMIT)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage.store import Store

WORKER = Path(__file__).with_name("group_crash_worker.py")
WS = "group-crash"
ROUNDS = 6

pytestmark = pytest.mark.timeout(180)


def test_sigkill_mid_group_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    rng = random.Random(2026_11_30)
    largest = 0
    acked_total = 0
    for round_no in range(ROUNDS):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(path), f"r{round_no}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lines.extend, args=(proc.stdout,), daemon=True)
        try:
            first = proc.stdout.readline()
            assert first.strip() == "ready", (first, proc.stderr.read() if proc.stderr else "")
            reader.start()
            # Kill once it has acknowledged some writes, at a random moment after that.
            deadline = time.monotonic() + 30
            while sum(1 for x in lines if x.startswith("ack")) < 20:
                assert time.monotonic() < deadline and proc.poll() is None, lines[-5:]
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        reader.join(10)
        assert proc.returncode == -9
        acked = [x.split()[1] for x in lines if x.startswith("ack ")]
        largest = max([largest, *(int(x.split()[1]) for x in lines if x.startswith("group "))])
        store = Store.open(path)
        try:
            conn = store.db.connection()
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            present = {
                r[0]
                for r in conn.execute(
                    "SELECT session_id FROM sessions WHERE workspace_id = ? AND session_id LIKE ?",
                    (WS, f"r{round_no}-%"),
                )
            }
            lost = [sid for sid in acked if sid not in present]
            assert lost == [], f"round {round_no}: acknowledged but not stored: {lost[:5]}"
            acked_total += len(acked)
        finally:
            store.close()
    assert acked_total > 0
    assert largest > 1, "the workload never committed two writes in one group"
