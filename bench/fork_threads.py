"""The daemon's warm fork at N clients by thread and by function (issue 36 target 3, and 1).

An in-process daemon (`tests.support.in_process`, tutti-agent) whose every thread runs under
its own `cProfile.Profile(time.thread_time)` from its first instruction (`bench.fork_structure`'s
profilers), N sources of 3 settled Turns each forked twice and ACKed (warm), then
`bench.loadgen`'s fork loop at `--clients` N (what `bench.throughput` runs: one spawned client
process a source, each awaiting its `fork.operation` event and ACKing) for `--seconds`. The
window is the difference of two snapshots of every profiler. Printed per committed fork:

- the structural counts of `bench.fork_structure.ITEMS` by thread (call counts: the profiler
  does not change them);
- each daemon thread's profiled CPU and Python calls, and its `--top` functions by own time
  (cProfile inflates Python ~3x: shares, not timings);
- the events the daemon published, counted by one more subscriber on the events socket (the
  bench's clients each subscribe to every topic, so each event below went to every one of the
  N clients as well): by type, with their body bytes; and the frames each client was sent.

Not a benchmark of record: the per-thread CPU unprofiled is `bench/fork_daemon.py --clients N`.

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.fork_threads [--clients 16]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bench.fork_structure import ITEMS, Stats, _diff, _name, _profile_threads, _snap

COUNTER_THREAD = "bench-event-counter"
"""The probe's own subscriber thread: left out of the daemon's figures."""


class EventCounter:
    """One SUB socket on the events endpoint subscribed to every topic (as the bench's clients
    are), counting events by type and their body bytes while `counting` is set."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.by_type: Counter[str] = Counter()
        self.bytes_by_type: Counter[str] = Counter()
        self.counting = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=COUNTER_THREAD, daemon=True)

    def start(self) -> EventCounter:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 1_000_000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint)
        time.sleep(0.3)  # the subscription reaches the XPUB (slow joiner)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sub.poll(50):
                    continue
                frames = sub.recv_multipart()
                if self.counting.is_set():
                    self.add(frames[-1])
        finally:
            sub.close()
            ctx.term()

    def add(self, body: bytes) -> None:
        kind = event_type(body)
        self.by_type[kind] += 1
        self.bytes_by_type[kind] += len(body)


def _edges() -> dict[tuple[str, str, str], int]:
    """(thread, caller, callee) → calls so far, every profiled thread (for `--edges`)."""
    from bench.fork_structure import _PROFS, _key

    out: dict[tuple[str, str, str], int] = defaultdict(int)
    for name, prof in list(_PROFS):
        if name == COUNTER_THREAD:
            continue
        th = re.sub(r"[_-]?\d+$", "", name)
        for e in prof.getstats():
            for sub in e.calls or ():
                out[(th, _name(_key(e.code)), _name(_key(sub.code)))] += sub.callcount
    return dict(out)


def event_type(body: bytes) -> str:
    """The `type` of an event's msgpack body, or `?` when it has none."""
    try:
        value = msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return "?"
    return str(value.get("type", "?")) if isinstance(value, dict) else "?"


def event_rows(
    by_type: Mapping[str, int], bytes_by_type: Mapping[str, int], forks: int, clients: int
) -> dict[str, Any]:
    """Per committed fork: events and body bytes by type, their totals, and the frames and
    body bytes the XPUB sent to the `clients` subscribers (each subscribes to every topic)."""
    per = {k: by_type[k] / forks for k in sorted(by_type)}
    size = {k: bytes_by_type.get(k, 0) / forks for k in sorted(by_type)}
    events = sum(by_type.values()) / forks
    body = sum(bytes_by_type.values()) / forks
    return {
        "eventsPerFork": per,
        "bytesPerFork": size,
        "events": events,
        "bytes": body,
        "sentFramesToClients": 2 * events * clients,
        "sentBytesToClients": body * clients,
    }


def thread_rows(stats: Stats, forks: int, top: int) -> dict[str, dict[str, Any]]:
    """Each thread's profiled CPU ms and calls a fork, and its `top` functions by own time."""
    out: dict[str, dict[str, Any]] = {}
    for th, d in stats.items():
        if th == COUNTER_THREAD:
            continue
        own = sum(v[1] for v in d.values())
        calls = sum(v[0] for v in d.values())
        if calls / forks < 0.5:
            continue
        funcs = sorted(d.items(), key=lambda kv: -kv[1][1])[:top]
        out[th] = {
            "cpuMs": 1000 * own / forks,
            "calls": calls / forks,
            "top": [
                {"function": _name(k), "calls": c / forks, "ownMs": 1000 * it / forks}
                for k, (c, it, _) in funcs
            ],
        }
    return out


