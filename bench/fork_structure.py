"""A warm fork's structure, counted on both sides of the worker link (issue 36 target 3, and 1):
every message between processes, actor message, future, thread hand-off, transaction and
event of one warm tutti-agent fork, with the CPU of the threads that run them.

An in-process daemon (`tests.support.in_process`) whose every thread runs under its own
`cProfile.Profile(time.thread_time)` from its first instruction, and a driver worker started
with `bench/structure_site` first on its PYTHONPATH (the same, in the worker's threads; its
stats taken on SIGUSR1). A source of 3 settled Turns is forked twice and ACKed (warm), then
`bench.loadgen`'s fork loop (one spawned client process: each fork awaited on its
`fork.operation` event and ACKed, as `bench.throughput` runs it) for `--seconds`; the window is
the difference of two snapshots of every profiler. Printed per committed fork: each structural
item's count by the thread that did it (call counts: the profiler does not change them), each
thread's profiled CPU (cProfile inflates Python ~3x: shares, not timings) and the daemon's
profiled CPU by kind of code. Not a benchmark of record.

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.fork_structure [--seconds 6]

(a tree without this file: copy it and `bench/structure_site` in; run as a script, this
directory's `profile.py` would shadow the standard library's).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pickle
import re
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from actors.pool import Timers
from transport.worker_link import HostEnd

SITE = Path(__file__).resolve().parent / "structure_site"
REPO = Path(__file__).resolve().parent.parent

Stats = dict[str, dict[Any, tuple[int, float, float]]]


def _at(fn: Any) -> str:
    """A pattern matching `fn`'s own code object (its name, file and first line as they are
    now), where its name alone is shared by other functions of the same file."""
    code = fn.__code__
    return rf"^{re.escape(code.co_name)} {re.escape(code.co_filename)}:{code.co_firstlineno}$"


# (label, pattern on "function file:line"): call counts per fork, by thread.
ITEMS: tuple[tuple[str, str], ...] = (
    ("API requests decoded (client -> daemon)", r"^decode_request .*transport/wire\.py"),
    ("API replies handed to the transport loop", r"^_post_reply .*transport/server\.py"),
    ("API replies sent on the ROUTER", r"^_send_reply .*transport/server\.py"),
    ("event batches handed to the transport loop", r"^publish_frames .*transport/server\.py"),
    ("events sent on the XPUB", r"^send .*transport/server\.py"),
    ("worker requests (daemon -> worker)", r"^request .*drivers/supervisor\.py"),
    ("worker frames sent by the daemon", _at(HostEnd.send)),
    ("worker frames read by the daemon", _at(HostEnd.recv)),
    ("worker requests handled (worker)", r"^_handle .*drivers/worker\.py"),
    ("worker frames sent by the worker", r"^_send_frame .*transport/worker_link\.py"),
    ("worker requests put on a lane (link -> lane)", r"^put .*drivers/worker\.py"),
    ("actor messages (inbox puts)", r"^put .*actors/pool\.py"),
    ("actor slices run", r"^_run_slice .*actors/pool\.py"),
    ("timers armed", _at(Timers.call_later)),
    ("futures made", r"^__init__ .*concurrent/futures/_base\.py"),
    ("future callbacks run", r"^_invoke_callbacks .*concurrent/futures/_base\.py"),
    ("SimpleQueue puts (a hand-off each)", r"^<method 'put' of '_queue\.SimpleQueue"),
    ("SimpleQueue blocking gets (a sleep each)", r"^<method 'get' of '_queue\.SimpleQueue"),
    ("eventfd writes (a wake of a poller)", r"^<built-in method posix\.eventfd_write"),
    ("os.write (the binder's file write; a link wake)", r"^<built-in method posix\.write>"),
    ("Condition notifies", r"^notify .*threading\.py"),
    ("epoll/poll sleeps", r"^<method 'poll' of 'select\.(e)?poll"),
    ("store writes submitted (transactions)", r"^submit_write .*storage/base\.py"),
    ("fsyncs (fdatasync)", r"^<built-in method posix\.fdatasync"),
    ("fsyncs (fsync)", r"^<built-in method posix\.fsync"),
    ("SQLite statements (execute)", r"^<method 'execute(many)?' of 'apsw"),
    ("store change notifications (events offered)", r"^offer .*storage/sqlite\.py"),
    ("msgpack packs", r"^packb "),
    ("JSON dumps", r"^dumps .*json/__init__"),
    ("JSON loads", r"^loads .*json/__init__"),
)

KINDS: tuple[tuple[str, str], ...] = (
    ("actor hand-offs (pool, pykka, later/tell)", r"actors/pool\.py|pykka/|session_base\.py"),
    ("futures", r"concurrent/futures/|agenthost/workers\.py"),
    ("supervisor loop and worker link", r"drivers/supervisor\.py|worker_link\.py|epoll|eventfd"),
    ("locks, conditions, threading", r"threading\.py|_thread\."),
    ("transport and wire", r"transport/|protocol/|msgpack|zmq/"),
    ("events (publisher, projection)", r"agenthost/publisher|agenthost/projection"),
    ("store: SQLite", r"apsw|fdatasync"),
    ("store: Python", r"storage/"),
    ("the saga", r"actors/fork_"),
    ("JSON", r"json/"),
)

_PROFS: list[tuple[str, cProfile.Profile]] = []


def _key(code: Any) -> tuple[str, int, str]:
    if isinstance(code, str):
        return ("~", 0, code)
    return (code.co_filename, code.co_firstlineno, code.co_name)


def _profile_threads() -> None:
    boot = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        _PROFS.append((self.name, prof))
        prof.enable()
        try:
            boot(self)
        finally:
            prof.disable()

    threading.Thread._bootstrap_inner = profiled  # type: ignore[attr-defined]


def _snap() -> Stats:
    out: Stats = {}
    for name, prof in list(_PROFS):
        d = out.setdefault(re.sub(r"[_-]?\d+$", "", name), {})
        for e in prof.getstats():
            k = _key(e.code)
            c, it, tt = d.get(k, (0, 0.0, 0.0))
            d[k] = (c + e.callcount, it + e.inlinetime, tt + e.totaltime)
    return out


def worker_raw(pid: int, out: str) -> Stats:
    """The worker's profiles (SIGUSR1 makes it write them), with their caller edges."""
    before = set(Path(out).parent.glob(Path(out).name + f".{pid}.*"))
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = [p for p in Path(out).parent.glob(Path(out).name + f".{pid}.*") if p not in before]
        new = [p for p in new if not p.name.endswith(".tmp")]
        if new:
            with open(new[0], "rb") as f:
                raw: Stats = pickle.load(f)
            return raw
        time.sleep(0.02)
    raise RuntimeError("the worker wrote no stats")


