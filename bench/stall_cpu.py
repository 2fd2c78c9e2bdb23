"""The daemon's CPU per mutation with one client alone (the mutations' phase 0), by request kind
and function: one client sends `session.updateTitle` back to back (`--loop rename`), or runs the
phase-0 loop of `bench.mutations` (`--loop mutate`: submit a Turn, rename, read the timeline, wait
for the Turn to settle), for `--seconds`; prints the daemon's CPU (all its threads, from /proc)
per request and, with `--spy`, py-spy's samples of the daemon's thread holding the GIL (`--gil`:
the Python work the eight clients of phase A queue behind; a thread blocked in a COMMIT's fsync
or a queue's wait is not in them) by own and inclusive frame.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall_cpu [--loop rename|mutate] \\
        [--seconds 10] [--spy] [--raw FILE]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.harness import BenchDaemon, cpu_by_kind, create_session, run_turn, tree
from bench.loadgen import LeanClient, Waiter, loop_mutate, request
from bench.profile import ProfileSummary, py_spy, summarise

WS = "ws-bench"


def _rename_loop(c: LeanClient, sid: str, deadline: float) -> int:
    n = 0
    while time.monotonic() < deadline:
        n += 1
        status, body = request(
            c,
            "session.updateTitle",
            {"workspaceId": WS, "agentSessionId": sid, "title": f"title {n}"},
        )
        if status >= 400:
            raise RuntimeError(f"updateTitle answered {status}: {body}")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--loop", choices=("rename", "mutate"), default="rename")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--spy", action="store_true", help="py-spy the daemon (its own CPU is apart)")
    p.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw stacks here")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-stall-cpu-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        try:
            c = daemon.client()
            sid = create_session(c, "cpu 0", ws=WS)
            run_turn(c, sid, "warm up", ws=WS)
            lean = LeanClient(daemon.api)
            waiter = Waiter(lean, daemon.events)
            try:
                # Warm-up of the loop itself (first-call imports and caches), unmeasured.
                if args.loop == "rename":
                    _rename_loop(lean, sid, time.monotonic() + 1.0)
                else:
                    loop_mutate(lean, waiter, {"ws": WS, "sid": sid}, time.monotonic() + 1.0)
                raw = args.raw or tmp / "spy.txt"
                spy: subprocess.Popen[bytes] | None = None
                if args.spy and py_spy() is not None:
                    spy = subprocess.Popen(
                        [
                            str(py_spy()),
                            "record",
                            "--pid",
                            str(daemon.pid),
                            "--gil",
                            "--rate",
                            "200",
                            "--nonblocking",
                            "--format",
                            "raw",
                            "-o",
                            str(raw),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(0.5)  # attached before the measured window
                before = cpu_by_kind(tree(daemon.pid))
                t0 = time.monotonic()
                deadline = t0 + args.seconds
                if args.loop == "rename":
                    requests = _rename_loop(lean, sid, deadline)
                else:
                    records = loop_mutate(lean, waiter, {"ws": WS, "sid": sid}, deadline)
                    requests = len(records)
                elapsed = time.monotonic() - t0
                after = cpu_by_kind(tree(daemon.pid))
                summary: ProfileSummary | None = None
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(30)
                    summary = summarise(raw.read_text(errors="replace"), top=args.top)
            finally:
                waiter.close()
                lean.close()
        finally:
            daemon.stop()
    daemon_ms = 1000 * (after.get("daemon", 0.0) - before.get("daemon", 0.0))
    print(
        f"{args.loop}: {requests} requests in {elapsed:.1f} s ({requests / elapsed:.0f}/s);"
        f" daemon CPU {daemon_ms / max(1, requests):.3f} ms per request"
        + (" (py-spy attached: its sampling adds to it)" if args.spy else "")
    )
    if summary is not None:
        s = summary
        print(f"py-spy samples by process kind: {s.samples}")
        for title, table in (("own", s.top_self), ("inclusive", s.top_inclusive)):
            # py-spy on one process names none: its stacks are the daemon's.
            kind = "daemon" if "daemon" in s.samples else "other"
            rows = table.get(kind, [])
            n = s.samples.get(kind, 1)
            print(f"daemon, {title} frames (share of its samples holding the GIL):")
            for frame, count in rows[: args.top]:
                print(f"  {100 * count / n:5.1f} %  {frame}")
    elif args.spy:
        print("py-spy: no profile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
