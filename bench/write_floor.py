"""The floor of a mutation's latency on this machine's disk: what 8 concurrent writers wait for
a durable write with no daemon at all, beside `bench.mutations`' phase A in the same run.

Three windows, each as long as `bench.mutations`' phase A (8 threads writing back to back):

- `store`: the store's own code (`storage.Store` on a real file): each thread on its own
  Session does the write a `turn.submit` does (`turns.claim_submit`) and the one a
  `session.updateTitle` does (`sessions.update_title`), both timed, then settles the Turn
  (`turns.record_settlement`, not timed: the next claim needs it, as the daemon's does);
- `apsw serial`: one INSERT + fsync'd COMMIT per write (WAL, `synchronous=FULL`, as the store
  opens its file), each thread on its own connection, taking turns in arrival order
  (`FifoBaton`): every write one fdatasync;
- `apsw grouped`: the same rows handed to one committer (`bench.fork_ceiling.GroupCommit`),
  which puts every write waiting into one COMMIT: the most group commit can share.

The disk's own p99 for a durable write with 8 writers is the lower of the two apsw windows'.
Then `bench.mutations` (`--quick`, its phase A beside its phases 0 and B) runs in the same
process, so the ratio of its phase A p99 to the floor is from one run.

    build/venv/bin/python -m bench.write_floor [--quick|--smoke] [--json out.json]
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from bench import mutations
from bench.common import (
    BenchResult,
    Latency,
    Mode,
    Table,
    bench_main,
    cpu_probe_ms,
    log,
    pick,
    ratio,
)
from bench.fork_ceiling import GroupCommit
from bench.profile import cores_busy_between, machine_busy
from domain.enums import TurnOutcome
from storage.sqlite import BUSY_TIMEOUT_MS
from storage.store import Store

MODULE = "bench.write_floor"
WRITERS = 8
"""`bench.mutations`' mutation clients."""
WS = "ws-floor"
ROW = "x" * 200
"""A row of a mutation's size (a Turn, its user Message and its claim are a few hundred
bytes)."""


@dataclass(frozen=True, slots=True)
class FloorWindow:
    """One window of `WRITERS` threads writing back to back: each kind's latencies."""

    name: str
    seconds: float
    latencies: dict[str, Latency]
    load: float
    probe_ms: float
    machine_busy_cores: float
    fsyncs: int | None = None
    """COMMITs made durable (grouped only: writes per fsync = writes / fsyncs)."""
    device: dict[str, float] | None = None
    """`DeviceIo.since` over the window (None: the counters are not readable here)."""

    def rows(self) -> list[tuple[Any, ...]]:
        return [
            (
                self.name,
                kind,
                lat.n,
                lat.n / self.seconds,
                lat.p50,
                lat.p99,
                lat.max,
                math.nan if self.device is None else self.device["flushes"] / self.seconds,
                math.nan if self.device is None else self.device["flushMsMean"],
                math.nan if self.device is None else self.device["writeMsMean"],
                self.machine_busy_cores,
                self.load,
                self.probe_ms,
            )
            for kind, lat in self.latencies.items()
        ]


@dataclass(frozen=True, slots=True)
class DeviceIo:
    """The block device's own counters (`/sys/dev/block/M:m/stat`): writes and cache flushes
    completed and the milliseconds the device spent on them. Their means over a window are
    the disk's service times, which a CPU-starved writer thread does not inflate (every
    process's I/O on the device counts, not only this benchmark's)."""

    writes: int
    write_ms: int
    flushes: int
    flush_ms: int

    @staticmethod
    def of(directory: Path) -> DeviceIo | None:
        dev = os.stat(directory).st_dev
        stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
        try:
            fields = [int(x) for x in stat.read_text().split()]
        except (OSError, ValueError):
            return None
        if len(fields) < 17:
            return None
        return DeviceIo(fields[4], fields[7], fields[15], fields[16])

    def since(self, before: DeviceIo) -> dict[str, float]:
        writes, flushes = self.writes - before.writes, self.flushes - before.flushes
        return {
            "writes": writes,
            "writeMsMean": (self.write_ms - before.write_ms) / writes if writes else math.nan,
            "flushes": flushes,
            "flushMsMean": (self.flush_ms - before.flush_ms) / flushes if flushes else math.nan,
        }


WriteLoop = Callable[[int, float], dict[str, list[float]]]
"""(writer index, deadline) → each timed kind's milliseconds."""


