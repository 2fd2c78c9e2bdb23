"""What a new claude-code Session's second Turn costs, and which worker requests it sends: for
each of `--sessions` new Sessions, Turn 1 (it starts the Session in the Claude worker) and then
Turn 2, each `turn.submit` → settled; Turn 2's time, the worker requests the daemon sent for it
(`session.start`, `turn.start`) and each `session.start`'s round trip are what this prints. An
in-process daemon (real store, real Claude worker, real SDK + bundled CLI) on the local fake
Messages model; its worker port is wrapped to count each request by method (each still sent).
Not a benchmark of record: an A/B tool, run with the code of whichever tree leads PYTHONPATH
(this file from this checkout), interleaved with the other tree:

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python \\
        <this checkout>/bench/claude_second_turn.py [--sessions 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from agenthost.config import load_config
from agenthost.daemon import Daemon
from bench.common import cpu_probe_ms
from bench.harness import create_session, run_turn
from model_fakes.messages import MessagesServer
from tests.support.worker_requests import SentRequests
from transport.client import Client


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.claude_second_turn")
    parser.add_argument("--sessions", type=int, default=6)
    args = parser.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f} probe {cpu_probe_ms():.1f} ms", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-second-turn-") as tmp_text:
        tmp = Path(tmp_text)
        home = tmp / "home"
        home.mkdir(mode=0o700)
        workdir = tmp / "work"
        workdir.mkdir()
        with MessagesServer() as server:
            (home / "agenthost.toml").write_text(
                f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
            )
            daemon = Daemon(load_config(home), default_cwd=workdir)
            daemon.start()
            try:
                c = Client(daemon.api_endpoint, timeout=120.0)
                try:
                    sent = SentRequests(daemon, timed=("session.start",))
                    firsts: list[float] = []
                    seconds: list[float] = []
                    starts: list[int] = []
                    for i in range(args.sessions):
                        sid = create_session(c, f"second turn {i}", provider="claude-code")
                        t0 = time.perf_counter()
                        run_turn(c, sid, f"one {i}")
                        firsts.append((time.perf_counter() - t0) * 1000)
                        sent.take()
                        t0 = time.perf_counter()
                        run_turn(c, sid, f"two {i}")
                        seconds.append((time.perf_counter() - t0) * 1000)
                        requests = sent.take()
                        starts.append(requests["session.start"])
                        print(
                            f"session {i}: turn 1 {firsts[-1]:.0f} ms, turn 2 {seconds[-1]:.0f}"
                            f" ms, turn 2 sent {dict(requests)}",
                            flush=True,
                        )
                    timed = list(sent.round_trips_ms["session.start"])
                finally:
                    c.close()
            finally:
                daemon.close()
    print(
        f"turn 2 p50 {statistics.median(seconds):.0f} ms (turn 1 p50"
        f" {statistics.median(firsts):.0f} ms); session.start per turn 2: {sum(starts)}"
        f"/{len(starts)}",
        flush=True,
    )
    if timed:
        print(
            f"session.start round trip p50 {statistics.median(timed):.2f} ms"
            f" (n {len(timed)}, min {min(timed):.2f})",
            flush=True,
        )
    print(
        f"command: build/venv/bin/python -m bench.claude_second_turn --sessions {args.sessions}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
