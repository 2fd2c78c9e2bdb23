"""Probe: the daemon tree's CPU per warm tutti-agent fork at nanosecond resolution, for A/B
runs of two trees. `bench.throughput`'s CPU per fork comes from `/proc/PID/stat` (10 ms ticks:
over a `--quick` window of ~1,000 forks a step of ~0.01 ms, but its window is a time, so the
forks, the warm-up and the load each tree sees differ). This runs a FIXED number of forks:
`bench.throughput`'s load (each client its own process and its own source of 3 settled Turns,
forking through the last one, waiting for the operation's event, ACKing each commit — the
loop of `bench.loadgen.loop_fork`), every client warmed first, then released together for
`--forks` forks each. Each process kind's CPU is the sum of its threads'
`/proc/PID/task/TID/schedstat` run time (ns, user + kernel), and its wake-ups their voluntary
context switches, read at the release and after the last fork. A thread that ends inside the
window is lost (counted in `ended=`, 0 on a warm fork), one born in it counted from 0; children
the workers reap are added at 10 ms ticks (`reaped=`). Prints one line per level:

    probe=14ms load=5.33 clients=16 forks=640/640 before=48 | app-server=1.107ms daemon=2.531ms
    worker=1.623ms tree=5.261ms | cs:app-server=7.0 cs:daemon=35.4 cs:worker=34.7 | ended=0 …

`--by-thread` adds the daemon's CPU and wake-ups per fork by thread (named through the tree's
`bench/stamp_site`, a pool's digits folded); `--strace` its system calls per fork
(`strace -c -f` over the window: counts only, its stops inflate that run's CPU).

It imports `bench.*` from `PYTHONPATH` (the daemon is started from that tree's
`bench.harness`), so one copy (best outside any tree's bench/, whose `profile.py` would
shadow the standard library's for the script) measures any tree, old or new:

    cp bench/fork_cpu.py /tmp/fork_cpu.py
    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python /tmp/fork_cpu.py \
        [--clients 1,16] [--forks 200,40] [--by-thread] [--strace] [--spread-home] [--aged N]

`--aged N` has each client fork its source N times before its window (`before=` counts them):
the worker's exact lookup lists every child a source's home holds at every fork of it, so a
source forked thousands of times before — as `bench.throughput`'s first four sources are by
its levels 1 and 4 — costs its forks more than a fresh one.

`--pairs M --against TREE` runs the probe (with the other options given) in this tree and in
TREE, M interleaved pairs (`bench.ab_pairs`), and prints each process kind's medians, in how
many pairs this tree was higher and the median difference:

    build/venv/bin/python -m bench.fork_cpu --clients 16 --forks 60 --pairs 8 --against /tmp/base

`--spread-home` makes the daemon's home in a block group of its own (`spread_parent`): each
new inode a fork makes otherwise scans what other processes freed under the temp directory.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench
from bench.common import cpu_probe_ms
from bench.harness import (
    WS,
    BenchDaemon,
    create_session,
    last_settled_turn,
    run_turn,
    tree,
)


def spread_parent(base: Path | None = None) -> Path:
    """A directory under `base` (the temp directory) with `FS_TOPDIR_FL` set, made once: a
    home made in it is not in the block group the temp directory's other users churn
    (`actors.dir_spread`; docs/performance.md, forkcpu of 2026-12-06, "A fork's five new
    inodes"). Where the flag cannot be set, the directory is still returned (the placement is
    then the parent's). Imported here, not at the top: a copy of this script still measures a
    tree without that module when `--spread-home` is not given."""
    from actors.dir_spread import spread_subdirs

    parent = Path(base or tempfile.gettempdir()) / "agenthost-bench-spread"
    parent.mkdir(mode=0o700, exist_ok=True)
    spread_subdirs(parent)
    return parent


SOURCE_TURNS = 3
WARM_FORKS = 3
"""Forks each client makes before the measured window (its first is cold: its source's
runtime opened, the client's connection and subscription made)."""


def thread_times(pid: int) -> dict[int, tuple[int, int]]:
    """{tid: (run time in ns, voluntary context switches)} of `pid`'s live threads."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                ns = int(fh.read().split()[0])
            switches = 0
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                for line in fh:
                    if line.startswith("voluntary_ctxt_switches"):
                        switches = int(line.split()[1])
            out[int(tid)] = (ns, switches)
        except OSError:
            continue  # the thread ended between the listing and the read
    return out


@dataclass
class TreeReading:
    """Every thread of the daemon's tree at one moment, and each process's reaped children."""

    kind: dict[int, str] = field(default_factory=dict)
    threads: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    reaped_s: dict[int, float] = field(default_factory=dict)
    names: dict[tuple[int, int], str] = field(default_factory=dict)
    """Each thread's kernel name (`comm`), read with `by_thread`."""


def read_tree(daemon_pid: int, by_thread: bool = False) -> TreeReading:
    reading = TreeReading()
    for s in tree(daemon_pid):
        reading.kind[s.pid] = s.kind
        reading.reaped_s[s.pid] = s.children_cpu_s
        for tid, value in thread_times(s.pid).items():
            reading.threads[(s.pid, tid)] = value
            if by_thread and s.kind == "daemon":
                try:
                    with open(f"/proc/{s.pid}/task/{tid}/comm") as fh:
                        reading.names[(s.pid, tid)] = fh.read().strip()
                except OSError:
                    continue
    return reading


def daemon_threads(before: TreeReading, after: TreeReading) -> dict[str, tuple[float, int]]:
    """The daemon's threads by name (a pool's digits folded): (CPU seconds, wake-ups)."""
    out: dict[str, tuple[float, int]] = {}
    for key, name in after.names.items():
        ns0, cs0 = before.threads.get(key, (0, 0))
        ns1, cs1 = after.threads[key]
        folded = name.rstrip("0123456789_-") or name
        s, cs = out.get(folded, (0.0, 0))
        out[folded] = (s + (ns1 - ns0) / 1e9, cs + cs1 - cs0)
    return out


def difference(before: TreeReading, after: TreeReading) -> dict[str, float]:
    """CPU seconds by process kind and `cs:<kind>` wake-ups between two readings; `ended`: the
    threads of `before` gone from `after` (their window's share lost), `reaped`: CPU seconds
    of children reaped meanwhile by a process alive at both readings (tick resolution)."""
    out: dict[str, float] = {"ended": 0.0, "reaped": 0.0}
    for (pid, tid), (ns1, cs1) in after.threads.items():
        ns0, cs0 = before.threads.get((pid, tid), (0, 0))
        kind = after.kind[pid]
        out[kind] = out.get(kind, 0.0) + (ns1 - ns0) / 1e9
        out[f"cs:{kind}"] = out.get(f"cs:{kind}", 0.0) + (cs1 - cs0)
    out["ended"] = float(sum(1 for key in before.threads if key not in after.threads))
    out["reaped"] = sum(
        after.reaped_s[pid] - before.reaped_s[pid] for pid in after.reaped_s if pid in before.kind
    )
    return out


def _client(
    endpoint: str,
    events: str,
    ws: str,
    sid: str,
    turn_id: str,
    forks: int,
    ready: Any,
    go: Any,
    results: Any,
    warm: int = WARM_FORKS,
) -> None:
    """One load client: `warm` forks (at least `WARM_FORKS`), ready, then `forks` forks once
    released."""
    from bench.loadgen import LeanClient, Waiter, request

    client = LeanClient(endpoint, timeout=120.0)
    waiter = Waiter(client, events)

    def fork() -> str:
        while True:
            status, body = request(
                client,
                "fork.create",
                {
                    "workspaceId": ws,
                    "agentSessionId": sid,
                    "requestId": str(uuid.uuid4()),
                    "targetAgentSessionId": str(uuid.uuid4()),
                    "point": {"type": "throughTurn", "turnId": turn_id},
                },
            )
            if status < 400:
                break
            time.sleep(0.005)  # refused (a barrier): asked again, as loop_fork does
        op = waiter.operation_ended(ws, body["operation"], time.monotonic() + 120)
        if op["status"] == "committed":
            ack = {"workspaceId": ws, "operationId": op["operationId"]}
            request(client, "fork.acknowledge", ack)
        return str(op["status"])

    try:
        before = sum(fork() == "committed" for _ in range(max(WARM_FORKS, warm)))
        ready.put(None)
        go.wait(300)
        committed = sum(fork() == "committed" for _ in range(forks))
        results.put((committed, before, None))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        ready.put(None)
        results.put((0, 0, f"{type(exc).__name__}: {exc}"))
    finally:
        waiter.close()
        client.close()


def strace_start(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """`strace -c -f` of every thread of `pid` until `strace_stop` (its stops stretch each
    system call: a run with it counts, its CPU figures are not the tree's)."""
    proc = subprocess.Popen(
        ["strace", "-c", "-f", "-q", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached to every thread before the window opens
    return proc


def strace_stop(proc: subprocess.Popen[bytes], out: Path) -> dict[str, int]:
    """The calls by system call of `strace -c`'s table."""
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    calls: dict[str, int] = {}
    for row in out.read_text().splitlines():
        fields = row.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(fields) >= 5 and fields[3].isdigit() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
    return calls


def measure(
    daemon: BenchDaemon,
    sources: Sequence[tuple[str, str]],
    forks_each: int,
    strace_out: Path | None = None,
    by_thread: bool = False,
    warm: int = WARM_FORKS,
) -> dict[str, float]:
    """`forks_each` warm forks by one client per source, released together: the tree's CPU
    seconds and wake-ups by kind over them, and `forks` (committed) / `asked`, `before` the
    forks committed before the window (`warm` a client, at least `WARM_FORKS`); with
    `strace_out`, the daemon's system calls by name over them (`sys:<name>`); with
    `by_thread`, its threads' CPU seconds (`t:<name>`) and wake-ups (`tcs:<name>`)."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=_client,
            args=(daemon.api, daemon.events, WS, sid, turn, forks_each, ready, go, results, warm),
            daemon=True,
        )
        for sid, turn in sources
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=300)
        tracer = strace_start(daemon.pid, strace_out) if strace_out is not None else None
        before = read_tree(daemon.pid, by_thread)
        go.set()
        got = [results.get(timeout=600) for _ in procs]
        after = read_tree(daemon.pid, by_thread)
        calls = strace_stop(tracer, strace_out) if tracer and strace_out is not None else {}
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [e for _, _, e in got if e]
    if errors:
        raise RuntimeError("; ".join(errors))
    out = difference(before, after)
    out["forks"] = float(sum(n for n, _, _ in got))
    out["before"] = float(sum(n for _, n, _ in got))
    out["asked"] = float(forks_each * len(procs))
    out.update({f"sys:{name}": float(n) for name, n in calls.items()})
    for name, (cpu_s, wakes) in daemon_threads(before, after).items():
        out[f"t:{name}"], out[f"tcs:{name}"] = cpu_s, float(wakes)
    return out


def line(probe: float, clients: int, m: dict[str, float]) -> str:
    n = max(1.0, m["forks"])
    skip = {"forks", "asked", "ended", "reaped", "before"}
    kinds = sorted(k for k in m if k not in skip and ":" not in k)
    ms = " ".join(f"{k}={1000 * m[k] / n:.3f}ms" for k in kinds)
    tree_ms = 1000 * (sum(m[k] for k in kinds) + m["reaped"]) / n
    cs = " ".join(f"cs:{k}={m['cs:' + k] / n:.1f}" for k in kinds)
    return (
        (
            f"probe={probe:.0f}ms load={os.getloadavg()[0]:.2f} clients={clients}"
            f" forks={m['forks']:.0f}/{m['asked']:.0f} before={m['before']:.0f}"
            f" | {ms} tree={tree_ms:.3f}ms | {cs}"
            f" | ended={m['ended']:.0f} reaped={1000 * m['reaped'] / n:.2f}ms"
        )
        + _syscalls(m, n)
        + _threads(m, n)
    )


def _threads(m: dict[str, float], n: float) -> str:
    names = sorted((k[2:] for k in m if k.startswith("t:")), key=lambda k: -m[f"tcs:{k}"])
    shown = [k for k in names if m[f"tcs:{k}"] / n >= 0.05 or m[f"t:{k}"] * 1000 / n >= 0.01]
    if not shown:
        return ""
    return " | daemon threads (ms, wake-ups): " + " ".join(
        f"{k}={1000 * m[f't:{k}'] / n:.3f},{m[f'tcs:{k}'] / n:.2f}" for k in shown
    )


def _syscalls(m: dict[str, float], n: float) -> str:
    calls = sorted(((v, k[4:]) for k, v in m.items() if k.startswith("sys:")), reverse=True)
    if not calls:
        return ""
    total = sum(v for v, _ in calls) / n
    return f" | daemon syscalls={total:.1f} " + " ".join(f"{k}={v / n:.2f}" for v, k in calls)


def _figures(out: str) -> dict[str, float]:
    """The ms a fork by process kind (and `tree`) of a run's last level line."""
    last = [x for x in out.splitlines() if x.startswith("probe=")][-1]
    return {
        k: float(v[:-2])
        for k, v in (w.split("=", 1) for w in last.split() if "=" in w)
        if v.endswith("ms") and k != "probe" and ":" not in k and not k.startswith("reaped")
    }


def pairs_main(argv: Sequence[str], args: argparse.Namespace) -> int:
    """`--pairs M --against TREE`: this probe run in each tree, M interleaved pairs
    (`bench.ab_pairs`). A copy of this file, outside both trees, runs in each: a tree is
    measured with its own `bench.harness` and code, whether its own copy has `--pairs` or
    not."""
    from bench.ab_pairs import THIS, interleave, print_pairs, run_in_tree, summary

    this = Path(bench.__file__).resolve().parent.parent
    own = ["--clients", args.clients, "--forks", args.forks]
    own += ["--aged", str(args.aged)] if args.aged else []
    own += ["--spread-home"] if args.spread_home else []
    with tempfile.TemporaryDirectory(prefix="fork-cpu-ab-") as tmp:
        copy = Path(tmp) / "fork_cpu_probe.py"
        copy.write_text(Path(__file__).read_text())
        trees = {"against": args.against.resolve(), THIS: this}
        got = interleave(trees, args.pairs, lambda t: _figures(run_in_tree(t, [str(copy), *own])))
    kinds = sorted(got[0].figures[THIS])
    title = f"fork CPU ms a fork, {args.clients} clients, {args.forks} forks each"
    print_pairs("bench.fork_cpu", argv, [summary(title, got, kinds)])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", default="1,16", help="client counts, one window each")
    ap.add_argument("--forks", default="200,40", help="forks per client at each count")
    ap.add_argument(
        "--strace", action="store_true", help="count the daemon's system calls (strace -c -f)"
    )
    ap.add_argument(
        "--by-thread",
        action="store_true",
        help="the daemon's CPU and wake-ups by thread (threads named by bench/stamp_site)",
    )
    ap.add_argument(
        "--spread-home",
        action="store_true",
        help="the home in a block group of its own (spread_parent), not the temp directory's",
    )
    ap.add_argument(
        "--aged",
        type=int,
        default=0,
        help="forks each client makes before its window (its source's home then holds that"
        " many children more: the children bench.throughput's earlier levels leave)",
    )
    ap.add_argument("--pairs", type=int, default=0, help="interleaved A/B pairs with --against")
    ap.add_argument("--against", type=Path, default=None, help="the other tree (the base)")
    args = ap.parse_args(argv)
    if args.pairs or args.against is not None:
        if args.against is None or args.pairs < 1:
            ap.error("--pairs M and --against TREE go together")
        return pairs_main(sys.argv[1:] if argv is None else argv, args)
    levels = [int(x) for x in args.clients.split(",")]
    forks = [int(x) for x in args.forks.split(",")]
    if len(forks) != len(levels):
        ap.error("--forks names one count per --clients level")
    if args.by_thread:  # the tree's own bench/stamp_site names the daemon's threads
        site = Path(bench.__file__).resolve().parent / "stamp_site"
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
        )
        os.environ["AGENTHOST_NAME_THREADS"] = "1"
    parent = spread_parent() if args.spread_home else None
    with tempfile.TemporaryDirectory(prefix="fork-cpu-", dir=parent) as tmp:
        daemon = BenchDaemon(Path(tmp) / "home").start()
        try:
            c = daemon.client()
            sources: list[tuple[str, str]] = []
            for i in range(max(levels)):
                sid = create_session(c, f"src {i}")
                for t in range(SOURCE_TURNS):
                    run_turn(c, sid, f"turn {t}")
                sources.append((sid, last_settled_turn(c, sid)))
            for level, each in zip(levels, forks, strict=True):
                probe = cpu_probe_ms()
                trace = Path(tmp) / f"strace-{level}.txt" if args.strace else None
                m = measure(daemon, sources[:level], each, trace, args.by_thread, args.aged)
                print(line(probe, level, m), flush=True)
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