def _window(
    name: str,
    duration: float,
    loop: WriteLoop,
    fsyncs: Callable[[], int] | None,
    directory: Path,
) -> FloorWindow:
    go = threading.Event()
    found: list[dict[str, list[float]]] = [{} for _ in range(WRITERS)]
    errors: list[str] = []
    deadline = [0.0]

    def writer(i: int) -> None:
        go.wait()
        try:
            found[i] = loop(i, deadline[0])
        except Exception as exc:  # noqa: BLE001 - reported, the run fails below
            errors.append(f"writer {i}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=writer, args=(i,), name=f"floor-{i}", daemon=True)
        for i in range(WRITERS)
    ]
    for t in threads:
        t.start()
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    f0 = fsyncs() if fsyncs is not None else 0
    machine0, io0 = machine_busy(), DeviceIo.of(directory)
    started = time.monotonic()
    deadline[0] = started + duration
    go.set()
    for t in threads:
        t.join(duration + 120)
    elapsed = time.monotonic() - started
    busy = cores_busy_between(machine0, machine_busy())
    io1 = DeviceIo.of(directory)
    if errors:
        raise RuntimeError("; ".join(errors))
    kinds = sorted({k for per in found for k in per})
    return FloorWindow(
        name,
        elapsed,
        {k: Latency.of(ms for per in found for ms in per.get(k, [])) for k in kinds},
        load,
        probe,
        busy,
        None if fsyncs is None else fsyncs() - f0,
        None if io0 is None or io1 is None else io1.since(io0),
    )


def store_loop(store: Store, sids: Sequence[str]) -> WriteLoop:
    """The store writes of `bench.mutations`' cycle, on writer `i`'s own Session."""

    def loop(i: int, deadline: float) -> dict[str, list[float]]:
        submit: list[float] = []
        title: list[float] = []
        n = 0
        while time.monotonic() < deadline:
            n += 1
            t0 = time.perf_counter()
            turn, _ = store.turns.claim_submit(WS, sids[i], str(uuid.uuid4()), f"mutation {n}")
            t1 = time.perf_counter()
            store.sessions.update_title(WS, sids[i], f"title {n}")
            t2 = time.perf_counter()
            store.turns.record_settlement(
                WS, sids[i], turn.turn_id, outcome=TurnOutcome.COMPLETED.value
            )
            submit.append(1000 * (t1 - t0))
            title.append(1000 * (t2 - t1))
        return {"turn.submit": submit, "session.updateTitle": title}

    return loop


class FifoBaton:
    """Writers take turns in the order they asked: SQLite's own busy handler sleeps and retries,
    so 8 writers hammering one file starve some of them past any timeout (seen here: a writer
    locked out for 10 s); the store passes its writers a baton in order for the same reason."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cond.wait()

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


def serial_loop(path: Path) -> WriteLoop:
    """One INSERT + fsync'd COMMIT per write, on the writer's own connection, the writers in
    arrival order (`FifoBaton`)."""
    baton = FifoBaton()

    def loop(i: int, deadline: float) -> dict[str, list[float]]:
        conn = apsw.Connection(str(path))
        try:
            conn.set_busy_timeout(BUSY_TIMEOUT_MS)
            conn.execute("PRAGMA synchronous=FULL")
            times: list[float] = []
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                with baton:
                    conn.execute("BEGIN IMMEDIATE; INSERT INTO w VALUES (?, ?); COMMIT", (i, ROW))
                times.append(1000 * (time.perf_counter() - t0))
            return {"write": times}
        finally:
            conn.close()

    return loop


def grouped_loop(committer: GroupCommit) -> WriteLoop:
    """Each write handed to the one committer, returned once a durable COMMIT holds it."""

    def loop(i: int, deadline: float) -> dict[str, list[float]]:
        times: list[float] = []
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            committer.commit()
            times.append(1000 * (time.perf_counter() - t0))
        return {"write": times}

    return loop


def _apsw_file(path: Path) -> None:
    conn = apsw.Connection(str(path))
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute("CREATE TABLE w (writer INTEGER, v TEXT)")
    finally:
        conn.close()


def _sessions(store: Store, cwd: Path) -> list[str]:
    sids = [str(uuid.uuid4()) for _ in range(WRITERS)]
    for i, sid in enumerate(sids):
        store.sessions.create_session(
            WS,
            session_id=sid,
            provider="tutti-agent",
            title=f"floor {i}",
            cwd=str(cwd),
            settings={},
        )
    return sids


def measure_floor(duration: float) -> list[FloorWindow]:
    """The three windows, each `duration` seconds, on files of this filesystem's temp dir (where
    every benchmark's daemon keeps its store)."""
    with tempfile.TemporaryDirectory(prefix="bench-write-floor-") as tmp_text:
        tmp = Path(tmp_text)
        windows: list[FloorWindow] = []
        store = Store.open(tmp / "store.sqlite3")
        try:
            sids = _sessions(store, tmp)
            log(f"write floor: store, {WRITERS} writers × {duration:.0f} s")
            windows.append(_window("store", duration, store_loop(store, sids), None, tmp))
        finally:
            store.close()
        _apsw_file(tmp / "serial.sqlite3")
        log(f"write floor: apsw serial, {WRITERS} writers × {duration:.0f} s")
        windows.append(
            _window("apsw serial", duration, serial_loop(tmp / "serial.sqlite3"), None, tmp)
        )
        committer = GroupCommit(tmp / "grouped.sqlite3")
        try:
            log(f"write floor: apsw grouped, {WRITERS} writers × {duration:.0f} s")
            windows.append(
                _window(
                    "apsw grouped",
                    duration,
                    grouped_loop(committer),
                    lambda: committer.commits,
                    tmp,
                )
            )
        finally:
            committer.close()
        return windows


