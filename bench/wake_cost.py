"""What one wake-up costs on this machine, back to back and after idle: the unit the process
view's hop floor (`bench.hop_floor`) is made of. Two probes, each one-way and stamped by the
woken side (`time.perf_counter`, one clock for every process):

- thread hand-off: this thread puts a stamp on a `queue.SimpleQueue` another thread of this
  process is blocked on (as the daemon's loop hands a request to an actor);
- pipe hop: this process writes a stamp down a pipe a child process is blocked reading (as a
  worker writes to its app-server, or ZeroMQ's I/O thread to its peer's);

each with nothing between samples (back to back) and after `--gap MS` of idle, and with the
two sides left where the scheduler puts them (two CPUs) or pinned to one CPU (the woken side
never needs an idle CPU woken for it), and a third way to wait: the same gap spent spinning
(`busy`: the waking thread keeps its CPU busy, so only the woken side sat still). Pinned and
busy, no CPU halts in the gap: what remains over back to back is the woken side's own
coldness; pinned and idle adds the halted CPU's wake (a timer's, before the stamp) and what
the gap let the host do with the physical core.

    build/venv/bin/python -m bench.wake_cost [--samples 300] [--gap 30]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Latency

SAMPLES = 300
GAP_MS = 30.0
WARMUP = 10
STAMP = struct.Struct("d")


def pong_main() -> int:
    """The pipe hop's woken side: answer each stamp read with when it was read."""
    while True:
        data = os.read(0, STAMP.size)
        read = time.perf_counter()
        if len(data) < STAMP.size:
            return 0
        os.write(1, STAMP.pack(read))


@contextmanager
def _pinned(cpu: int | None) -> Iterator[None]:
    """This thread (and the threads and children it starts) on `cpu`, or left as it was."""
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _wait(gap_s: float, busy: bool) -> None:
    if not gap_s:
        return
    if not busy:
        time.sleep(gap_s)
        return
    until = time.perf_counter() + gap_s
    while time.perf_counter() < until:
        pass


def thread_handoff(
    samples: int, gap_s: float, cpu: int | None = None, busy: bool = False
) -> Latency:
    """One-way: a stamp put on a queue → the blocked thread has it, ms."""
    inbox: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[float] = queue.SimpleQueue()

    def woken() -> None:
        while (sent := inbox.get()) is not None:
            done.put(time.perf_counter() - sent)

    lags: list[float] = []
    with _pinned(cpu):
        thread = threading.Thread(target=woken, name="woken", daemon=True)
        thread.start()
        for i in range(WARMUP + samples):
            _wait(gap_s, busy)
            inbox.put(time.perf_counter())
            lag = done.get()
            if i >= WARMUP:
                lags.append(1000 * lag)
        inbox.put(None)
        thread.join()
    return Latency.of(lags)


def pipe_hop(samples: int, gap_s: float, cpu: int | None = None, busy: bool = False) -> Latency:
    """One-way: a stamp written to a pipe → the child blocked reading it has it, ms."""
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    lags: list[float] = []
    with _pinned(cpu):
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.wake_cost", "--role", "pong"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
    assert child.stdin is not None and child.stdout is not None
    to_child, from_child = child.stdin.fileno(), child.stdout.fileno()
    try:
        with _pinned(cpu):
            for i in range(WARMUP + samples):
                _wait(gap_s, busy)
                sent = time.perf_counter()
                os.write(to_child, STAMP.pack(sent))
                (read,) = STAMP.unpack(os.read(from_child, STAMP.size))
                if i >= WARMUP:
                    lags.append(1000 * (read - sent))
    finally:
        child.stdin.close()
        child.wait(10)
        child.stdout.close()
    return Latency.of(lags)


@dataclass(frozen=True, slots=True)
class WakeCost:
    """Each probe's one-way p50, µs, keyed by (probe, placement, "back to back"/"idle"/"busy")."""

    gap_ms: float
    p50_us: dict[tuple[str, str, str], float]
    n: int

    def lines(self) -> list[str]:
        out = []
        for probe in ("thread hand-off", "pipe hop"):
            for placement in ("two CPUs", "one CPU"):
                warm = self.p50_us[(probe, placement, "back to back")]
                idle = self.p50_us[(probe, placement, "idle")]
                busy = self.p50_us[(probe, placement, "busy")]
                out.append(
                    f"{probe}, {placement}: back to back {warm:.0f} µs, after {self.gap_ms:g} ms"
                    f" idle {idle:.0f} µs, after {self.gap_ms:g} ms spinning {busy:.0f} µs"
                    f" (p50 of {self.n}, one-way)"
                )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "gapMs": self.gap_ms,
            "n": self.n,
            "p50Us": {" / ".join(k): round(v, 1) for k, v in self.p50_us.items()},
        }


def measure(samples: int = SAMPLES, gap_s: float = GAP_MS / 1000) -> WakeCost:
    """Each probe × placement × (back to back, after `gap_s`), the idle and back-to-back runs
    of each interleaved in halves so a minute's speed falls on both."""
    cpu = min(os.sched_getaffinity(0))
    probes = {"thread hand-off": thread_handoff, "pipe hop": pipe_hop}
    placements: dict[str, int | None] = {"two CPUs": None, "one CPU": cpu}
    got: dict[tuple[str, str, str], list[float]] = {}
    half = max(1, samples // 2)
    for _ in range(2):
        for probe, run in probes.items():
            for placement, pin in placements.items():
                for when, gap in (("back to back", 0.0), ("idle", gap_s), ("busy", gap_s)):
                    lat = run(half, gap, pin, when == "busy")
                    got.setdefault((probe, placement, when), []).extend(lat.samples)
    p50 = {k: 1000 * Latency.of(v).p50 for k, v in got.items()}
    return WakeCost(round(gap_s * 1000, 3), p50, 2 * half)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--role", choices=("pong",))
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--gap", type=float, default=GAP_MS, metavar="MS")
    args = parser.parse_args(argv)
    if args.role == "pong":
        return pong_main()
    cost = measure(args.samples, args.gap / 1000)
    for line in cost.lines():
        print(line)
    print(json.dumps(cost.to_json()))
    print(
        f"command: build/venv/bin/python -m bench.wake_cost --samples {args.samples}"
        f" --gap {args.gap:g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