def without_edges(raw: Stats) -> Stats:
    return {th: {k: v for k, v in d.items() if k[0] != "EDGE"} for th, d in raw.items()}


def _worker_snap(pid: int, out: str) -> Stats:
    return without_edges(worker_raw(pid, out))


def _diff(a: Stats, b: Stats) -> Stats:
    res: Stats = {}
    for th, d in b.items():
        old = a.get(th, {})
        res[th] = {}
        for k, (c, it, tt) in d.items():
            oc, oit, ott = old.get(k, (0, 0.0, 0.0))
            if c - oc or it - oit > 0:
                res[th][k] = (c - oc, it - oit, tt - ott)
    return res


def _name(k: tuple[str, int, str]) -> str:
    return f"{k[2]} {k[0]}:{k[1]}"


def _worker_pid() -> int:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == me and b"drivers.worker" in cmd:
            return int(entry)
    raise RuntimeError("no driver worker")


def report(side: str, stats: Stats, forks: int) -> None:
    print(f"\n{side}: per committed fork, by thread")
    for label, pattern in ITEMS:
        rx = re.compile(pattern)
        by: dict[str, int] = defaultdict(int)
        for th, d in stats.items():
            for k, (c, _, _) in d.items():
                if rx.search(_name(k)):
                    by[th] += c
        total = sum(by.values())
        if total:
            parts = ", ".join(f"{th} {c / forks:.2f}" for th, c in sorted(by.items()) if c)
            print(f"  {label:52} {total / forks:6.2f}  [{parts}]")
    print(f"  {side} threads, profiled CPU ms / calls per fork:")
    for th, d in sorted(stats.items()):
        own = sum(v[1] for v in d.values())
        calls = sum(v[0] for v in d.values())
        if calls / forks >= 0.5:
            print(f"    {th:28} {1000 * own / forks:7.3f} ms {calls / forks:8.1f} calls")


def kinds(stats: Stats, forks: int) -> None:
    tot: dict[str, float] = defaultdict(float)
    for d in stats.values():
        for k, (_, it, _) in d.items():
            name = _name(k)
            for label, pattern in KINDS:
                if re.search(pattern, name):
                    tot[label] += it
                    break
            else:
                tot["other (builtins not given to a caller, stdlib, API)"] += it
    whole = sum(tot.values()) or 1.0
    print(f"\ndaemon, profiled CPU by kind of code ({1000 * whole / forks:.2f} ms a fork):")
    for label, it in sorted(tot.items(), key=lambda x: -x[1]):
        print(f"  {label:52} {1000 * it / forks:6.3f} ms {100 * it / whole:5.1f} %")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="forkstruct-"))
    (tmp / "user-home").mkdir()
    os.environ["HOME"] = str(tmp / "user-home")
    out = str(tmp / "w")
    os.environ["FORKSTRUCT_OUT"] = out
    # The worker runs the tree this process runs (PYTHONPATH's), the site loaded first.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), os.environ.get("PYTHONPATH") or str(REPO)]
    )
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
        sid = create_session(c, "src")
        for t in range(3):
            run_turn(c, sid, f"turn {t}")
        tid = last_settled_turn(c, sid)
        for _ in range(2):
            acknowledge(c, fork_until_terminal(c, sid, tid)["operationId"])
        worker = _worker_pid()
        time.sleep(0.5)
        a, wa = _snap(), _worker_snap(worker, out)
        recs = run_clients(
            daemon.api_endpoint,
            [ClientSpec("fork", {"ws": WS, "sid": sid, "turn_id": tid})],
            args.seconds,
            events=daemon.events_endpoint,
        )
        b, wb = _snap(), _worker_snap(worker, out)
    forks = sum(1 for rs in recs for r in rs if r.get("reason") == "committed")
    other = sum(1 for rs in recs for r in rs if r.get("reason") != "committed")
    print(f"{forks} forks committed ({other} other) in {args.seconds:.0f} s, one client")
    if not forks:
        return 1
    daemon_stats, worker_stats = _diff(a, b), _diff(wa, wb)
    report("daemon", daemon_stats, forks)
    report("worker", worker_stats, forks)
    kinds(daemon_stats, forks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