def run(mode: Mode) -> BenchResult:
    duration: float = pick(mode, 20.0, 5.0, 1.0)  # bench.mutations' phase A of the same mode
    result = BenchResult("write floor: durable writes with 8 writers", "", mode.value)
    windows = measure_floor(duration)
    by_name = {w.name: w for w in windows}
    disk = min(
        (by_name["apsw serial"], by_name["apsw grouped"]),
        key=lambda w: w.latencies["write"].p99,
    )
    disk_p99 = disk.latencies["write"].p99
    store_p99 = max(lat.p99 for lat in by_name["store"].latencies.values())
    # Phase A of the mutations benchmark, in the same run: its p99 over the floor's.
    m_mode = Mode.SMOKE if mode is Mode.SMOKE else Mode.QUICK
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    log(f"write floor: bench.mutations ({m_mode.value}) for phase A")
    m = mutations.run(m_mode)
    alone: dict[str, Latency] = {k: m.figures["alone"][k] for k in mutations.MUTATIONS}
    result.tables.append(
        Table(
            f"{WRITERS} threads writing back to back, {duration:.0f} s per window, ms",
            (
                "window",
                "write",
                "n",
                "writes/s",
                "p50",
                "p99",
                "max",
                "device flushes/s",
                "device flush ms (mean)",
                "device write ms (mean)",
                "machine busy cores",
                "load 1m",
                "CPU probe ms",
            ),
            tuple(row for w in windows for row in w.rows()),
        )
    )
    result.tables.append(
        Table(
            f"bench.mutations ({m_mode.value}) phase A in the same run, against the floor"
            f" (load {load:.2f}, CPU probe {probe:.0f} ms at its start)",
            ("mutation", "n", "p50", "p99", "p99 / store p99", "p99 / disk p99"),
            tuple(
                (
                    kind,
                    lat.n,
                    lat.p50,
                    lat.p99,
                    ratio(lat.p99, by_name["store"].latencies[kind].p99),
                    ratio(lat.p99, disk_p99),
                )
                for kind, lat in alone.items()
            ),
        )
    )
    grouped = by_name["apsw grouped"]
    writes = grouped.latencies["write"].n
    result.notes.append(
        f"apsw grouped: {writes / max(1, grouped.fsyncs or 0):.1f} writes per fsync"
        f" ({grouped.fsyncs} COMMITs)"
    )
    lines = [
        f"disk p99 for a durable write with {WRITERS} writers: {disk_p99:.1f} ms ({disk.name});"
        f" the store's own write p99 {store_p99:.1f} ms; bench.mutations phase A p99 "
        + ", ".join(f"{k} {lat.p99:.1f}" for k, lat in alone.items())
        + " ms, same run",
    ]
    if disk.device is not None:
        lines.append(
            f"the device itself in the {disk.name} window: {disk.device['flushes']:.0f} cache"
            f" flushes at {disk.device['flushMsMean']:.2f} ms mean,"
            f" {disk.device['writes']:.0f} writes at {disk.device['writeMsMean']:.2f} ms mean"
        )
    result.notes += lines
    result.figures = {
        "writers": WRITERS,
        "seconds": duration,
        "windows": {
            w.name: {
                "latency": w.latencies,
                "loadAverage1m": w.load,
                "cpuProbeMs": w.probe_ms,
                "machineBusyCores": w.machine_busy_cores,
                "fsyncs": w.fsyncs,
                "device": w.device,
            }
            for w in windows
        },
        "diskP99Ms": disk_p99,
        "diskWindow": disk.name,
        "storeP99Ms": store_p99,
        "mutationsPhaseA": {
            "mode": m_mode.value,
            "loadAverage1m": load,
            "cpuProbeMs": probe,
            **alone,
        },
    }
    result.issue_target(
        "36:floor:write-p99",
        disk_p99,
        measured=f"bench.write_floor: {WRITERS} threads × {duration:.0f} s, one INSERT + fsync'd"
        f" COMMIT each ({disk.name}); phase A p99 in the same run "
        + ", ".join(f"{k} {lat.p99:.1f}" for k, lat in alone.items()),
        profile={"lines": lines},
    )
    result.issue_target(
        "36:floor:store-write-p99",
        store_p99,
        measured=f"bench.write_floor: {WRITERS} threads × {duration:.0f} s through storage.Store"
        " (claim_submit, update_title; the worse p99 of the two)",
        profile={"lines": lines},
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
