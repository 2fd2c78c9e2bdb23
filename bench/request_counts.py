"""What one rename costs the daemon, by thread, in counts the machine's load barely moves: its
threads' CPU and voluntary context switches per rename over `--renames` (from /proc), and, with
`--strace N`, every system call of the daemon over N more renames by thread and call
(`strace -f`). One client renames one Session back to back, an events subscriber connected
(`bench.stall_cpu`'s loop). Not a timing benchmark of record.

This file runs with the code of whichever tree leads PYTHONPATH (the daemon is started from
that tree's `bench.harness`), so one copy measures two trees, interleaved:

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python <this checkout>/bench/request_counts.py \\
        [--renames 3000] [--strace 300]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.common import thread_counters
from bench.harness import BenchDaemon, create_session, run_turn
from bench.loadgen import LeanClient, Waiter, request

WS = "ws-bench"
SITE = Path(__file__).resolve().parent / "stamp_site"


def _renames(c: LeanClient, sid: str, n: int, tag: str) -> None:
    for i in range(n):
        status, body = request(
            c,
            "session.updateTitle",
            {"workspaceId": WS, "agentSessionId": sid, "title": f"{tag} {i}"},
        )
        if status >= 400:
            raise RuntimeError(f"updateTitle answered {status}: {body}")


def _name(pid: int, tid: str) -> str:
    comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    return re.sub(r"[_-]?\d+$", "", comm)


def _top(d: dict[str, float], fmt: str, floor: float) -> str:
    items = sorted(d.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:{fmt}}" for k, v in items if v >= floor)


def _syscalls(pid: int, run: Path, renames: int, go: object) -> list[str]:
    names = {tid: _name(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")}
    out = run / "strace.txt"
    spy = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", str(out), "-p", str(pid)], stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)  # attached to every thread before the measured renames
    assert callable(go)
    go()
    time.sleep(0.3)
    spy.send_signal(2)
    spy.wait(30)
    calls: Counter[tuple[str, str]] = Counter()
    for line in out.read_text().splitlines():
        m = re.match(r"(\d+)\s+(?:<\.\.\. )?(\w+)", line)
        if m is None or "<unfinished" in line:
            continue
        calls[(names.get(m.group(1), m.group(1)), m.group(2))] += 1
    by_thread: Counter[str] = Counter()
    for (thread, _), n in calls.items():
        by_thread[thread] += n
    lines = []
    for thread, n in by_thread.most_common():
        if n / renames < 0.5:
            continue
        top = ", ".join(
            f"{call} {v / renames:.2f}"
            for (t, call), v in calls.most_common()
            if t == thread and v / renames >= 0.1
        )
        lines.append(f"  {thread}: {n / renames:.1f} system calls per rename [{top}]")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--renames", type=int, default=3000)
    p.add_argument("--strace", type=int, default=0, help="renames under strace -f (0: none)")
    args = p.parse_args(argv)
    # Threads named for the kernel (`bench/stamp_site`), as `bench/fork_daemon.py` does.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(SITE), os.environ.get("PYTHONPATH", "")) if x
    )
    os.environ["AGENTHOST_NAME_THREADS"] = "1"
    tick = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="bench-request-counts-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        try:
            c = daemon.client()
            sid = create_session(c, "counts", ws=WS)
            run_turn(c, sid, "warm up", ws=WS)
            lean = LeanClient(daemon.api)
            waiter = Waiter(lean, daemon.events)
            try:
                _renames(lean, sid, 500, "warm")
                n = args.renames
                before = thread_counters(daemon.pid)
                t0 = time.monotonic()
                _renames(lean, sid, n, "m")
                elapsed = time.monotonic() - t0
                after = thread_counters(daemon.pid)
                delta = {k: after[k] - before.get(k, 0) for k in after}
                cs = {k[3:]: v / n for k, v in delta.items() if k.startswith("cs:")}
                cpu = {k[4:]: v / tick * 1000 / n for k, v in delta.items() if k.startswith("cpu:")}
                print(
                    f"load {os.getloadavg()[0]:.1f}: {n} renames in {elapsed:.1f} s;"
                    f" daemon CPU {sum(cpu.values()):.3f} ms per rename"
                    f" [{_top(cpu, '.3f', 0.01)}]"
                )
                print(f"  wake-ups {sum(cs.values()):.2f} per rename [{_top(cs, '.2f', 0.05)}]")
                if args.strace:
                    m = args.strace
                    lines = _syscalls(daemon.pid, tmp, m, lambda: _renames(lean, sid, m, "s"))
                    print("\n".join(lines))
            finally:
                waiter.close()
                lean.close()
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
