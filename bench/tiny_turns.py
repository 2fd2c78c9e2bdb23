"""Memory over many tiny Turns: 10,000 one-line Turns (tutti-agent's echo model) across 500
Sessions from 8 clients, each client running 20 Turns on a Session before the next; the
daemon's and the worker's RSS are sampled as the Turns complete, with `host.status` `timers`
(the shared timer heap, which used to keep every settled Turn's state for the 30 minutes of its
cancelled inactivity watchdog). The figure is the growth per 1,000 Turns over the first and
the second half of the run: a plateau is a second half that grows by a fraction of the first.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Mode, Table, bench_main, log, pick
from bench.harness import BenchDaemon, create_session, run_turn, tree

MODULE = "bench.tiny_turns"
CLIENTS = 8


def _rss(daemon_pid: int) -> tuple[float, float, int]:
    """(daemon MB, workers MB, app-servers live) of the daemon's process tree."""
    daemon = workers = 0.0
    app_servers = 0
    for s in tree(daemon_pid):
        if s.kind == "daemon":
            daemon += s.rss_mb
        elif s.kind == "worker":
            workers += s.rss_mb
        elif s.kind == "app-server":
            app_servers += 1
    return daemon, workers, app_servers


def _growth(points: list[tuple[int, float]], lo: int, hi: int) -> float:
    """MB per 1,000 Turns between the samples nearest `lo` and `hi` Turns."""
    a = min(points, key=lambda p: abs(p[0] - lo))
    b = min(points, key=lambda p: abs(p[0] - hi))
    return (b[1] - a[1]) / max(1, b[0] - a[0]) * 1000


def run(mode: Mode) -> BenchResult:
    sessions, turns_each = pick(mode, (500, 20), (100, 10), (16, 4))
    total = sessions * turns_each
    every = max(1, total // 20)
    result = BenchResult("tiny turns: memory", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-tiny-") as tmp:
        d = BenchDaemon(Path(tmp) / "home").start()
        try:
            c = d.client(timeout=120)
            sids = [create_session(c, "tiny") for _ in range(sessions)]
            done = [0]
            lock = threading.Lock()
            failures: list[str] = []
            rows: list[tuple[Any, ...]] = []
            started = time.monotonic()

            def sample() -> None:
                status = c.call("host.status")
                daemon_mb, worker_mb, app_servers = _rss(d.pid)
                rows.append(
                    (
                        done[0],
                        round(time.monotonic() - started, 1),
                        round(daemon_mb, 1),
                        round(worker_mb, 1),
                        app_servers,
                        status.get("timers", "n/a"),
                        status.get("sessionActors", "n/a"),
                    )
                )
                log(f"{rows[-1]}")

            def drive(part: Sequence[str]) -> None:
                own = d.client(timeout=120)
                for sid in part:
                    for i in range(turns_each):
                        try:
                            run_turn(own, sid, f"tiny {i}")
                        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                            failures.append(f"{sid}: {exc}")
                        with lock:
                            done[0] += 1

            sample()
            threads = [
                threading.Thread(target=drive, args=(sids[i::CLIENTS],), daemon=True)
                for i in range(CLIENTS)
            ]
            for t in threads:
                t.start()
            next_at = every
            while any(t.is_alive() for t in threads):
                time.sleep(0.2)
                if done[0] >= next_at:
                    sample()
                    next_at += every
            sample()
        finally:
            d.stop()
    result.tables.append(
        Table(
            f"RSS over {total:,} tiny Turns, {sessions} Sessions, {CLIENTS} clients",
            ("turns", "s", "daemon MB", "workers MB", "app-servers", "timers", "actors"),
            tuple(rows),
        )
    )
    daemon_points = [(int(r[0]), float(r[2])) for r in rows]
    worker_points = [(int(r[0]), float(r[3])) for r in rows]
    half = total // 2
    # The first tenth warms the caches (SQLite pages, app-server starts): not counted.
    growth = {
        "daemon MB/1k turns, first half": _growth(daemon_points, total // 10, half),
        "daemon MB/1k turns, second half": _growth(daemon_points, half, total),
        "workers MB/1k turns, first half": _growth(worker_points, total // 10, half),
        "workers MB/1k turns, second half": _growth(worker_points, half, total),
    }
    result.tables.append(
        Table(
            "growth",
            ("what", "MB per 1,000 turns"),
            tuple((k, round(v, 2)) for k, v in growth.items()),
        )
    )
    result.figures = {"rows": rows, "growth": growth, "failures": len(failures)}
    if failures:
        result.notes.append(f"{len(failures)} turns failed; first: {failures[0]}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or MODULE, run, argv)


if __name__ == "__main__":
    sys.exit(main())
