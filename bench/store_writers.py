"""The store's writers alone: eight threads renaming their own Session on a real store file
while other threads keep the GIL busy in Python, as the daemon's other threads do; per-rename
latency, renames per second and per COMMIT. Isolates what the writer baton, the group commit,
the WAL's fsync and the GIL switch interval do to a write, without the daemon's queues
(docs/performance.md, "Mutation tails: the GIL switch interval, and the fsync after the
baton"). Run it from each tree of an A/B, interleaved:

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.store_writers \\
        [--seconds 3] [--busy 2] [--switch-ms 5] [--dir /tmp]

`--dir /dev/shm` takes the disk's wait away (what is left is CPU and the GIL).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Latency
from storage.store import Store

WRITERS = 8
WS = "ws-store-writers"


@dataclass(frozen=True)
class Report:
    renames: int
    seconds: float
    latency: Latency
    commits: int
    cpu_ms: float

    def line(self) -> str:
        return (
            f"renames {self.renames} ({self.renames / self.seconds:.0f}/s), ms p50"
            f" {self.latency.p50:.2f} p90 {self.latency.p90:.2f} p99 {self.latency.p99:.2f};"
            f" {self.renames / max(1, self.commits):.1f} renames per COMMIT; process CPU"
            f" {self.cpu_ms / max(1, self.renames):.3f} ms per rename"
        )


def _busy(stop_at: float) -> None:
    """Python work in 2 ms slices with 1 ms pauses: a thread that wants the GIL often."""
    table: dict[int, int] = {}
    while time.monotonic() < stop_at:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            table[len(table) % 97] = len(table)
        time.sleep(0.001)


def measure(directory: str, seconds: float, busy: int) -> Report:
    with tempfile.TemporaryDirectory(dir=directory, prefix="store-writers-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            for i in range(WRITERS):
                store.sessions.create_session(
                    WS, session_id=f"s{i}", provider="p", title="t", cwd="/", settings={}
                )
            before = store.db.write_stats.snapshot()
            stop_at = time.monotonic() + seconds
            latencies: list[float] = []
            lock = threading.Lock()

            def rename(i: int) -> None:
                mine: list[float] = []
                n = 0
                while time.monotonic() < stop_at:
                    t0 = time.perf_counter()
                    store.sessions.update_title(WS, f"s{i}", f"title {n}")
                    mine.append((time.perf_counter() - t0) * 1000)
                    n += 1
                with lock:
                    latencies.extend(mine)

            threads = [threading.Thread(target=rename, args=(i,)) for i in range(WRITERS)]
            threads += [threading.Thread(target=_busy, args=(stop_at,)) for _ in range(busy)]
            cpu0 = time.process_time()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cpu_ms = (time.process_time() - cpu0) * 1000
            commits = store.db.write_stats.snapshot()["commits"] - before["commits"]
        finally:
            store.close()
    return Report(len(latencies), seconds, Latency.of(latencies), commits, cpu_ms)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.store_writers", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--busy", type=int, default=2, help="threads keeping the GIL busy")
    parser.add_argument("--switch-ms", type=float, default=5.0, help="GIL switch interval")
    parser.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    args = parser.parse_args(argv)
    sys.setswitchinterval(args.switch_ms / 1000)
    print(measure(args.dir, args.seconds, args.busy).line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