def item_rows(stats: Stats, forks: int) -> dict[str, dict[str, float]]:
    """`bench.fork_structure.ITEMS`' counts a fork, by thread (the probe's thread left out)."""
    rows: dict[str, dict[str, float]] = {}
    for label, pattern in ITEMS:
        rx = re.compile(pattern)
        by: dict[str, int] = defaultdict(int)
        for th, d in stats.items():
            if th == COUNTER_THREAD:
                continue
            for k, (c, _, _) in d.items():
                if rx.search(_name(k)):
                    by[th] += c
        if by:
            rows[label] = {th: c / forks for th, c in sorted(by.items()) if c}
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--top", type=int, default=12, help="functions shown a thread")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--edges", type=Path, default=None, help="pickle the window's caller -> callee counts"
    )
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="forkthreads-"))
    # Its home (a store, provider homes) left in the temp dir by every run otherwise.
    atexit.register(shutil.rmtree, tmp, True)
    (tmp / "user-home").mkdir()
    os.environ["HOME"] = str(tmp / "user-home")
    _profile_threads()
    from bench.common import cpu_probe_ms
    from bench.harness import (
        WS,
        acknowledge,
        create_session,
        fork_until_terminal,
        last_settled_turn,
        run_turn,
    )
    from bench.loadgen import ClientSpec, run_clients
    from tests.support.in_process import in_process_daemon

    print(f"load {os.getloadavg()[0]:.2f} probe {cpu_probe_ms():.0f} ms", flush=True)
    with in_process_daemon(tmp / "home", timeout=120) as (daemon, c):
        sources: dict[str, str] = {}
        for i in range(args.clients):
            sid = create_session(c, f"src {i}")
            for t in range(3):
                run_turn(c, sid, f"turn {t}")
            tid = last_settled_turn(c, sid)
            for _ in range(2):
                acknowledge(c, fork_until_terminal(c, sid, tid)["operationId"])
            sources[sid] = tid
        counter = EventCounter(daemon.events_endpoint).start()
        time.sleep(0.5)
        a, ea = _snap(), _edges()
        counter.counting.set()
        recs = run_clients(
            daemon.api_endpoint,
            [ClientSpec("fork", {"ws": WS, "sid": s, "turn_id": t}) for s, t in sources.items()],
            args.seconds,
            events=daemon.events_endpoint,
        )
        b, eb = _snap(), _edges()
        time.sleep(0.3)  # the last events of the window reach the counter
        counter.counting.clear()
        counter.stop()
    forks = sum(1 for rs in recs for r in rs if r.get("reason") == "committed")
    other = sum(1 for rs in recs for r in rs if r.get("reason") != "committed")
    print(
        f"{forks} forks committed ({other} other) in {args.seconds:.0f} s, {args.clients} clients"
    )
    if not forks:
        return 1
    stats = _diff(a, b)
    items = item_rows(stats, forks)
    threads = thread_rows(stats, forks, args.top)
    events = event_rows(counter.by_type, counter.bytes_by_type, forks, args.clients)
    print("\nper committed fork, by thread")
    for label, by in items.items():
        parts = ", ".join(f"{th} {v:.2f}" for th, v in by.items())
        print(f"  {label:52} {sum(by.values()):7.2f}  [{parts}]")
    print("\nevents published a fork (one subscriber's view), body bytes:")
    for kind, n in events["eventsPerFork"].items():
        print(f"  {kind:24} {n:5.2f}  {events['bytesPerFork'][kind]:8.0f} B")
    print(
        f"  all: {events['events']:.2f} events, {events['bytes']:.0f} B; to the {args.clients}"
        f" clients: {events['sentFramesToClients']:.0f} frames,"
        f" {events['sentBytesToClients']:.0f} B"
    )
    print("\ndaemon threads, profiled CPU ms / Python calls a fork, top functions by own time:")
    for th, row in sorted(threads.items(), key=lambda kv: -kv[1]["cpuMs"]):
        print(f"  {th:28} {row['cpuMs']:7.3f} ms {row['calls']:8.1f} calls")
        for f in row["top"]:
            print(f"      {f['ownMs']:6.3f} ms {f['calls']:7.2f}  {f['function']}")
    if args.edges is not None:
        diff = {k: (c - ea.get(k, 0)) / forks for k, c in eb.items() if c - ea.get(k, 0)}
        args.edges.write_bytes(pickle.dumps(diff))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"forks": forks, "items": items, "threads": threads, "events": events}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
