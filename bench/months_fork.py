"""Benchmark: a fork through the last Turn of the months store's 10,000-Turn Session (issue 36
target 5's fork row), through a real daemon, with the CPU each process spent on it.

`bench.months` prints the fork's wall time; this prints, per fork (the first cold: its
app-server loads the thread; then `--warm` warm ones), the wall time and the CPU time of the
daemon, its worker and the tutti-agent app-server (psutil, before and after each fork), so a
run of main and of a branch, alternated, compare what each process spent; beside it each
process's system CPU, minor and major page faults and disk reads (`bench.proc_cost`: a cold page
cache shows as major faults and disk reads, a costly VM minute as system CPU per minor fault) and
the VM's cost of one first-touch page fault at the end. The client polls
`fork.get` every 5 ms, as `bench.months` does; each fork's host stages (prepare / attest /
provider+bind / commit / reply, from the operation's durable timestamps, as `bench.fork_overhead`)
are printed beside it. The store comes from `bench.months`' cache
(`--sessions/--turns/--big-turns/--operations/--scale` as there; a small store of the full
store's shape builds in about a minute):

    build/venv/bin/python -m bench.months_fork --sessions 300 --turns 12000 --big-turns 10000 \\
        --operations 100 [--warm 2]

`--reads N` times instead, in this process and without a daemon, what each side does with that
Session's rollout (60,002 lines, 14.7 MB) per fork, by CPU clock, the median of N rounds: the
worker's bind parse (`parse_rollout`: every line decoded and checked), the app-server's read
(`read_rollout`, what a cold resume loads), the proof's lines from the bind's decode
(`lines_of_decoded`) and its lean reduction (`build_turns(..., with_items=False)`), with the
minor page faults of each (memory the process touched afresh); and what the worker waits for
of tutti-agent's app-server in a cold fork (`AppServer.handle_line` in this process on a copy
of the rollout): the CPU until the answer of the runtime's `thread/resume` (no turns), of the
source's lean `thread/read` 0.3 s later, and of a cold and a warm `thread/fork` through the last
Turn (`loaded: false`, no items); work after an answer (a resume's deferred load) is not
counted (page faults 0: not measured). Run from one tree with another tree's code first on
`PYTHONPATH` (`python <this tree>/bench/months_fork.py --reads 5`), it times that tree's code:
an A/B of the reads alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import Table, command_for, cpu_probe_ms, log
from bench.fork_overhead import STAGES, stage_times
from bench.harness import WS, BenchDaemon, acknowledge, fork_until_terminal
from bench.loadgen import now_ms
from bench.months import SESSION, Size, _id, _interrupted, cached_home
from bench.proc_cost import PROCS, by_process, fault_probe_us, spent

MODULE = "bench.months_fork"


def _wait_recovered(home: Path, timeout_s: float = 1200.0) -> int:
    """Wait until no fork operation of the store at `home` is left non-terminal (or the
    timeout); how many still are."""
    deadline = time.monotonic() + timeout_s
    while (left := _interrupted(home)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


Row = tuple[str, float, dict[str, float], dict[str, float]]
"""(fork, wall ms, CPU ms by process, host stage ms from the operation's timestamps)."""


def measure(home: Path, big_turns: int, warm: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="months-fork-") as tmp:
        work = Path(tmp) / "home"
        shutil.copytree(home, work, ignore=shutil.ignore_patterns("complete"))
        # The copy's write-back (4.1 GB at full size) done before the daemon starts: else the
        # forks' fsyncs wait behind it, and their wall measures the copy.
        os.sync()
        # The first start recovers the interrupted operations: the commits it defers past its
        # ready line (`actors.recovery.DeferredCommits`) are waited for, as `bench.months` does,
        # else the next start makes them on a thread of its own during the cold fork (~1.4 s
        # of the daemon's CPU at full size) and the cold row measures recovery.
        first = BenchDaemon(work).start(timeout=1200)
        at_ready, ready_at = _interrupted(work), time.monotonic()
        left = _wait_recovered(work)
        log(
            f"months-fork: {at_ready:,} operation(s) left at the first start's ready line, all"
            f" terminal {time.monotonic() - ready_at:.1f} s later"
        )
        first.stop()
        if left:
            raise RuntimeError(f"{left} interrupted operation(s) not terminal after recovery")
        daemon = BenchDaemon(work, idle_actor_seconds=60.0).start(timeout=600)
        rows: list[tuple[str, float, dict[str, float]]] = []
        ops: list[dict[str, Any]] = []
        try:
            c = daemon.client(timeout=600)
            big = _id(SESSION, 0)
            # The big Session's last Turn, read back as a client would (as `bench.months`).
            page: Any = c.call(
                "session.timeline",
                {
                    "workspaceId": WS,
                    "agentSessionId": big,
                    "afterSequence": max(0, big_turns - 50),
                    "limit": 50,
                },
            )
            last = str(page["turns"][-1]["turnId"])
            for i in range(1 + warm):
                before = by_process(daemon.pid)
                t, t0 = time.perf_counter(), now_ms()
                op = fork_until_terminal(c, big, last, poll_s=0.005)
                wall, t1 = (time.perf_counter() - t) * 1000, now_ms()
                after = by_process(daemon.pid)
                ops.append({"operationId": op["operationId"], "t0": t0, "t1": t1})
                if op["status"] != "committed":
                    raise RuntimeError(f"the big Session's fork did not commit: {op}")
                acknowledge(c, op["operationId"])
                cpu = {
                    f"{name} {k}" if k != "cpu" else name: v * 1000 if k in ("cpu", "sys") else v
                    for name, got in spent(before, after).items()
                    for k, v in got.items()
                }
                rows.append(("cold" if i == 0 else f"warm {i}", wall, cpu))
                log(f"months-fork: {rows[-1][0]} {wall:.0f} ms")
        finally:
            daemon.stop()
        # Where each fork's wall went, from its durable timestamps (read once the daemon is
        # gone): fork.create → created → dispatched → provider accepted → committed → seen.
        stages = stage_times(work / "store.sqlite3", ops)
    return [
        (name, wall, cpu, {stage: stages[stage][i] for stage in STAGES})
        if all(len(stages[stage]) == len(rows) for stage in STAGES)
        else (name, wall, cpu, {})
        for i, (name, wall, cpu) in enumerate(rows)
    ]


def measure_reads(home: Path, rounds: int) -> list[tuple[str, float, float]]:
    """(step, median CPU ms, median minor page faults) of each read of the big Session's
    rollout, each step timed alone, the collector held off as the fork holds it."""
    from drivers.binder import parse_rollout
    from tutti_agent.history import build_turns
    from tutti_agent.rollout import gc_paused, lines_of_decoded, read_rollout

    rollout = next((home / "runtimes" / WS / _id(SESSION, 0)).rglob("rollout-*.jsonl"))
    thread_id = rollout.name[-len(".jsonl") - 36 : -len(".jsonl")]
    data = rollout.read_bytes()
    samples: dict[str, list[tuple[float, float]]] = {}

    def timed(step: str, call: Any, *args: Any) -> Any:
        before, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
        out = call(*args)
        cpu, faults = time.thread_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        samples.setdefault(step, []).append((cpu * 1000, faults - before))
        return out

    for _ in range(rounds):
        with gc_paused():
            parsed = timed("bind parse", parse_rollout, data, thread_id)
            lines = timed("proof lines", lines_of_decoded, data, parsed.records, rollout)
            items = [line.item for line in lines]
            timed("lean reduction", partial(build_turns, with_items=False), items)
            del parsed, lines, items
            timed("app-server read", read_rollout, rollout)
        for step, cpu in _app_server_answers(rollout, thread_id):
            samples.setdefault(step, []).append((cpu, 0.0))
    return [
        (step, statistics.median(c for c, _ in got), statistics.median(f for _, f in got))
        for step, got in samples.items()
    ]


ANSWER_GAP_S = 0.3
"""The pause between a cold runtime's `thread/resume` and the fork's source `thread/read` in
`_app_server_answers`: what the host does between them (the operation created, the store's
prepare: ~0.2–0.4 s on the full store)."""


def _app_server_answers(rollout: Path, thread_id: str) -> list[tuple[str, float]]:
    """(step, CPU ms of the app-server's request thread until its answer was written) of what
    a cold fork asks tutti-agent's app-server, in one process (`AppServer.handle_line` on a
    copy of the rollout in a home of its own): the runtime's `thread/resume` without turns,
    `ANSWER_GAP_S` later the source's `thread/read` without items, then a fork through the last
    Turn `loaded: false` without items, twice (cold, warm). Work a request does after its
    answer has left (a resume's deferred load) is not counted: the worker does not wait for
    it."""
    import io

    from tutti_agent.model import BuiltinModel
    from tutti_agent.server import AppServer
    from tutti_agent.store import ThreadStore

    last = next(
        line["payload"]["turn_id"]
        for line in map(json.loads, reversed(rollout.read_bytes().splitlines()[-20:]))
        if line["payload"].get("type") == "task_complete"
    )
    with tempfile.TemporaryDirectory(prefix="months-fork-answers-") as tmp:
        home = Path(tmp)
        # Below the rollout's home as it is filed there (`sessions/`, or an older
        # `sessions/YYYY/MM/DD`).
        filed = next(p for p in rollout.parents if p.name == "sessions").parent
        copy = home / rollout.relative_to(filed)
        copy.parent.mkdir(parents=True)
        shutil.copyfile(rollout, copy)

        class Answers(io.StringIO):
            cpu: float | None = None

            def write(self, text: str) -> int:
                if self.cpu is None:
                    self.cpu = time.thread_time()
                return super().write(text)

        out = Answers()
        server = AppServer(ThreadStore(home), BuiltinModel(), out)
        got: list[tuple[str, float]] = []

        def ask(step: str, method: str, params: dict[str, Any]) -> None:
            out.seek(0)
            out.truncate()
            out.cpu = None
            cpu = time.thread_time()
            server.handle_line(json.dumps({"id": len(got) + 1, "method": method, "params": params}))
            answer = json.loads(out.getvalue().split("\n", 1)[0])
            if "error" in answer or out.cpu is None:
                raise SystemExit(f"{method}: {answer.get('error')}")
            if step:
                got.append((step, (out.cpu - cpu) * 1000))

        ask("", "initialize", {"clientInfo": {"name": MODULE, "version": "0"}})
        ask(
            "app-server resume (runtime start)",
            "thread/resume",
            {"threadId": thread_id, "excludeTurns": True},
        )
        time.sleep(ANSWER_GAP_S)
        lean = {"includeTurns": True, "turnItems": False}
        ask("app-server source read", "thread/read", {"threadId": thread_id, **lean})
        fork = {"threadId": thread_id, "lastTurnId": last, "loaded": False, "turnItems": False}
        ask("app-server fork, cold", "thread/fork", fork)
        ask("app-server fork, warm", "thread/fork", fork)
        server.shutdown()
    return got


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.add_argument("--scale", type=float, default=0.001)
    for dim in ("sessions", "turns", "big-turns", "operations"):
        ap.add_argument(f"--{dim}", type=int, default=None)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--reads", type=int, default=0, metavar="N")
    args = ap.parse_args(argv)
    counts = {
        key: value
        for key in ("sessions", "turns", "big_turns", "operations")
        if (value := getattr(args, key)) is not None
    }
    size = Size.of(args.scale).with_counts(**counts)
    home = cached_home(size)
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    if args.reads:
        reads = measure_reads(home, args.reads)
        print(
            Table(
                f"reads of the 10,000-Turn rollout in one process, median of {args.reads} (1-min"
                f" load {load:.2f}, CPU probe {probe:.1f} ms)",
                ("step", "CPU ms", "minor page faults"),
                tuple(reads),
            ).render()
        )
        return 0
    rows = measure(home, size.big_turns, args.warm)
    load_end, probe_end, fault_us = os.getloadavg()[0], cpu_probe_ms(), fault_probe_us()
    table = Table(
        f"fork through the last Turn of {size.describe()}: wall and CPU per process (1-min"
        f" load {load:.2f} → {load_end:.2f}, CPU probe {probe:.1f} → {probe_end:.1f} ms,"
        f" a first-touch page fault {fault_us:.1f} µs)",
        (
            "fork",
            "wall ms",
            "daemon CPU ms",
            "worker CPU ms",
            "app-server CPU ms",
            "system CPU ms (d / w / a)",
            "minor faults (d / w / a)",
            "major faults (d / w / a)",
            "disk MB read (d / w / a)",
            "stages ms (" + " / ".join(STAGES) + ")",
        ),
        tuple(
            (
                name,
                wall,
                cpu.get("daemon", 0.0),
                cpu.get("worker", 0.0),
                cpu.get("app-server", 0.0),
                *(
                    " / ".join(f"{cpu.get(f'{p} {k}', 0.0):{fmt}}" for p in PROCS)
                    for k, fmt in (("sys", ".0f"), ("minflt", ".0f"), ("majflt", ".0f"))
                ),
                " / ".join(f"{cpu.get(f'{p} readMB', 0.0):.1f}" for p in PROCS),
                " / ".join(f"{stages[s]:.0f}" for s in STAGES) if stages else "-",
            )
            for name, wall, cpu, stages in rows
        ),
    )
    print(table.render())
    extra: list[str] = [] if args.scale == 0.001 else ["--scale", f"{args.scale:g}"]
    for key, value in counts.items():
        extra += [f"--{key.replace('_', '-')}", str(value)]
    extra += [] if args.warm == 2 else ["--warm", str(args.warm)]
    print(f"command: {command_for(MODULE, extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
