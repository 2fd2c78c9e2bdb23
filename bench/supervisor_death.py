"""Probe: how soon the worker supervisor sees a worker die — milliseconds from a SIGKILL of a
ready, idle worker to the `WorkerLost` of the request it held. Not a benchmark with targets: a
`WorkerSupervisor` in this process with one scripted worker (`tests/support/scripted_worker.py`:
a real PAIR over ipc, no provider, no heartbeat), killed `--kills` times, each incarnation
holding one request with no deadline (its answer would come after 30 s).

Run it in two trees, alternating (the file from a tree that has it, the supervisor from $TREE):

    PYTHONPATH=$TREE build/venv/bin/python /work/wt-turnwake/bench/supervisor_death.py [--kills 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from drivers.errors import WorkerLost
from drivers.supervisor import WorkerSupervisor
from tests.support.scripted_worker import shim


def lags_ms(kills: int) -> list[float]:
    """Each kill's milliseconds from `kill` to the held request's `WorkerLost`."""
    lags: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir(mode=0o700)
        sup = WorkerSupervisor(run_dir, python=str(shim(Path(tmp))))
        try:
            for _ in range(kills):
                sup.request("s", "ping", {}, 15).result(30)  # a new incarnation, ready
                pid = sup.status()[0]["pid"]
                assert isinstance(pid, int)
                held = sup.request("s", "burst", {"sid": "x", "n": 1, "pauseMs": 30_000}, None)
                time.sleep(0.3)  # sent; the loop idle again
                began = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                try:
                    held.result(10)
                except WorkerLost:
                    lags.append((time.monotonic() - began) * 1000)
                else:
                    raise SystemExit("the held request was answered")
                time.sleep(0.2)
        finally:
            sup.close()
    return lags


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--kills", type=int, default=10)
    args = parser.parse_args(argv)
    lags = lags_ms(args.kills)
    print(
        f"kill -> WorkerLost, ms: p50 {statistics.median(lags):.1f}, max {max(lags):.1f} "
        f"({args.kills} kills; load {os.getloadavg()[0]:.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
