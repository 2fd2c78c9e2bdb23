"""What a stop's end of what its runtime left costs (docs/design/drivers.md, "What a stop
ends"): a tutti-agent Session's `session.stop` after a Turn, in interleaved A/B pairs — A as
the driver runs it (the app-server's close, then one `/proc` scan for its marker), B the same
stop with the scan skipped (`may_leave` cleared) — its wall time and this process's CPU (the
worker's: the driver runs in-process here); and one scan alone, with how many processes
`/proc` held. Run: `build/venv/bin/python -m bench.stop_scan [pairs]`."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms
from domain.procfs import processes_marked
from drivers.failpoints import Failpoints
from drivers.runtime_marker import RUNTIME_VAR
from drivers.tutti_agent import create_driver

TUTTI_BIN = str(Path(sys.executable).parent / "tutti-agent")


def _one_stop(root: Path, n: int, scan: bool) -> tuple[float, float]:
    """(wall ms, CPU ms) of one stop of a Session that ran one Turn."""
    driver = create_driver({"command": TUTTI_BIN}, Failpoints())
    done = threading.Event()

    def emit(_sid: str, event: Any) -> None:
        if event.to_wire().get("type") == "turn.completed":
            done.set()

    try:
        sid = f"s{n}"
        home = root / sid / "tutti-agent-home"
        driver.start_session(
            {"agentSessionId": sid, "home": str(home), "cwd": str(root), "settings": {}}
        )
        driver.start_turn({"agentSessionId": sid, "turnId": "t", "text": "hi"}, emit)
        if not done.wait(30):
            raise RuntimeError("the Turn did not complete")
        runtime = driver._sessions[sid].runtime  # noqa: SLF001 - the bench's B arm
        assert runtime is not None
        runtime.proc.marker.may_leave = scan
        wall, cpu = time.perf_counter(), time.process_time()
        driver.stop_session({"agentSessionId": sid})
        return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000
    finally:
        driver.close()


def main(pairs: int = 10) -> None:
    probe = cpu_probe_ms()
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="stop-scan-") as tmp:
        root = Path(tmp)
        for i in range(pairs):
            # Interleaved, the order alternating: a shared machine's load meets both arms.
            first, second = (True, False) if i % 2 == 0 else (False, True)
            for scan in (first, second):
                (a if scan else b).append(_one_stop(root, 2 * i + int(scan), scan))
    scans = []
    for _ in range(20):
        cpu = time.process_time()
        processes_marked(RUNTIME_VAR, {"no-such-runtime"})
        scans.append((time.process_time() - cpu) * 1000)
    procs = sum(1 for name in os.listdir("/proc") if name.isdigit())

    def med(rows: list[tuple[float, float]], at: int) -> float:
        return statistics.median(r[at] for r in rows)

    print(f"cpu probe {probe:.1f} ms; load {os.getloadavg()[0]:.1f}; {procs} processes in /proc")
    print(f"stop, scan (A):    wall p50 {med(a, 0):.1f} ms, cpu p50 {med(a, 1):.1f} ms ({pairs})")
    print(f"stop, no scan (B): wall p50 {med(b, 0):.1f} ms, cpu p50 {med(b, 1):.1f} ms ({pairs})")
    deltas = [x[1] - y[1] for x, y in zip(a, b, strict=True)]
    print(f"A - B cpu per pair: p50 {statistics.median(deltas):.1f} ms")
    print(f"one scan alone: cpu p50 {statistics.median(scans):.1f} ms (20)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
