"""Probe: where the daemon's CPU per streaming Turn goes, thread by thread (issue 36 targets 2
and 4). Not a benchmark with targets: it runs `bench.turn_overhead`'s host side alone — a
tutti-agent Session on the same timed fake model, the same reply streamed in `--deltas`
four-character deltas 2 ms apart — for `--turns` Turns after three warm ones, and prints each
daemon thread's CPU ms per Turn (utime + stime from `/proc/PID/task/TID/stat`, 10 ms ticks:
use 100 Turns or more) and its voluntary context switches per Turn (how often it slept and
was woken), with the host Turn's p50 and its `before` / `after` stages as the bench defines
them. Thread names come from `py-spy dump` when py-spy is installed (Python 3.11 does not
name its threads for the kernel), else the kernel's `comm`.

Run the same probe in two trees, alternating, to compare them on a shared machine (the CPU
per Turn moves with the load, less than the latencies do):

    PYTHONPATH=$TREE build/venv/bin/python -m bench.turn_threads --turns 100 [--deltas 20]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import bench.turn_overhead as turns
from bench.harness import WS, BenchDaemon, cpu_by_kind, create_session, run_turn, tree
from bench.profile import py_spy
from model_fakes.responses import ResponsesServer
from transport.client import EventSubscriber

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[tuple[str, str], tuple[float, int]]:
    """(tid, comm) → (CPU seconds, voluntary context switches) of each thread of `pid`."""
    out: dict[tuple[str, str], tuple[float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            with open(f"{base}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M)
        out[(tid, comm)] = (
            (int(fields[11]) + int(fields[12])) / TICK,
            int(switches.group(1)) if switches else 0,
        )
    return out


def thread_names(pid: int) -> dict[str, str]:
    """tid → the Python thread's name, from `py-spy dump` (empty without py-spy)."""
    spy = py_spy()
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    return dict(re.findall(r'Thread (\d+) \((?:active|idle)[^)]*\): "([^"]*)"', dump))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=turns.DELTAS)
    args = parser.parse_args(argv)
    turns.REPLY = "".join(f"d{i:02d} " for i in range(args.deltas))
    n = max(1, args.turns)
    server = turns.timed_model(ResponsesServer, "response.output_text.delta")
    tmp = Path(tempfile.mkdtemp(prefix="bench-turn-threads-"))
    config = {"model_base_url": server.base_url, "wire_api": "responses"}
    daemon = BenchDaemon(tmp / "home", providers={"tutti-agent": config}).start()
    sub = EventSubscriber(daemon.events, [WS])
    try:
        c = daemon.client()
        sid = create_session(c, "turn threads", provider="tutti-agent")
        for i in range(3):
            run_turn(c, sid, f"warm {i}")
        time.sleep(0.3)
        load = os.getloadavg()[0]
        before, kinds_before = threads(daemon.pid), cpu_by_kind(tree(daemon.pid))
        samples = []
        for i in range(n):
            t0 = turns.now_ms()
            ms, arrivals = turns.host_turn(c, sub, sid, f"turn {i}")
            begun, emitted = server.reply_for(arrivals, t0)
            samples.append(turns.Sample(ms, arrivals, emitted, t0=t0, begun=begun))
        after, kinds_after = threads(daemon.pid), cpu_by_kind(tree(daemon.pid))
        names = thread_names(daemon.pid)
    finally:
        sub.close()
        daemon.stop()
        server.close()
    rows = []
    for key, (cpu, switches) in after.items():
        cpu0, switches0 = before.get(key, (0.0, 0))
        if cpu > cpu0 or switches > switches0:
            rows.append(
                (1000 * (cpu - cpu0) / n, (switches - switches0) / n, names.get(key[0], key[1]))
            )
    rows.sort(reverse=True)
    print(f"{n} Turns of {args.deltas} deltas, load {load:.2f} at start")
    print(f"daemon threads: {sum(r[0] for r in rows):.2f} CPU ms per Turn")
    for cpu, switches, name in rows:
        print(f"  {cpu:6.2f} ms  {switches:6.1f} wake-ups  {name}")
    kinds = {
        k: round(1000 * (kinds_after.get(k, 0) - kinds_before.get(k, 0)) / n, 2)
        for k in kinds_after
    }
    print(f"by process kind, CPU ms per Turn: {kinds}")
    mid = n // 2
    turn_p50 = sorted(s.turn_ms for s in samples)[mid]
    before_p50 = sorted(s.before_model_ms for s in samples)[mid]
    after_p50 = sorted(s.after_model_ms for s in samples)[mid]
    print(
        f"host Turn p50 {turn_p50:.1f} ms; before the model p50 {before_p50:.1f},"
        f" after it p50 {after_p50:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
