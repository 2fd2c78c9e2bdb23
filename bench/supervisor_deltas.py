"""Probe: the worker supervisor's loop thread alone — its CPU and its wake-ups per streamed
delta (issue 36 target 2). Not a benchmark with targets: a `WorkerSupervisor` in this process
with three workers (as the daemon starts ahead), each the scripted worker of the loop's tests
(`tests/support/scripted_worker.py`: a real DEALER over ipc, no provider), one of which streams
`--deltas` deltas, a millisecond's pause after each (so nearly every delta wakes the loop), to a
sink that only counts them (on the loop thread, as the daemon's sink runs). The loop thread's
CPU comes from `/proc/self/task/TID/stat` (10 ms ticks: 4,000 deltas resolve 2.5 µs), its
wake-ups from its voluntary context switches. Before the stream, `--idle` seconds with the three
workers ready and nothing in flight give the idle loop's wake-ups per second (the scripted
workers send no heartbeat: every wake-up is the supervisor's own housekeeping).

Run it in two trees, alternating, to compare their loops on a shared machine:

    PYTHONPATH=$TREE build/venv/bin/python -m bench.supervisor_deltas [--deltas 4000] \
        [--idle 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms
from drivers.supervisor import WorkerSupervisor
from tests.support.scripted_worker import shim

TICK = os.sysconf("SC_CLK_TCK")


def thread_counters(tid: int) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of this process's thread `tid`."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    with open(f"/proc/self/task/{tid}/status") as f:
        status = f.read()
    switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return (int(fields[11]) + int(fields[12])) / TICK, switches


def run(deltas: int, idle: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir(mode=0o700)
        sup = WorkerSupervisor(run_dir, python=str(shim(Path(tmp))))
        ended = threading.Event()
        heard = [0]

        def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
            if event["type"] == "message.delta":
                heard[0] += 1
            elif event["type"] == "turn.completed":
                ended.set()

        try:
            sup.set_event_sink(sink)
            for provider in ("a", "b", "c"):
                sup.request(provider, "ping", {}, 15).result(30)
            time.sleep(0.5)
            tid = sup._loop_thread.native_id  # noqa: SLF001 - a probe of that one thread
            assert tid is not None
            _, idle0 = thread_counters(tid)
            time.sleep(idle)
            _, idle1 = thread_counters(tid)
            cpu0, woke0 = thread_counters(tid)
            began = time.monotonic()
            sup.request("a", "stream", {"sid": "s", "n": deltas, "every": 1}, 120)
            if not ended.wait(300):
                raise SystemExit("the stream did not end")
            cpu1, woke1 = thread_counters(tid)
            took = time.monotonic() - began
        finally:
            sup.close()
        if heard[0] != deltas:
            raise SystemExit(f"heard {heard[0]} of {deltas} deltas")
        return {
            "loopCpuUsPerDelta": (cpu1 - cpu0) / deltas * 1e6,
            "loopWakeupsPerDelta": (woke1 - woke0) / deltas,
            "idleWakeupsPerS": (idle1 - idle0) / idle if idle > 0 else 0.0,
            "seconds": took,
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--deltas", type=int, default=4000)
    parser.add_argument("--idle", type=float, default=0.0, help="seconds idle, measured first")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    probe = cpu_probe_ms()
    load = os.getloadavg()[0]
    figures = {**run(args.deltas, args.idle), "cpu_probe_ms": probe, "load": load}
    print(
        f"loop CPU {figures['loopCpuUsPerDelta']:.1f} us/delta, "
        f"{figures['loopWakeupsPerDelta']:.3f} wake-ups/delta, "
        f"idle {figures['idleWakeupsPerS']:.1f} wake-ups/s "
        f"({args.deltas} deltas in {figures['seconds']:.1f} s; load {load:.2f}, probe {probe} ms)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
