"""One mutation client alone, longer than `bench.mutations`' phase 0 (issue 36 target 4): the
daemon tree's CPU per request and, with `--perf`, the daemon process's system calls, futex
calls, context switches, `fdatasync`s and `pwrite64`s per request, counted in the kernel by
`perf stat -p` (no trace: the daemon runs at its own pace). The counts do not depend on how
busy the machine is, so two trees are compared by them where a loaded machine's timings cannot
tell (docs/performance.md, "The quiet full run of 2026-12-05, 07:01–07:14 UTC").

A fresh daemon (tutti-agent, the built-in model), one Session with one warm Turn, `bench.loadgen`'s
mutate client (`turn.submit`, `session.updateTitle`, `session.timeline`, then the Turn's
settlement awaited on the events socket) for `--warm` seconds unmeasured, then `--seconds`
measured.

    build/venv/bin/python -m bench.mutation_solo [--seconds 6] [--warm 2] [--perf]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import cpu_probe_ms
from bench.harness import BenchDaemon, create_session, run_turn
from bench.loadgen import ClientSpec, run_clients
from bench.profile import TreeProfile

PERF_EVENTS = (
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_futex",
    "context-switches",
    "syscalls:sys_enter_fdatasync",
    "syscalls:sys_enter_pwrite64",
)


def parse_perf_csv(text: str) -> dict[str, float]:
    """`perf stat -x,` output: each counted event's total by its short name (the part after
    the last `:`); lines of uncounted events and comments left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].replace(".", "", 1).isdigit():
            out[parts[2].split(":")[-1]] = float(parts[0])
    return out


def run(seconds: float, warm: float, perf: bool) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-mutation-solo-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        try:
            c = daemon.client()
            sid = create_session(c, "solo")
            run_turn(c, sid, "warm up")
            spec = [ClientSpec("mutate", {"ws": "ws-bench", "sid": sid})]
            run_clients(daemon.api, spec, warm, events=daemon.events)
            probe = cpu_probe_ms()
            counter = None
            perf_out = tmp / "perf.csv"
            if perf:
                events = ",".join(PERF_EVENTS)
                counter = subprocess.Popen(
                    ["perf", "stat", "-x,", "-o", str(perf_out), "-e", events]
                    + ["-p", str(daemon.pid)]
                )
                time.sleep(0.3)
            profile = TreeProfile(daemon.pid, tmp / "solo.txt", use_py_spy=False)
            records = run_clients(
                daemon.api, spec, seconds, events=daemon.events, on_start=profile.start
            )
            profile.stop()
            if counter is not None:
                counter.send_signal(signal.SIGINT)
                counter.wait(30)
            n = max(1, sum(len(r) for r in records))
            cpu = ", ".join(f"{k} {1000 * v / n:.3f}" for k, v in sorted(profile.cpu.items()))
            lines = [f"requests {n} in {seconds:.0f} s; CPU probe {probe:.0f} ms"]
            lines.append(f"CPU ms per request: {cpu}")
            if counter is not None:
                counts = parse_perf_csv(perf_out.read_text())
                per = ", ".join(f"{k} {v / n:.2f}" for k, v in counts.items())
                lines.append(f"daemon process, per request: {per}")
            return "\n".join(lines)
        finally:
            daemon.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warm", type=float, default=2.0)
    parser.add_argument("--perf", action="store_true", help="count with perf stat -p")
    args = parser.parse_args(argv)
    print(run(args.seconds, args.warm, args.perf))
    print(
        "command: build/venv/bin/python -m bench.mutation_solo"
        f" --seconds {args.seconds:g} --warm {args.warm:g}" + (" --perf" if args.perf else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
