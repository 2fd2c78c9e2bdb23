"""What one endless stdout line of a provider does to the worker that reads it: a real daemon,
a tutti-agent app-server behind `tests/daemon/misbehaving_app_server.py` armed `endless [MiB]`
at the second Turn's `turn/start`; every 2 s the worker's VmRSS and VmHWM (`/proc`) and the
Turn's phase and error are printed, until it settles or `--samples` run out. Counts memory,
not time: run it with the tree whose code leads PYTHONPATH (a finite `--mib` on a tree whose
reader has no line bound, or the worker grows until the machine runs out):

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python \\
        <this checkout>/bench/provider_endless_line.py [--mib 300] [--samples 15]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

from tests.daemon.test_misbehaving_provider import Relay, _daemon, _kill, _worker_pid
from tests.support.daemon import create_session, run_turn, submit, turn_of


def _memory(pid: int) -> str:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return " ".join(" ".join(x.split()) for x in lines if x.startswith(("VmRSS", "VmHWM")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=0, help="MiB written, 0: without end")
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        relay = Relay(Path(tmp))
        d = _daemon(Path(tmp), relay)
        pid = None
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            run_turn(c, sid, "warm")
            worker = _worker_pid(d)
            print("worker before:", _memory(worker), flush=True)
            relay.arm(f"endless {args.mib}" if args.mib else "endless")
            turn = submit(c, sid, "hello")
            pid = relay.taken_pid()
            for i in range(args.samples):
                time.sleep(2)
                t = turn_of(c, sid, turn["turnId"])
                error = (t["error"] or "")[:160]
                print(f"t={2 * (i + 1)}s {_memory(worker)} {t['phase']} {error}", flush=True)
                if t["phase"] == "settled":
                    break
        finally:
            _kill(pid)
            with contextlib.suppress(Exception):
                d.stop()


if __name__ == "__main__":
    main()
