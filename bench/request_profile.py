"""A mutation cycle's daemon work by function and thread, in-process (issue 36 target 4): the
real daemon (`tests.support.in_process`) in this process, one `loop_mutate` client (submit a
Turn, rename, read the timeline, wait for the settle on the events socket) for `--cycles`
cycles after a warm-up, every daemon thread under its own `cProfile.Profile(time.thread_time)`
from the measured window's start. Prints per cycle: the daemon threads' CPU (`thread_time`,
profiled), the Python calls, and the top functions by own time and by call count, with their
thread; `--count NAME` (repeatable, a function's `co_name` or a builtin's name) prints that
function's calls per cycle alone (call counts do not depend on the machine's load).

    PYTHONPATH=$TREE build/venv/bin/python -m bench.request_profile [--cycles 200] [--top 30] \\
        [--count replace --count packb --count loads]

Without `--profile` the same loop runs unprofiled and prints the daemon threads' CPU per cycle
(from /proc/self/task, the client's threads excluded) and the 1-minute load and probe.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms
from bench.harness import create_session, run_turn
from bench.loadgen import LeanClient, Waiter, loop_mutate, request

WS = "ws-bench"
_CLIENT_THREADS = ("MainThread", "agenthost-client")

_on = threading.Event()
_profilers: dict[str, cProfile.Profile] = {}
_lock = threading.Lock()


def _hook(frame: Any, event: str, arg: Any) -> None:
    """Installed in every thread started after it: once the window opens, the thread's first
    event enables a profiler of its own (which replaces this hook in that thread)."""
    if not _on.is_set():
        return
    name = threading.current_thread().name
    if name in _CLIENT_THREADS:
        import sys

        sys.setprofile(None)
        return
    prof = cProfile.Profile(time.thread_time)
    with _lock:
        key = name
        n = 1
        while key in _profilers:
            n += 1
            key = f"{name}#{n}"
        _profilers[key] = prof
    prof.enable()


def _label(code: Any) -> str:
    if isinstance(code, str):
        return code
    return f"{Path(code.co_filename).parent.name}/{Path(code.co_filename).name}:{code.co_name}"


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process, by thread id (from /proc)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--count", action="append", default=[])
    p.add_argument("--thread", default="", help="only threads whose name starts with this")
    args = p.parse_args(argv)
    print(f"load1 {os.getloadavg()[0]:.2f} probe {cpu_probe_ms():.1f} ms")
    from tests.support.in_process import in_process_daemon

    if args.profile:
        threading.setprofile(_hook)
    with (
        tempfile.TemporaryDirectory(prefix="bench-reqprof-") as tmp_text,
        in_process_daemon(Path(tmp_text) / "home") as (daemon, client),
    ):
        sid = create_session(client, "prof 0", ws=WS)
        run_turn(client, sid, "warm up", ws=WS)
        lean = LeanClient(daemon.api_endpoint)
        waiter = Waiter(lean, daemon.events_endpoint)
        try:
            loop_mutate(lean, waiter, {"ws": WS, "sid": sid}, time.monotonic() + 1.5)
            me = {str(threading.get_native_id())}
            me |= {str(t.native_id) for t in threading.enumerate() if t.name in _CLIENT_THREADS}
            _on.set()
            before = _thread_cpu()
            t0 = time.monotonic()
            cycles = 0
            while cycles < args.cycles:
                _cycle(lean, waiter, sid, cycles)
                cycles += 1
            elapsed = time.monotonic() - t0
            after = _thread_cpu()
            stats = {name: prof.getstats() for name, prof in list(_profilers.items())}
            _on.clear()
        finally:
            waiter.close()
            lean.close()
    cpu = sum(after[t] - before.get(t, 0.0) for t in after if t not in me)
    print(
        f"{cycles} cycles in {elapsed:.1f} s; daemon threads' CPU (/proc)"
        f" {1000 * cpu / cycles:.3f} ms per cycle" + (" (profiled)" if args.profile else "")
    )
    if not args.profile:
        return 0
    own: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    total_calls = 0
    total_own = 0.0
    for thread, entries in stats.items():
        tname = thread.split("#")[0]
        for e in entries:
            label = _label(e.code)
            own[(tname, label)] += e.inlinetime
            calls[(tname, label)] += e.callcount
            total_calls += e.callcount
            total_own += e.inlinetime
    print(
        f"profiled: {total_calls / cycles:.0f} calls, {1000 * total_own / cycles:.3f} ms own"
        f" thread time per cycle, threads {sorted(stats)}"
    )
    print(f"top {args.top} by own time (µs per cycle, calls per cycle, thread, function):")
    shown = [kv for kv in own.items() if kv[0][0].startswith(args.thread)]
    for key, t in sorted(shown, key=lambda kv: -kv[1])[: args.top]:
        print(f"  {1e6 * t / cycles:8.1f}  {calls[key] / cycles:7.1f}  {key[0]:<24} {key[1]}")
    for name in args.count:
        for label, n in sorted(calls.items()):
            if label[1].endswith(name) or label[1].endswith(name + ">"):
                print(f"count {name}: {n / cycles:6.2f} per cycle  {label[0]:<24} {label[1]}")
    return 0


def _cycle(lean: LeanClient, waiter: Waiter, sid: str, i: int) -> None:
    """One `loop_mutate` cycle (its requests, unrecorded)."""
    status, body = request(
        lean,
        "turn.submit",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": f"mutation {i}"}],
        },
    )
    turn_id = body["turn"]["turnId"] if status < 400 else None
    request(
        lean,
        "session.updateTitle",
        {"workspaceId": WS, "agentSessionId": sid, "title": f"title {i}"},
    )
    request(lean, "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 20})
    waiter.turn_settled(WS, sid, time.monotonic() + 60, turn_id)


if __name__ == "__main__":
    raise SystemExit(main())
