"""Probe: where the CPU per streaming Turn goes, process by process and thread by thread — the
daemon, the provider's worker and its app-server (issue 36 targets 2 and 4). Not a benchmark
with targets: it runs `bench.turn_overhead`'s host side alone — a tutti-agent (or, with
`--provider codex`, a Codex) Session on the same timed fake model, the same reply streamed
in `--deltas` four-character deltas 2 ms apart — for `--turns` Turns after three warm ones,
and prints each thread's CPU ms per Turn (utime + stime from `/proc/PID/task/TID/stat`, 10
ms ticks: use 100 Turns or more) and its voluntary context switches per Turn (how often it slept and
was woken), with the host Turn's p50 and its `before` / `after` stages as the bench defines
them. Thread names come from `py-spy dump` when py-spy is installed (Python 3.11 does not
name its threads for the kernel), else the kernel's `comm`.

Run the same probe in two trees, alternating, to compare them on a shared machine (the CPU
per Turn moves with the load, less than the latencies do):

    PYTHONPATH=$TREE build/venv/bin/python -m bench.turn_threads --turns 100 [--deltas 20] \
        [--provider codex] [--json OUT]

Run it with `--deltas 1` too: the difference per Turn, over the 19 deltas more, is what one
delta costs each process (CPU and wake-ups).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import bench.turn_overhead as turns
from bench.common import cpu_probe_ms
from bench.harness import (
    WS,
    BenchDaemon,
    cpu_by_kind,
    create_session,
    descendants,
    process_kind,
    run_turn,
    tree,
)
from bench.profile import py_spy
from transport.client import EventSubscriber
from workspace.shadow import RACY_MARGIN_NS

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[tuple[str, str], tuple[float, int]]:
    """(tid, comm) → (CPU seconds, voluntary context switches) of each thread of `pid`."""
    out: dict[tuple[str, str], tuple[float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            with open(f"{base}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M)
        out[(tid, comm)] = (
            (int(fields[11]) + int(fields[12])) / TICK,
            int(switches.group(1)) if switches else 0,
        )
    return out


def thread_names(pid: int) -> dict[str, str]:
    """tid → the Python thread's name, from `py-spy dump` (empty without py-spy)."""
    spy = py_spy()
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    return dict(re.findall(r'Thread (\d+) \((?:active|idle)[^)]*\): "([^"]*)"', dump))


Key = tuple[str, int, str, str]
"""(process kind, pid, tid, comm) of one thread."""

KINDS = ("daemon", "worker", "app-server")
"""The processes a Turn crosses, each thread counted (git children are counted by kind)."""


def tree_threads(root: int) -> dict[Key, tuple[float, int]]:
    """Every thread of the daemon, its workers and their app-servers: CPU s, wake-ups."""
    out: dict[Key, tuple[float, int]] = {}
    for pid in descendants(root):
        kind = process_kind(pid)
        if kind == "other" and pid != root:
            continue
        kind = "daemon" if pid == root else kind
        for (tid, comm), value in threads(pid).items():
            out[(kind, pid, tid, comm)] = value
    return out


def python_names(pids: set[int]) -> dict[str, str]:
    names: dict[str, str] = {}
    for pid in pids:
        names.update(thread_names(pid))
    return names


