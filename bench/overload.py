"""Overload and fairness (issue 14 §6, issue 15 #7), against the real daemon and Tutti Agent.

- **many Sessions × 3 turns at once** (200 × 3 in full mode): every Session runs 3 turns in
  a row, all Sessions at once, with the live runtimes bounded by `max_runtimes_per_provider`
  (queueing beyond it). Reported: turn latency (submit → settled), wall time, outcomes, HTTP
  statuses, worker restarts, peak live app-servers, Turns left active.
- **fairness**: N slow provider calls (app-servers that take minutes to start, by a wrapper
  that sleeps) are pending while one warm Session runs turns; reported: the warm turns'
  latency with and without the slow calls.

`build/venv/bin/python -m bench.overload [--quick|--smoke]`.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Latency, Mode, Table, bench_main, log, pick
from bench.harness import WS, BenchDaemon
from transport.client import ApiError, Client


def _children(pid: int) -> int:
    n = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("PPid:"):
                    n += int(line.split()[1]) == pid
                    break
        except OSError:
            continue
    return n


def _create(c: Client) -> str:
    body = c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})
    return str(body["session"]["agentSessionId"])


def _submit(c: Client, sid: str, text: str, statuses: list[int]) -> str:
    request_id = str(uuid.uuid4())
    while True:
        try:
            body = c.call(
                "turn.submit",
                {
                    "workspaceId": WS,
                    "agentSessionId": sid,
                    "requestId": request_id,
                    "input": [{"type": "text", "text": text}],
                },
            )
            return str(body["turn"]["turnId"])
        except ApiError as exc:
            statuses.append(exc.status)
            if not exc.retryable:
                raise
            time.sleep(0.2)


def _settle(c: Client, sid: str, turn_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
        for t in turns:
            if t["turnId"] == turn_id and t["phase"] == "settled":
                return dict(t)
        time.sleep(0.1)
    return {"outcome": "timeout"}


def many_sessions(tmp: Path, sessions: int, turns: int, limit: int) -> dict[str, Any]:
    daemon = BenchDaemon(tmp / "many", daemon={"max_runtimes_per_provider": limit}).start()
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    statuses: list[int] = []
    lock = threading.Lock()
    peak = [0]
    done = threading.Event()
    try:
        c = daemon.client(timeout=300)
        sids = [_create(c) for _ in range(sessions)]

        def watch() -> None:
            while not done.wait(0.2):
                pids = [w["pid"] for w in c.call("host.status")["workers"] if w["pid"]]
                if pids:
                    peak[0] = max(peak[0], _children(pids[0]))

        def drive(sid: str) -> None:
            own = daemon.client(timeout=300)
            for i in range(turns):
                t0 = time.monotonic()
                try:
                    turn_id = _submit(own, sid, f"turn {i}", statuses)
                except ApiError:
                    with lock:
                        outcomes["refused"] = outcomes.get("refused", 0) + 1
                    return
                turn = _settle(own, sid, turn_id, 900)
                with lock:
                    latencies.append((time.monotonic() - t0) * 1000)
                    outcomes[turn["outcome"]] = outcomes.get(turn["outcome"], 0) + 1

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        threads = [threading.Thread(target=drive, args=(sid,)) for sid in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        done.set()
        status = c.call("host.status")
        active = sum(
            1
            for sid in sids
            for t in c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
            if t["phase"] == "active"
        )
        return {
            "latency": Latency.of(latencies),
            "wallS": wall,
            "outcomes": outcomes,
            "status500": statuses.count(500),
            "retried": len(statuses),
            "workerRestarts": sum(w["restarts"] for w in status["workers"]),
            "peakAppServers": peak[0],
            "activeLeft": active,
        }
    finally:
        done.set()
        daemon.stop()


def fairness(tmp: Path, slow_calls: int, warm_turns: int) -> dict[str, Any]:
    flag = tmp / "slow-now"
    tag = f"600.{random.randrange(100, 999)}"
    wrapper = tmp / "tutti-agent.sh"
    tutti = Path(sys.executable).parent / "tutti-agent"
    wrapper.write_text(
        f'#!/bin/sh\nif [ -e "{flag}" ]; then exec sleep {tag}; fi\nexec "{tutti}" "$@"\n'
    )
    wrapper.chmod(0o755)
    daemon = BenchDaemon(
        tmp / "fair",
        providers={"tutti-agent": {"command": ["/bin/sh", str(wrapper)]}},
        # All slow starts reach the worker at once (past the host's start gate): the case
        # measured is the worker's lanes.
        daemon={
            "max_runtimes_per_provider": slow_calls + 8,
            "max_runtime_starts_per_provider": slow_calls + 8,
        },
    ).start()
    statuses: list[int] = []
    try:
        c = daemon.client(timeout=120)
        warm = _create(c)

        def warm_latencies() -> list[float]:
            out = []
            for i in range(warm_turns):
                t0 = time.monotonic()
                turn = _settle(c, warm, _submit(c, warm, f"warm {i}", statuses), 120)
                if turn["outcome"] == "completed":
                    out.append((time.monotonic() - t0) * 1000)
            return out

        _settle(c, warm, _submit(c, warm, "warm up", statuses), 120)
        alone = warm_latencies()
        flag.touch()
        for _ in range(slow_calls):
            sid = _create(c)
            _submit(c, sid, "slow", statuses)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            sleepers = 0
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    with contextlib.suppress(OSError):
                        sleepers += (proc / "cmdline").read_bytes() == f"sleep\0{tag}\0".encode()
            if sleepers >= slow_calls:
                break
            time.sleep(0.1)
        contended = warm_latencies()
        return {
            "alone": Latency.of(alone),
            "contended": Latency.of(contended),
            "slowPending": sleepers,
        }
    finally:
        daemon.stop()


def run(mode: Mode) -> BenchResult:
    sessions = pick(mode, 200, 40, 4)
    turns = 3
    limit = pick(mode, 64, 16, 2)
    slow_calls = pick(mode, 64, 64, 4)
    warm_turns = pick(mode, 20, 5, 2)
    result = BenchResult("overload and fairness", "", mode.value)
    tmp = Path(tempfile.mkdtemp(prefix="ah-overload-"))
    try:
        log(f"{sessions} Sessions x {turns} turns, max_runtimes_per_provider = {limit}")
        many = many_sessions(tmp, sessions, turns, limit)
        log(f"fairness: {slow_calls} slow calls pending, {warm_turns} warm turns")
        fair = fairness(tmp, slow_calls, warm_turns)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lat: Latency = many["latency"]
    result.tables.append(
        Table(
            f"{sessions} Sessions x {turns} turns at once (runtime bound {limit})",
            (
                "turns",
                "completed",
                "p50 ms",
                "p99 ms",
                "wall s",
                "500s",
                "restarts",
                "peak",
                "active",
            ),
            (
                (
                    sessions * turns,
                    many["outcomes"].get("completed", 0),
                    lat.p50,
                    lat.p99,
                    many["wallS"],
                    many["status500"],
                    many["workerRestarts"],
                    many["peakAppServers"],
                    many["activeLeft"],
                ),
            ),
        )
    )
    alone: Latency = fair["alone"]
    contended: Latency = fair["contended"]
    result.tables.append(
        Table(
            f"warm Session turn latency, with {slow_calls} slow provider calls pending",
            ("case", "n", "p50 ms", "p99 ms", "max ms"),
            (
                ("alone", alone.n, alone.p50, alone.p99, alone.max),
                ("contended", contended.n, contended.p50, contended.p99, contended.max),
            ),
        )
    )
    result.figures.update({"many": many, "fairness": fair})
    result.target(
        "turns completed (share)",
        many["outcomes"].get("completed", 0) / (sessions * turns),
        1.0,
        higher_is_better=True,
    )
    result.target("worker restarts", float(many["workerRestarts"]), 0, higher_is_better=False)
    result.target("warm turn p99 with slow calls, ms", contended.p99, 5000, higher_is_better=False)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.overload", __doc__ or "", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
