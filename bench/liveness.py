"""What watching providers for a stopped or silent process costs, and how fast Codex answers
its liveness request mid-Turn.

1. **Process state** (psutil): listing one process tree (`children(recursive=True)`, which
   reads every process's parent) against one `TreeWatch.stopped` check of an already-listed
   tree (each member's own state), on a launcher-over-child tree like Codex's; and how many
   processes the machine runs (the listing's cost grows with them, the check's does not).
2. **Codex liveness** (`thread/loaded/list`): the round trip to the pinned `codex
   app-server` while a Turn waits on a model that holds its reply; skipped when no Codex is
   installed.

Run: `build/venv/bin/python -m bench.liveness [--rounds N]`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from drivers.liveness import TreeWatch

COMMAND = "build/venv/bin/python -m bench.liveness"
PARENT = (
    "import subprocess, sys; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(c.pid, flush=True); c.wait()"
)


def _ms(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples) * 1000:.3f} ms, max {max(samples) * 1000:.3f} ms"


def process_state(rounds: int) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        root = psutil.Process(parent.pid)
        listing, checks = [], []
        watch = TreeWatch(parent.pid)
        watch.stopped(0.0)  # listed once
        for _ in range(rounds):
            t = time.perf_counter()
            root.children(recursive=True)
            listing.append(time.perf_counter() - t)
            t = time.perf_counter()
            watch.stopped(1.0)
            checks.append(time.perf_counter() - t)
        print(f"processes on this machine: {len(psutil.pids())}")
        print(f"list a 2-process tree (children, recursive): {_ms(listing)}")
        print(f"TreeWatch.stopped on the listed tree:         {_ms(checks)}")
    finally:
        for pid in (child, parent.pid):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        parent.wait(10)


def codex_liveness(rounds: int) -> None:
    from drivers.codex.command import default_command
    from drivers.codex.driver import create_driver
    from drivers.failpoints import Failpoints
    from model_fakes.responses import ResponsesServer

    command = default_command()
    if not Path(command[0]).is_file():
        print("codex liveness: skipped (no pinned Codex under build/providers/codex)")
        return
    gate = threading.Event()
    gate.set()
    with ResponsesServer(gate=gate, hold_after=1) as server, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "cwd").mkdir()
        driver = create_driver(
            {"model_base_url": server.base_url, "model": "mock-model"}, Failpoints()
        )
        try:
            sid = "bench"
            driver.start_session(
                {"agentSessionId": sid, "home": str(root / "home"), "cwd": str(root / "cwd")}
            )
            driver.start_turn({"agentSessionId": sid, "turnId": "t1", "text": "warm"}, _drop)
            time.sleep(1.0)
            gate.clear()
            driver.start_turn({"agentSessionId": sid, "turnId": "t2", "text": "held"}, _drop)
            runtime = driver._sessions[sid].runtime
            assert runtime is not None
            samples = []
            for _ in range(rounds):
                t = time.perf_counter()
                runtime.proc.request("thread/loaded/list", {}, timeout=10)
                samples.append(time.perf_counter() - t)
            print(f"codex thread/loaded/list mid-Turn (model holding the reply): {_ms(samples)}")
        finally:
            gate.set()
            driver.close()


def _drop(_sid: str, _event: object) -> None:
    pass


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.liveness")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    print(f"# {COMMAND} --rounds {args.rounds}")
    process_state(args.rounds)
    codex_liveness(min(args.rounds, 50))
    return 0


if __name__ == "__main__":
    sys.exit(main())
