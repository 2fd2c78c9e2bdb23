"""What a warm fork costs the daemon at N clients beyond what it costs alone (issue 36 target 3).

One `BenchDaemon` (tutti-agent, threads named for the kernel by `bench/stamp_site`), N sources
of 3 settled Turns, each forked and ACKed to warm; then rounds alternating 1 client (forks one
at a time) and N clients (`bench.loadgen`'s fork loop, as `bench.throughput` runs it), each for
`--seconds`. Per round and per committed fork, by daemon thread (numbered threads summed): CPU
ms (`/proc/<pid>/task/*/stat`), voluntary context switches (a thread going to sleep: on a
queue, a lock, the GIL, an fsync, a poll) and involuntary ones (a thread preempted: at two
cores mostly the GIL's forced hand-off's and the scheduler's), and the store's write counters
(`Database.write_stats`: group members, fsync'd COMMITs, baton hand-offs). Counts, not times,
decide: the load barely moves them. `--perf` counts, per thread, the system calls named in
`PERF_EVENTS` and the scheduler's switches and wake-ups issued (`perf stat --per-thread` on
tracepoints: counted in the kernel, no trace, so it barely slows the daemon). `--strace` adds a
round at each level under `strace -f -c` of the daemon alone (every syscall, traced: slower, so
read only the counts).

    PYTHONPATH=<tree> build/venv/bin/python <this checkout>/bench/fork_concurrency.py \
        --clients 16 --seconds 5 --rounds 2 [--strace] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms
from bench.common import thread_counters as counters
from bench.fork_daemon import _STATS_KEYS, _site_env, _write_stats
from bench.harness import (
    WS,
    BenchDaemon,
    acknowledge,
    create_session,
    fork_until_terminal,
    last_settled_turn,
    run_turn,
)
from bench.loadgen import ClientSpec, run_clients

PERF_EVENTS = (
    "syscalls:sys_enter_futex",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_epoll_ctl",
    "syscalls:sys_enter_poll",
    "syscalls:sys_enter_read",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_sendto",
    "syscalls:sys_enter_recvfrom",
    "syscalls:sys_enter_pwrite64",
    "syscalls:sys_enter_pread64",
    "syscalls:sys_enter_fdatasync",
    "syscalls:sys_enter_getpid",
    "syscalls:sys_enter_fcntl",
    "sched:sched_switch",
    "sched:sched_wakeup",
)
"""What `--perf` counts per thread: `sched_switch` is the thread leaving its core (asleep or
preempted), `sched_wakeup` a wake-up the thread issued (of any task)."""


def _strace_c(text: str) -> dict[str, int]:
    """`strace -c`'s table: calls by syscall."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and not line.lstrip().startswith("100"):
            name = parts[-1]
            try:
                calls[name] = int(parts[3])
            except ValueError:
                continue
    return calls


def _perf_per_thread(text: str) -> dict[str, dict[str, int]]:
    """`perf stat -x, --per-thread`'s lines (`comm-tid,count,,event,...`): counts by thread
    name (numbered threads summed) and short event name."""
    out: dict[str, dict[str, int]] = {}
    for row in text.splitlines():
        parts = row.split(",")
        if len(parts) < 4 or not parts[1].strip().isdigit():
            continue
        name = re.sub(r"[_-]?\d+$", "", parts[0].rsplit("-", 1)[0])
        event = parts[3].split(":")[-1].replace("sys_enter_", "")
        into = out.setdefault(name, {})
        into[event] = into.get(event, 0) + int(parts[1])
    return out


def _serial(
    daemon: BenchDaemon, spec: ClientSpec, seconds: float, start: Any
) -> list[dict[str, Any]]:
    """Level 0: `bench.fork_overhead`'s loop, in this process, no events subscriber: create,
    `fork.get` every 10 ms while `accepted`, ACK."""
    c = daemon.client()
    out: list[dict[str, Any]] = []
    start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        op = fork_until_terminal(c, spec.args["sid"], spec.args["turn_id"])
        out.append({"reason": op["status"]})
        if op["status"] == "committed":
            acknowledge(c, op["operationId"])
    return out