def thread_rows(
    before: dict[Key, tuple[float, int]],
    after: dict[Key, tuple[float, int]],
    names: dict[str, str],
    n: int,
) -> list[tuple[str, str, float, float]]:
    """(kind, thread name, CPU ms per Turn, wake-ups per Turn) of each thread that ran."""
    rows = []
    for key, (cpu, switches) in after.items():
        cpu0, switches0 = before.get(key, (0.0, 0))
        if cpu > cpu0 or switches > switches0:
            name = names.get(key[2], key[3])
            rows.append((key[0], name, 1000 * (cpu - cpu0) / n, (switches - switches0) / n))
    rows.sort(key=lambda r: (KINDS.index(r[0]) if r[0] in KINDS else 9, -r[2]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=turns.DELTAS)
    parser.add_argument("--provider", default="tutti-agent", choices=("tutti-agent", "codex"))
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    turns.REPLY = "".join(f"d{i:02d} " for i in range(args.deltas))
    n = max(1, args.turns)
    tmp = Path(tempfile.mkdtemp(prefix="bench-turn-threads-"))
    with turns.side_by_side(args.provider, tmp) as (server, config, _bare):
        daemon = BenchDaemon(tmp / "home", providers={args.provider: config}).start()
        sub = EventSubscriber(daemon.events, [WS])
        try:
            c = daemon.client()
            sid = create_session(c, "turn threads", provider=args.provider)
            for i in range(3):
                run_turn(c, sid, f"warm {i}")
            # The Sessions' folder (made with the daemon) as old as a person's project is, as
            # `bench.turn_overhead` has it: within the captures' racy margin every Turn asks git.
            age = time.time() - daemon.workdir.stat().st_ctime
            time.sleep(max(0.3, RACY_MARGIN_NS / 1e9 - age + 0.05))
            load = os.getloadavg()[0]
            probe = cpu_probe_ms()
            before = tree_threads(daemon.pid)
            kinds_before = cpu_by_kind(tree(daemon.pid))
            samples = []
            for i in range(n):
                t0 = turns.now_ms()
                ms, arrivals = turns.host_turn(c, sub, sid, f"turn {i}")
                begun, emitted = server.reply_for(arrivals, t0)
                samples.append(turns.Sample(ms, arrivals, emitted, t0=t0, begun=begun))
            after = tree_threads(daemon.pid)
            kinds_after = cpu_by_kind(tree(daemon.pid))
            names = python_names({k[1] for k in after if k[0] in ("daemon", "worker")})
        finally:
            sub.close()
            daemon.stop()
    rows = thread_rows(before, after, names, n)
    print(
        f"{args.provider}: {n} Turns of {args.deltas} deltas, load {load:.2f},"
        f" CPU probe {probe:.1f} ms"
    )
    by_kind: dict[str, dict[str, float]] = {}
    for kind, _name, cpu, switches in rows:
        total = by_kind.setdefault(kind, {"cpu_ms": 0.0, "wakeups": 0.0})
        total["cpu_ms"] += cpu
        total["wakeups"] += switches
    kinds = {
        k: round(1000 * (kinds_after.get(k, 0) - kinds_before.get(k, 0)) / n, 2)
        for k in kinds_after
    }
    for kind, total in by_kind.items():
        # A thread that started and ended during the Turns (one per request in a provider's
        # HTTP client) is in its process's CPU, not in any thread read at both ends.
        total["ended_threads_cpu_ms"] = max(0.0, kinds.get(kind, 0.0) - total["cpu_ms"])
        print(
            f"{kind}: {total['cpu_ms']:.2f} CPU ms, {total['wakeups']:.1f} wake-ups per Turn"
            f" ({total['wakeups'] / max(1, args.deltas):.2f} per delta); threads that ended"
            f" meanwhile {total['ended_threads_cpu_ms']:.2f} ms"
        )
        for k, name, cpu, switches in rows:
            if k == kind and (cpu >= 0.05 or switches >= 0.5):
                print(f"  {cpu:6.2f} ms  {switches:6.1f} wake-ups  {name}")
    print(f"by process kind (with reaped children), CPU ms per Turn: {kinds}")
    mid = n // 2
    turn_p50 = sorted(s.turn_ms for s in samples)[mid]
    before_p50 = sorted(s.before_model_ms for s in samples)[mid]
    after_p50 = sorted(s.after_model_ms for s in samples)[mid]
    print(
        f"host Turn p50 {turn_p50:.1f} ms; before the model p50 {before_p50:.1f},"
        f" after it p50 {after_p50:.1f}"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "provider": args.provider,
                    "turns": n,
                    "deltas": args.deltas,
                    "load": load,
                    "cpu_probe_ms": probe,
                    "by_process": by_kind,
                    "by_kind_with_children": kinds,
                    "threads": [
                        {"process": k, "thread": name, "cpu_ms": cpu, "wakeups": sw}
                        for k, name, cpu, sw in rows
                    ],
                    "turn_p50_ms": turn_p50,
                    "before_p50_ms": before_p50,
                    "after_p50_ms": after_p50,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
