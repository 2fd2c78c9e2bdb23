"""The daemon's share of a fork, by thread and along its path (issue 36 targets 1 and 3).

Two probes of a `BenchDaemon` (tutti-agent), neither a timing benchmark of record:

- `--clients N` (default 16): `bench.loadgen`'s fork loop at N clients, each on its own source
  of 3 Turns (what `bench.throughput` runs), for `--seconds` per round; per round, the
  daemon's CPU milliseconds per committed fork **by thread** (`/proc/<pid>/task/*/stat`, each
  thread named for the kernel by `bench/stamp_site`) and its voluntary context switches per
  fork by thread (`/proc/<pid>/task/*/status`: each is a thread going to sleep — on a queue,
  a lock, the GIL, an fsync — so a count of wake-ups, which the load barely moves).
  Also per round: the whole tree's CPU per fork by process kind (daemon, driver workers,
  app-servers; `bench.harness.cpu_by_kind`) with each kind's kernel share, and the workers'
  CPU by thread; with `--gc`, after the rounds, the collector's share of each kind's CPU
  (`gc.callbacks`, through `bench/stamp_site`). `--py-spy FILE` records the tree's stacks
  over the rounds and prints each kind's samples by mechanism (`bench.profile.by_mechanism`);
  with `--gil` only the GIL's holder is sampled (its Python code, not threads queued for a
  core; a holder descheduled still counts).
- `--serial N`: N forks one at a time of a warm 10-Turn source, with an events subscriber
  connected (as a GUI is), the daemon's path stamped (`bench/stamp_site`: wall clock at the
  entry and exit of the path's functions); prints each stamp's median offset from the client's
  send, and the reply's anatomy: the commit's body and fsync'd COMMIT, the durable COMMIT to
  the reply's hand-over to the transport loop, the loop's send, and the client holding it.

This file runs with the code of whichever tree leads PYTHONPATH (the daemon is started from
that tree's `bench.harness`), so one copy measures two trees, interleaved:

    PYTHONPATH=<tree> build/venv/bin/python <this checkout>/bench/fork_daemon.py --clients 16
    PYTHONPATH=<tree> build/venv/bin/python <this checkout>/bench/fork_daemon.py --serial 80
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms, thread_counters
from bench.harness import (
    WS,
    BenchDaemon,
    acknowledge,
    cpu_by_kind,
    cpu_delta,
    create_session,
    fork_until_terminal,
    last_settled_turn,
    run_turn,
    tree,
)
from bench.loadgen import ClientSpec, now_ms, run_clients
from bench.profile import by_mechanism, py_spy

SITE = Path(__file__).resolve().parent / "stamp_site"


def _site_env(**extra: str) -> None:
    """The daemon started next loads `bench/stamp_site` (this checkout's) first."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ.update(extra)


def _snapshot(into: dict[str, Counter[str]], kinds: dict[str, float], pid: int) -> None:
    into["t"] = thread_counters(pid)
    into["w"] = _worker_threads(pid)
    kinds.clear()
    kinds.update(cpu_by_kind(tree(pid)))
    kinds.update(_kernel_by_kind(pid))


def _worker_threads(daemon_pid: int) -> Counter[str]:
    """`thread_counters` of every driver worker under the daemon, summed by thread name."""
    out: Counter[str] = Counter()
    for s in tree(daemon_pid):
        if s.kind == "worker":
            with contextlib.suppress(OSError):
                out.update(thread_counters(s.pid))
    return out


PERF_EVENTS = (
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_futex",
    "syscalls:sys_enter_newfstatat",
    "syscalls:sys_enter_openat",
    "context-switches",
)
"""What `--perf-stat` counts on the driver workers over a round (kernel tracepoints, counted
in the kernel: no per-call cost to the worker, unlike `strace`, whose stops stretch each
system call and so lengthen every interpreter-lock wait behind it)."""


def _perf_start(daemon_pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """`perf stat` of every driver worker under the daemon until `_perf_stop`."""
    pids = [str(s.pid) for s in tree(daemon_pid) if s.kind == "worker"]
    if not pids:
        return None
    argv = ["perf", "stat", "-x", ",", "-o", str(out), "-p", ",".join(pids)]
    for event in PERF_EVENTS:
        argv += ["-e", event]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _perf_stop(proc: subprocess.Popen[bytes] | None, out: Path) -> dict[str, int]:
    """Its counts by event (`-x ,`: value, unit, event, ...)."""
    if proc is None:
        return {}
    proc.send_signal(signal.SIGINT)
    proc.wait(10)
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].strip().isdigit():
            counts[fields[2]] = int(fields[0])
    return counts


def _kernel_by_kind(daemon_pid: int) -> dict[str, float]:
    """CPU seconds each process kind spent in the kernel (stime), keyed `sys:<kind>`."""
    out: dict[str, float] = {}
    for s in tree(daemon_pid):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{s.pid}/stat").read_text()
            stime = int(stat.rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")
            out[f"sys:{s.kind}"] = out.get(f"sys:{s.kind}", 0.0) + stime
    return out


def _write_stats(fifo: Path) -> dict[str, int]:
    """The daemon's store write counters (`Database.write_stats`), asked through
    `bench/stamp_site`."""
    answer = Path(str(fifo) + ".json")
    answer.unlink(missing_ok=True)
    deadline = time.monotonic() + 10
    while True:  # the daemon's reader may not have opened the pipe yet
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon does not read the write-stats pipe") from None
            time.sleep(0.01)
    os.write(fd, b"?\n")
    os.close(fd)
    while not answer.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon did not answer the write-stats ask")
        time.sleep(0.01)
    stats: dict[str, int] = json.loads(answer.read_text())
    return stats


_STATS_KEYS = (
    "transactions",
    "commits",
    "lazy_commits",
    "kept",
    "queued_takes",
    "combined",
    "handoffs",
)
"""The write counters reported per fork: write transactions (group members), fsync'd COMMITs,
lazy COMMITs, writes begun on a kept baton, baton takes that queued (a hand-off each), bodies a
baton holder ran for their callers (`Database.submit_write`) and the baton's hand-offs to a
queued thread, whether a writer's take or a submitted body's caller (a tree without a counter
reports 0)."""


def clients(
    level: int,
    seconds: float,
    rounds: int,
    spy: Path | None = None,
    gil: bool = False,
    gc_share: bool = False,
    own_workspaces: bool = False,
    perf_stat: bool = False,
) -> list[dict[str, Any]]:
    """`spy`: a py-spy recording of the daemon's whole tree (raw collapsed stacks) over the
    measured rounds, written there; `gil`: only the threads holding the GIL sampled; `gc_share`:
    each process of the tree times its collections (a thread of its own writes them once a
    second, so off by default)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fork-daemon-") as tmp:
        fifo = Path(tmp) / "write-stats"
        os.mkfifo(fifo)
        gc_times = Path(tmp) / "gc"
        _site_env(
            AGENTHOST_NAME_THREADS="1",
            AGENTHOST_WRITE_STATS=str(fifo),
            **({"AGENTHOST_GC_TIMES": str(gc_times)} if gc_share else {}),
        )
        daemon = BenchDaemon(Path(tmp) / "home").start()
        try:
            c = daemon.client()
            specs = []
            for n in range(level):
                ws = client_workspace(n) if own_workspaces else WS
                sid = create_session(c, f"src {n}", ws)
                for i in range(3):
                    run_turn(c, sid, f"turn {i}", ws)
                args: dict[str, Any] = {
                    "ws": ws,
                    "sid": sid,
                    "turn_id": last_settled_turn(c, sid, ws),
                }
                if own_workspaces:
                    args["subscribe"] = (ws,)
                specs.append(ClientSpec("fork", args))
            run_clients(daemon.api, specs, 2.0, events=daemon.events)  # warm
            recorder = _spy_start(daemon.pid, spy, gil) if spy is not None else None
            for _ in range(rounds):
                load, probe = os.getloadavg()[0], cpu_probe_ms()
                stats0 = _write_stats(fifo)
                before: dict[str, Counter[str]] = {}
                kinds0: dict[str, float] = {}
                perf_out = Path(tmp) / "perf.txt"
                perf = _perf_start(daemon.pid, perf_out) if perf_stat else None
                records = run_clients(
                    daemon.api,
                    specs,
                    seconds,
                    events=daemon.events,
                    on_start=functools.partial(_snapshot, before, kinds0, daemon.pid),
                )
                after = thread_counters(daemon.pid)
                after_w = _worker_threads(daemon.pid)
                perf_counts = _perf_stop(perf, perf_out)
                both = cpu_delta(
                    kinds0, {**cpu_by_kind(tree(daemon.pid)), **_kernel_by_kind(daemon.pid)}
                )
                kinds = {k: v for k, v in both.items() if not k.startswith("sys:")}
                kernel = {k[4:]: v for k, v in both.items() if k.startswith("sys:")}
                wdelta = {k: after_w[k] - before["w"].get(k, 0) for k in after_w}
                stats1 = _write_stats(fifo)
                forks = sum(1 for rs in records for r in rs if r.get("reason") == "committed")
                n = max(1, forks)
                delta = {k: after[k] - before["t"].get(k, 0) for k in after}
                cpu = {k[4:]: v / tick * 1000 / n for k, v in delta.items() if k[:4] == "cpu:"}
                wakes = {k[3:]: v / n for k, v in delta.items() if k[:3] == "cs:"}
                row = {
                    "load": load,
                    "cpuProbeMs": probe,
                    "forks": forks,
                    "forksPerSecond": forks / seconds,
                    "cpuMsPerFork": sum(cpu.values()),
                    "wakeupsPerFork": sum(wakes.values()),
                    "cpuByThread": cpu,
                    "treeCpuMsPerFork": sum(kinds.values()) * 1000 / n,
                    "treeCpuByKind": {k: v * 1000 / n for k, v in kinds.items()},
                    "kernelCpuByKind": {k: v * 1000 / n for k, v in kernel.items()},
                    "workerCpuByThread": {
                        k[4:]: v / tick * 1000 / n for k, v in wdelta.items() if k[:4] == "cpu:"
                    },
                    "wakeupsByThread": wakes,
                    "workerWakeupsByThread": {
                        k[3:]: v / n for k, v in wdelta.items() if k[:3] == "cs:" and v
                    },
                    "workerPerfPerFork": {k: v / n for k, v in perf_counts.items()},
                    "workerPreemptionsByThread": {
                        k[4:]: v / n for k, v in wdelta.items() if k[:4] == "ncs:" and v
                    },
                    "writesPerFork": {
                        k: (stats1.get(k, 0) - stats0.get(k, 0)) / n for k in _STATS_KEYS
                    },
                }
                out.append(row)
                print(_round_line(row), flush=True)
            if recorder is not None and spy is not None:
                _spy_stop(recorder)
                for kind, counts in by_mechanism(spy.read_text(errors="replace")).items():
                    total = sum(counts.values()) or 1
                    shares = ", ".join(
                        f"{m} {100 * c / total:.1f} %" for m, c in counts.most_common()
                    )
                    print(f"py-spy {kind} ({total} samples): {shares}", flush=True)
            if gc_share:
                time.sleep(1.1)  # each process writes its totals once a second
                print(_gc_line(gc_times), flush=True)
        finally:
            daemon.stop()
    return out


def client_workspace(n: int) -> str:
    """`--own-workspaces`' workspace of client `n`: no id a prefix of another's (ZeroMQ's
    subscriptions are prefix matches), so each client's SUB is sent its own forks' events only."""
    return f"{WS}-{n:04d}"


def _gc_line(prefix: Path) -> str:
    """The collector's share of each kind's Python CPU over the daemon's life so far."""
    by_kind: dict[str, list[float]] = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        kind = path.name.split(".")[1]
        with contextlib.suppress(OSError, ValueError):
            n, gc_s, cpu_s = (float(x) for x in path.read_text().split())
            totals = by_kind.setdefault(kind, [0.0, 0.0, 0.0])
            totals[0] += n
            totals[1] += gc_s
            totals[2] += cpu_s
    return "gc over the run: " + "; ".join(
        f"{kind} {int(n)} collections, {gc_s * 1000:.0f} ms of {cpu_s:.1f} s CPU"
        f" ({100 * gc_s / max(cpu_s, 1e-9):.1f} %)"
        for kind, (n, gc_s, cpu_s) in sorted(by_kind.items())
    )


def _spy_start(pid: int, out: Path, gil: bool) -> subprocess.Popen[bytes]:
    spy = py_spy()
    if spy is None:
        raise RuntimeError("py-spy is not installed (pip install -e '.[bench]')")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking"]
        + ["--format", "raw", "--rate", "100", "-o", str(out)]
        + (["--gil"] if gil else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _spy_stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _round_line(row: dict[str, Any]) -> str:
    def top(d: dict[str, float]) -> str:
        items = sorted(d.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k} {v:.2f}" for k, v in items if v >= 0.05)

    return (
        f"load {row['load']:.1f} probe {row['cpuProbeMs']:.0f} ms: {row['forks']} forks"
        f" ({row['forksPerSecond']:.1f}/s); daemon CPU {row['cpuMsPerFork']:.2f} ms/fork"
        f" [{top(row['cpuByThread'])}]; wake-ups {row['wakeupsPerFork']:.1f}/fork"
        f" [{top(row['wakeupsByThread'])}]; tree CPU {row['treeCpuMsPerFork']:.2f} ms/fork"
        f" [{top(row['treeCpuByKind'])}; kernel {top(row['kernelCpuByKind'])}]"
        f"; worker CPU [{top(row['workerCpuByThread'])}]"
        f"; worker wake-ups {sum(row['workerWakeupsByThread'].values()):.1f}/fork"
        f" [{top(row['workerWakeupsByThread'])}]"
        f", preempted [{top(row['workerPreemptionsByThread'])}]"
        + (
            "; worker perf per fork ["
            + ", ".join(f"{k} {v:.1f}" for k, v in row["workerPerfPerFork"].items())
            + "]"
            if row["workerPerfPerFork"]
            else ""
        )
        + "; per fork "
        + ", ".join(f"{k} {v:.2f}" for k, v in row["writesPerFork"].items())
    )


def serial(samples: int, turns: int = 10) -> dict[str, Any]:
    from bench.providers import PROVIDERS

    entry = next(e for e in PROVIDERS if e.name == "tutti-agent")
    with tempfile.TemporaryDirectory(prefix="bench-fork-daemon-") as tmp_text:
        tmp = Path(tmp_text)
        stamps_file = tmp / "stamps.tsv"
        _site_env(AGENTHOST_STAMPS=str(stamps_file))
        ops: list[tuple[float, float]] = []
        with entry.environment() as config:
            daemon = BenchDaemon(
                tmp / "home", providers={entry.name: config} if config else {}
            ).start()
            try:
                c = daemon.client()
                _drain_events(daemon.events)
                sid = create_session(c, "serial", provider=entry.name)
                for i in range(turns):
                    run_turn(c, sid, f"turn {i}")
                boundary = last_settled_turn(c, sid)
                for _ in range(5):
                    acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
                for _ in range(samples):
                    t0 = now_ms()
                    op = fork_until_terminal(c, sid, boundary)
                    ops.append((t0, now_ms()))
                    if op["status"] != "committed":
                        raise RuntimeError(f"fork did not commit: {op}")
                    acknowledge(c, op["operationId"])
            finally:
                daemon.stop()
        stamps = [
            (point, float(ms))
            for point, ms in (line.split("\t") for line in stamps_file.read_text().splitlines())
        ]
    return _anatomy(ops, stamps)


def _drain_events(endpoint: str) -> None:
    """An events subscriber of every workspace, read on a thread of its own (a GUI's)."""
    from transport.client import EventSubscriber

    sub = EventSubscriber(endpoint)

    def drain() -> None:
        while True:
            try:
                sub.next_message(1.0)
            except Exception:  # noqa: BLE001 - the daemon stopped
                return

    threading.Thread(target=drain, name="events", daemon=True).start()


_COUNTED = (
    "events.batch",
    "events.project",
    "events.handover",
    "pool.submit",
    "actor.session_read",
    "prepare.session_read",
    "history_link",
)
"""Stamps counted per fork: the events thread's wake-ups with work, its projections, its
hand-overs to the transport loop, the actor pool's scheduled slices, the Session row reads (the
actor's `cached_session`, prepare's) and the history link reads (storage/history_links.py's and
storage/fork_snapshot.py's)."""


def _anatomy(ops: list[tuple[float, float]], stamps: list[tuple[str, float]]) -> dict[str, Any]:
    offsets: dict[str, list[float]] = {}
    reply: dict[str, list[float]] = {k: [] for k in ("body", "toReply", "toLoop", "toClient")}
    host: list[float] = []
    for t0, t1 in ops:
        seen: Counter[str] = Counter()
        inside = [(p, t) for p, t in stamps if t0 <= t <= t1]
        for point, t in inside:
            seen[point] += 1
            key = point if seen[point] == 1 else f"{point}#{seen[point]}"
            offsets.setdefault(key, []).append(t - t0)
        host.append(t1 - t0)
        begins = [t for p, t in inside if p == "commit.begin"]
        if not begins:
            continue
        c0 = begins[-1]
        durable = next((t for p, t in inside if p == "group.end" and t >= c0), None)
        answered = next((t for p, t in inside if p == "responder.result" and t >= c0), None)
        sent = next(
            (t for p, t in inside if p == "loop.send_reply" and answered and t >= answered), None
        )
        if durable is None or answered is None or sent is None:
            continue
        reply["body"].append(durable - c0)
        reply["toReply"].append(answered - durable)
        reply["toLoop"].append(sent - answered)
        reply["toClient"].append(t1 - durable)
    med = {
        k: statistics.median(v)
        for k, v in offsets.items()
        if len(v) >= len(ops) // 2 and k.split("#")[0] not in _COUNTED
    }
    # The counted points over the whole series (a fork's events and its ACK's land after its
    # reply), per fork: load-independent.
    counted = Counter(p for p, t in stamps if p in _COUNTED and ops and t >= ops[0][0])
    out = {
        "forks": len(ops),
        "countsPerFork": {k: counted[k] / len(ops) for k in _COUNTED},
        "hostP50Ms": statistics.median(host),
        "stampP50Ms": dict(sorted(med.items(), key=lambda kv: kv[1])),
        "replyP50Ms": {k: statistics.median(v) for k, v in reply.items() if v},
    }
    for point, ms in out["stampP50Ms"].items():
        print(f"  {point:20s} {ms:8.3f} ms after the client's send")
    print("  per fork: " + ", ".join(f"{k} {v:.2f}" for k, v in out["countsPerFork"].items()))
    r = out["replyP50Ms"]
    print(
        f"host p50 {out['hostP50Ms']:.2f} ms; reply p50: commit body + COMMIT {r['body']:.3f},"
        f" durable → reply handed over {r['toReply']:.3f}, → loop sends {r['toLoop']:.3f},"
        f" durable → client has it {r['toClient']:.3f} ms"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serial", type=int, default=0, help="forks one at a time, stamped")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--py-spy", type=Path, default=None, help="record the tree's stacks (raw) over the rounds"
    )
    ap.add_argument("--gil", action="store_true", help="py-spy samples only the GIL's holder")
    ap.add_argument("--gc", action="store_true", help="the collector's share of each kind's CPU")
    ap.add_argument(
        "--own-workspaces",
        action="store_true",
        help="each client's source in a workspace of its own, its SUB subscribed to that one"
        " (the events' fan-out: each is sent to one client, not to all)",
    )
    ap.add_argument(
        "--perf-stat",
        action="store_true",
        help="count the workers' system calls and context switches per fork (perf stat)",
    )
    args = ap.parse_args(argv)
    if args.serial:
        result: Any = serial(args.serial)
    else:
        result = clients(
            args.clients,
            args.seconds,
            args.rounds,
            args.py_spy,
            args.gil,
            args.gc,
            own_workspaces=args.own_workspaces,
            perf_stat=args.perf_stat,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