def one_round(
    daemon: BenchDaemon,
    fifo: Path,
    specs: list[ClientSpec],
    seconds: float,
    strace: Path | None,
    perf: Path | None = None,
    record: Path | None = None,
) -> dict[str, Any]:
    tick = os.sysconf("SC_CLK_TCK")
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    stats0 = _write_stats(fifo)
    before: dict[str, Counter[str]] = {}
    tracer: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        before["c"] = counters(daemon.pid)
        if perf is not None:
            tracer.append(
                subprocess.Popen(
                    ["perf", "stat", "-x,", "--per-thread", "-o", str(perf)]
                    + ["-p", str(daemon.pid), "-e", ",".join(PERF_EVENTS)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if record is not None:
            tracer.append(
                subprocess.Popen(
                    ["perf", "record", "-q", "-e", "syscalls:sys_enter_futex"]
                    + ["-o", str(record), "-p", str(daemon.pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if strace is not None:
            tracer.append(
                subprocess.Popen(
                    ["strace", "-f", "-c", "-o", str(strace), "-p", str(daemon.pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    if len(specs) == 1 and specs[0].args.get("serial"):
        records = [_serial(daemon, specs[0], seconds, start)]
    else:
        records = run_clients(daemon.api, specs, seconds, events=daemon.events, on_start=start)
    after = counters(daemon.pid)
    for p in tracer:
        p.send_signal(signal.SIGINT)
        p.wait(30)
    stats1 = _write_stats(fifo)
    forks = sum(1 for rs in records for r in rs if r.get("reason") == "committed")
    n = max(1, forks)
    delta = {k: after[k] - before["c"].get(k, 0) for k in after if not k.startswith("n:")}
    by_thread: dict[str, dict[str, float]] = {}
    for k, v in delta.items():
        kind, name = k.split(":", 1)
        scale = 1000 / tick if kind == "cpu" else 1.0
        by_thread.setdefault(name, {})[kind] = v * scale / n
    row: dict[str, Any] = {
        "clients": len(specs),
        "load": load,
        "cpuProbeMs": probe,
        "forks": forks,
        "forksPerSecond": forks / seconds,
        "cpuMsPerFork": sum(t.get("cpu", 0.0) for t in by_thread.values()),
        "voluntaryPerFork": sum(t.get("cs", 0.0) for t in by_thread.values()),
        "involuntaryPerFork": sum(t.get("ncs", 0.0) for t in by_thread.values()),
        "byThread": by_thread,
        "writesPerFork": {k: (stats1.get(k, 0) - stats0.get(k, 0)) / n for k in _STATS_KEYS},
    }
    if perf is not None and perf.exists():
        row["perfPerFork"] = {
            name: {k: v / n for k, v in events.items()}
            for name, events in _perf_per_thread(perf.read_text()).items()
        }
    if strace is not None and strace.exists():
        row["syscallsPerFork"] = {k: v / n for k, v in _strace_c(strace.read_text()).items()}
    return row


def line(row: dict[str, Any]) -> str:
    threads = sorted(row["byThread"].items(), key=lambda kv: -kv[1].get("cpu", 0.0))
    per = "; ".join(
        f"{name} {t.get('cpu', 0):.2f} ms v{t.get('cs', 0):.1f} n{t.get('ncs', 0):.1f}"
        for name, t in threads
        if t.get("cpu", 0) >= 0.02 or t.get("cs", 0) >= 0.3
    )
    writes = ", ".join(f"{k} {v:.2f}" for k, v in row["writesPerFork"].items())
    out = (
        f"{row['clients']:>2} clients load {row['load']:.1f} probe {row['cpuProbeMs']:.0f} ms:"
        f" {row['forks']} forks ({row['forksPerSecond']:.1f}/s); daemon CPU"
        f" {row['cpuMsPerFork']:.2f} ms, voluntary {row['voluntaryPerFork']:.1f}, involuntary"
        f" {row['involuntaryPerFork']:.1f} a fork\n   [{per}]\n   writes: {writes}"
    )
    if "perfPerFork" in row:
        totals: Counter[str] = Counter()
        for events in row["perfPerFork"].values():
            totals.update(events)
        out += "\n   perf: " + ", ".join(f"{k} {v:.1f}" for k, v in totals.most_common())
        for name, events in sorted(
            row["perfPerFork"].items(), key=lambda kv: -kv[1].get("sched_switch", 0)
        ):
            if sum(events.values()) >= 1:
                shown = sorted(events.items(), key=lambda kv: -kv[1])
                out += f"\n     {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in shown if v >= 0.1)
    if "syscallsPerFork" in row:
        top = sorted(row["syscallsPerFork"].items(), key=lambda kv: -kv[1])[:14]
        out += "\n   syscalls: " + ", ".join(f"{k} {v:.1f}" for k, v in top)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument(
        "--levels",
        default="",
        help="the rounds' client counts, alternated (default: 1,CLIENTS); 0 is"
        " `bench.fork_overhead`'s loop: one client in this process, no events subscriber",
    )
    ap.add_argument("--actor-threads", type=int, default=0, help="`[daemon] actor_threads`")
    ap.add_argument("--perf", action="store_true", help="per-thread syscall and switch counts")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--record",
        type=Path,
        default=None,
        help="a folder: a round at each level records each futex call (`perf record` of the"
        " tracepoint: thread, address, operation) and the daemon's memory map, so the"
        " interpreter lock's calls can be told from other locks'",
    )
    args = ap.parse_args(argv)
    if args.strace and shutil.which("strace") is None:
        print("strace is not installed", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fork-conc-") as tmp:
        fifo = Path(tmp) / "write-stats"
        os.mkfifo(fifo)
        _site_env(AGENTHOST_NAME_THREADS="1", AGENTHOST_WRITE_STATS=str(fifo))
        config = {"actor_threads": args.actor_threads} if args.actor_threads else {}
        daemon = BenchDaemon(Path(tmp) / "home", daemon=config).start()
        try:
            c = daemon.client()
            specs = []
            for i in range(args.clients):
                sid = create_session(c, f"src {i}")
                for t in range(3):
                    run_turn(c, sid, f"turn {t}")
                turn = last_settled_turn(c, sid)
                specs.append(ClientSpec("fork", {"ws": WS, "sid": sid, "turn_id": turn}))
            run_clients(daemon.api, specs, 2.0, events=daemon.events)  # warm every source
            levels = [int(x) for x in args.levels.split(",") if x] or [1, args.clients]
            plan = levels * args.rounds
            serial = [ClientSpec("fork", {**specs[0].args, "serial": True})]
            for i, level in enumerate(plan):
                time.sleep(0.3)
                perf = Path(tmp) / f"perf-{i}.txt" if args.perf else None
                chosen = serial if level == 0 else specs[:level]
                row = one_round(daemon, fifo, chosen, args.seconds, None, perf)
                row["clients"] = level
                rows.append(row)
                print(line(row), flush=True)
            if args.record is not None:
                args.record.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f"/proc/{daemon.pid}/maps", args.record / "maps")
                for level in (1, args.clients):
                    data = args.record / f"futex-{level}.data"
                    row = one_round(daemon, fifo, specs[:level], 2.0, None, None, data)
                    print(f"(recorded {data}) {row['forks']} forks at {level}", flush=True)
            if args.strace:
                for level in (1, args.clients):
                    out = Path(tmp) / f"strace-{level}.txt"
                    row = one_round(daemon, fifo, specs[:level], args.seconds, out)
                    row["straced"] = True
                    rows.append(row)
                    print("(straced) " + line(row), flush=True)
        finally:
            daemon.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
