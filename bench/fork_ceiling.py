"""The most forks per second, and the least CPU per fork, any host could reach on this machine:
tutti-agent's app-servers forked bare, over their stdio JSON-RPC, with no host in between, plus
the durability work no host fork may skip; and, in the same run, the host itself.

The sources are shaped as `bench.throughput`'s: one per client, each of `SOURCE_TURNS` settled
Turns, each in its own app-server on its own home (the host runs one app-server per active
Session, drivers/app_server/driver.py), the clients forking them concurrently at 1, 4 and 16.
Three drives are timed, each client forking its own source in a loop:

- `bare`: the provider calls `bench.fork_overhead`'s bare side makes (`BareAppServer.fork_once`:
  `thread/read` with turns, `thread/fork {lastTurnId}`, then `thread/unsubscribe` of the child);
- `driver`: the one call the host's driver makes on a warm, unchanged source (its verified read
  is reused, drivers/app_server/fork.py): `thread/fork` with `loaded: false, turnItems: false`;
- `driver+syncs` (the ceiling): `driver` with the syncs of a fork, in the saga's order: the
  store's fsync'd COMMITs (`bench.sync_floor` counts them through a real daemon under strace:
  the first before the provider call, the rest after the bind), group-committed across the
  clients by one committer thread (`GroupCommit`, the most a store's group commit can share);
  and the binder's own code on the child: `DirsAhead` for a fresh target home while the
  provider forks, then `begin_atomic_write_all` of the child's rollout bytes and its
  names' round.

Reported per window: forks/s, latency, and CPU ms per fork of the app-servers and of this
process (its client threads, readers, committer and syncs) separately. Then the host
(`bench.throughput`'s loop: a daemon, one client process per source, each fork ACKed) at the
top level, interleaved with the ceiling (ceiling, host, host, ceiling at full size), so the
host/ceiling ratio comes from one run.

    build/venv/bin/python -m bench.fork_ceiling [--quick|--smoke] [--json out.json]
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import apsw

from bench.common import BenchResult, Latency, Mode, Table, bench_main, cpu_probe_ms, log, pick
from bench.harness import BenchDaemon, sample
from bench.profile import cores_busy_between, machine_busy
from bench.providers import BareAppServer, _tutti_argv
from bench.throughput import SOURCE_TURNS, fork_sources, fork_window
from drivers.app_server.items import thread_of
from drivers.binder import DirsAhead, begin_atomic_write_all

MODULE = "bench.fork_ceiling"
CORES = os.cpu_count() or 1
STORE_COMMITS_UNCOUNTED = 2
"""The store's fsync'd COMMITs on a warm fork's path when strace cannot count them
(docs/design/store.md: dispatching and committed; prepared and provider_accepted are lazy)."""


class Drive(StrEnum):
    """How a client forks its source, each a different least a host could do."""

    BARE = "bare"
    """`bench.fork_overhead`'s bare calls: read with turns, fork, unsubscribe the child."""
    DRIVER = "driver"
    """The driver's warm fork: one `thread/fork`, the child left unloaded, no turn items."""
    DRIVER_SYNCS = "driver+syncs"
    """`DRIVER` plus the store's COMMITs (group-committed) and the binder's rounds: the
    ceiling."""


class GroupCommit:
    """The store's fsync'd COMMITs, shared as widely as group commit can share them: every
    client's COMMIT waiting when the committer comes round goes into one transaction, one
    fdatasync of the WAL (an SQLite file opened as the store opens its own: WAL,
    `synchronous=FULL`)."""

    def __init__(self, path: Path) -> None:
        self._conn = apsw.Connection(str(path))
        self._conn.execute("PRAGMA journal_mode=WAL").fetchall()
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS ops (id TEXT, status TEXT, at INTEGER)")
        self._cond = threading.Condition()
        self._waiting: list[threading.Event] = []
        self._closed = False
        self._error: BaseException | None = None
        self.commits = 0
        """Durable COMMITs made (each one fsync)."""
        self.rows = 0
        """Clients' COMMITs they held."""
        self._thread = threading.Thread(target=self._loop, name="group-commit", daemon=True)
        self._thread.start()

    def commit(self) -> None:
        """Return once a durable COMMIT holds a row of this caller's."""
        done = threading.Event()
        with self._cond:
            if self._error is not None:
                raise RuntimeError("the committer failed") from self._error
            self._waiting.append(done)
            self._cond.notify()
        done.wait()
        if self._error is not None:
            raise RuntimeError("the committer failed") from self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
            try:
                now = time.time_ns()
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany(
                    "INSERT INTO ops VALUES (?, 'committed', ?)",
                    [(str(uuid.uuid4()), now) for _ in batch],
                )
                self._conn.execute("COMMIT")
                self.commits += 1
                self.rows += len(batch)
            except BaseException as exc:  # noqa: BLE001 - every waiter is told, then it stops
                self._error = exc
            for done in batch:
                done.set()
            if self._error is not None:
                return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(10)
        self._conn.close()


@dataclass(slots=True)
class Source:
    """One client's source: a bare app-server on its own home, with a thread of settled Turns,
    and the target homes its children are bound into."""

    bare: BareAppServer
    home: Path
    """The app-server's home, where the provider writes each child."""
    targets: Path
    """Where each child gets a fresh target home (binder runs only)."""
    forks: int = 0

    def fork_bare(self) -> None:
        self.bare.fork_once()
        self.forks += 1

    def fork_driver(self, syncs: Syncs | None) -> None:
        """The driver's warm fork (drivers/app_server/fork.py `ForkThroughTurn._fork_on`, less
        everything that is the host's own: checks, proof, events): with `syncs`, the COMMITs
        and the binder's rounds around it in the saga's order."""
        proc = self.bare.proc
        if syncs is not None:
            syncs.store.commit()  # dispatching
        pending = proc.request_async(
            "thread/fork",
            {
                "threadId": self.bare.thread_id,
                "lastTurnId": self.bare.turn_ids[-1],
                "loaded": False,
                "turnItems": False,
            },
        )
        target = self.targets / str(uuid.uuid4())
        ahead = None
        if syncs is not None:
            # While the provider forks, the child's directories in a fresh target home, made
            # durable as the driver's `DirsAhead` makes them (tutti-agent's `sessions/`).
            ahead = DirsAhead(target / "sessions")
            ahead.run()
        child = thread_of(proc.answer("thread/fork", pending, timeout=60))
        self.forks += 1
        if syncs is None or ahead is None:
            return
        ahead.ready()
        rollout = Path(str(child["path"]))
        bound = target / rollout.relative_to(self.home)
        begin_atomic_write_all([(bound, rollout.read_bytes())]).wait()
        for _ in range(syncs.commits_after):
            syncs.store.commit()  # committed


@dataclass(frozen=True, slots=True)
class Syncs:
    """The durability work of one fork beyond the provider's own."""

    store: GroupCommit
    commits: int
    """The store's fsync'd COMMITs on a fork's path (one before the provider call)."""

    @property
    def commits_after(self) -> int:
        return max(0, self.commits - 1)


@dataclass(slots=True)
class Window:
    """One measured window: a drive at a level of concurrent clients."""

    drive: str
    clients: int
    seconds: float
    forks: int
    latency: Latency
    app_server_cpu_s: float
    bench_cpu_s: float
    machine_busy_cores: float
    load: float
    probe_ms: float
    bench_sys_s: float = 0.0
    """Of `bench_cpu_s`, in the kernel (the syncs' own work is mostly here)."""
    store_fsyncs: int = 0
    store_commits_held: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def forks_per_s(self) -> float:
        return self.forks / self.seconds

    def cpu_ms_per_fork(self) -> dict[str, float]:
        n = max(1, self.forks)
        return {
            "app-server": 1000 * self.app_server_cpu_s / n,
            "bench": 1000 * self.bench_cpu_s / n,
        }

    def row(self) -> tuple[Any, ...]:
        cpu = self.cpu_ms_per_fork()
        return (
            self.drive,
            self.clients,
            self.forks,
            self.forks_per_s,
            self.latency.p50,
            self.latency.p99,
            cpu["app-server"],
            cpu["bench"],
            1000 * self.bench_sys_s / max(1, self.forks),
            cpu["app-server"] + cpu["bench"],
            self.machine_busy_cores,
            self.load,
            self.probe_ms,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "drive": self.drive,
            "clients": self.clients,
            "seconds": self.seconds,
            "forks": self.forks,
            "forksPerSecond": self.forks_per_s,
            "latency": self.latency,
            "cpuMsPerFork": self.cpu_ms_per_fork(),
            "ownSysCpuMsPerFork": 1000 * self.bench_sys_s / max(1, self.forks),
            "machineBusyCores": self.machine_busy_cores,
            "loadAverage1m": self.load,
            "cpuProbeMs": self.probe_ms,
            "storeFsyncs": self.store_fsyncs,
            "storeCommitsHeld": self.store_commits_held,
            **self.extra,
        }


def _cpu_s(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        s = sample(pid)
        if s is not None:
            total += s.cpu_s + s.children_cpu_s
    return total


def _own_cpu_s() -> tuple[float, float]:
    """(user + system, system) CPU seconds of this process, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def bare_window(
    sources: Sequence[Source], drive: Drive, duration: float, syncs: Syncs | None
) -> Window:
    """Each source forked by a thread of its own for `duration` seconds, released together."""
    pids = [p for s in sources if (p := s.bare.proc.pid) is not None]
    go = threading.Event()
    latencies: list[list[float]] = [[] for _ in sources]
    errors: list[str] = []
    deadline = [0.0]

    def client(i: int, source: Source) -> None:
        fork: Callable[[], None] = (
            source.fork_bare if drive is Drive.BARE else lambda: source.fork_driver(syncs)
        )
        go.wait()
        try:
            while time.monotonic() < deadline[0]:
                t0 = time.perf_counter()
                fork()
                latencies[i].append(1000 * (time.perf_counter() - t0))
        except Exception as exc:  # noqa: BLE001 - reported, the run fails below
            errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=client, args=(i, s), name=f"ceiling-{i}", daemon=True)
        for i, s in enumerate(sources)
    ]
    for t in threads:
        t.start()
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    fsyncs0 = rows0 = 0
    if syncs is not None:
        fsyncs0, rows0 = syncs.store.commits, syncs.store.rows
    app0, (own0, sys0), machine0 = _cpu_s(pids), _own_cpu_s(), machine_busy()
    started = time.monotonic()
    deadline[0] = started + duration
    go.set()
    for t in threads:
        t.join(duration + 120)
    elapsed = time.monotonic() - started
    app1, (own1, sys1), machine1 = _cpu_s(pids), _own_cpu_s(), machine_busy()
    if errors:
        raise RuntimeError("; ".join(errors))
    flat = [ms for per in latencies for ms in per]
    return Window(
        drive.value,
        len(sources),
        elapsed,
        len(flat),
        Latency.of(flat),
        app1 - app0,
        own1 - own0,
        cores_busy_between(machine0, machine1),
        load,
        probe,
        bench_sys_s=sys1 - sys0,
        store_fsyncs=0 if syncs is None else syncs.store.commits - fsyncs0,
        store_commits_held=0 if syncs is None else syncs.store.rows - rows0,
    )


def host_window(
    daemon: BenchDaemon, boundaries: dict[str, str], duration: float, out: Path
) -> Window:
    """`bench.throughput`'s loop at `len(boundaries)` clients: forks committed and the daemon
    tree's CPU (app-servers apart from the daemon and its workers)."""
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    records, profile = fork_window(daemon, boundaries, duration, out)
    ok = [r for r in records if r.get("reason") == "committed"]
    app = profile.cpu.get("app-server", 0.0)
    host = sum(v for k, v in profile.cpu.items() if k != "app-server")
    return Window(
        "host",
        len(boundaries),
        duration,
        len(ok),
        Latency.of(r["t1"] - r["t0"] for r in ok),
        app,
        host,
        profile.machine_busy_cores,
        load,
        probe,
        bench_sys_s=math.nan,  # the daemon tree's is not split here
        extra={
            "cpuSecondsByKind": profile.cpu,
            "other": len(records) - len(ok),
            "loadGeneratorCores": profile.load_generator_cores,
        },
    )


def store_commits_per_fork(mode: Mode) -> tuple[int, str]:
    """The store's fsync'd COMMITs on a fork's path, as `bench.sync_floor` counts them (strace
    through a real daemon, the acknowledgement's left out), rounded to whole COMMITs."""
    if shutil.which("strace") is None:
        return STORE_COMMITS_UNCOUNTED, "strace missing: the design's count"
    from bench.fork_syscalls import measure
    from bench.sync_floor import store_commits_on_the_fork_path

    forks = pick(mode, 10, 5, 2)
    report = measure(forks=forks, turns=SOURCE_TURNS, warmup=2, strace=True)
    counted = store_commits_on_the_fork_path(report.calls_per_fork)
    return round(counted), f"{counted:g} per fork, strace of {forks} host forks"


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The figures a run ends on: the ceiling's and the host's windows at the top level."""

    ceiling: tuple[Window, ...]
    host: tuple[Window, ...]

    @staticmethod
    def _mean(windows: Sequence[Window], fn: Callable[[Window], float]) -> float:
        return sum(fn(w) for w in windows) / len(windows)

    @property
    def ceiling_forks_per_s(self) -> float:
        return self._mean(self.ceiling, lambda w: w.forks_per_s)

    @property
    def host_forks_per_s(self) -> float:
        return self._mean(self.host, lambda w: w.forks_per_s)

    def cpu(self, windows: Sequence[Window], kind: str) -> float:
        return self._mean(windows, lambda w: w.cpu_ms_per_fork()[kind])

    def lines(self) -> list[str]:
        c_app, c_own = self.cpu(self.ceiling, "app-server"), self.cpu(self.ceiling, "bench")
        h_app, h_own = self.cpu(self.host, "app-server"), self.cpu(self.host, "bench")
        top = self.ceiling[0].clients
        return [
            f"at {top} clients, interleaved in one run: ceiling (bare app-servers + the fork's"
            f" syncs) {self.ceiling_forks_per_s:.0f} forks/s, host {self.host_forks_per_s:.0f}"
            f" forks/s, host / ceiling {self.host_forks_per_s / self.ceiling_forks_per_s:.2f}",
            f"CPU ms per fork: ceiling {c_app + c_own:.1f} (app-servers {c_app:.1f}, the bare"
            f" driving + syncs {c_own:.1f}); host {h_app + h_own:.1f} (app-servers {h_app:.1f},"
            f" daemon + workers {h_own:.1f})",
            f"the app-servers' CPU alone would fill {CORES} cores at"
            f" {1000 * CORES / c_app:.0f} forks/s (a host of no CPU at all)",
        ]


def run(mode: Mode) -> BenchResult:
    levels: tuple[int, ...] = pick(mode, (1, 4, 16), (1, 4, 16), (1, 2))
    duration: float = pick(mode, 10.0, 3.0, 1.0)
    top = max(levels)
    result = BenchResult("fork ceiling: the bare provider + the fork's syncs", "", mode.value)
    commits, counted_how = store_commits_per_fork(mode)
    log(f"fork ceiling: {commits} store COMMITs per fork ({counted_how})")
    windows: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="bench-fork-ceiling-") as tmp_text:
        tmp = Path(tmp_text)
        log(f"fork ceiling: {top} bare app-servers, {SOURCE_TURNS} turns each")
        sources: list[Source] = []
        store = GroupCommit(tmp / "store.sqlite3")
        daemon: BenchDaemon | None = None
        try:
            for i in range(top):
                bare = BareAppServer(_tutti_argv(), "TUTTI_AGENT_HOME", tmp / f"bare{i}", {})
                sources.append(Source(bare, tmp / f"bare{i}", tmp / "targets" / f"c{i}"))
                bare.run_turns(SOURCE_TURNS, lambda k: f"turn {k}")
                (tmp / "targets" / f"c{i}").mkdir(parents=True)
            syncs = Syncs(store, commits)
            for src in sources:  # every server warm, as a live Session's is
                src.fork_bare()
                src.fork_driver(syncs)
            plan = [(Drive.BARE, level) for level in levels]
            plan += [(Drive.DRIVER, top)]
            plan += [(Drive.DRIVER_SYNCS, level) for level in levels]
            for drive, level in plan:
                w = bare_window(
                    sources[:level], drive, duration, syncs if drive is Drive.DRIVER_SYNCS else None
                )
                windows.append(w)
                log(f"fork ceiling: {drive.value} × {level}: {w.forks_per_s:.0f} forks/s")
            daemon = BenchDaemon(tmp / "home").start()
            boundaries = fork_sources(daemon.client(), top)
            # At full size ceiling, host, host, ceiling (the plan ended on the ceiling at the
            # top level): the machine's drift falls on both sides alike.
            sides = pick(mode, ("host", "host", "ceiling"), ("host",), ("host",))
            for k, side in enumerate(sides):
                if side == "host":
                    w = host_window(daemon, boundaries, duration, tmp / f"host{k}.txt")
                else:
                    w = bare_window(sources, Drive.DRIVER_SYNCS, duration, syncs)
                windows.append(w)
                log(f"fork ceiling: {w.drive} × {top}: {w.forks_per_s:.0f} forks/s")
        finally:
            if daemon is not None:
                daemon.stop()
            for src in sources:
                src.bare.close()
            store.close()
    at_top = [w for w in windows if w.clients == top]
    ceiling = Ceiling(
        tuple(w for w in at_top if w.drive == Drive.DRIVER_SYNCS.value),
        tuple(w for w in at_top if w.drive == "host"),
    )
    result.tables.append(
        Table(
            f"forks/s by drive and concurrent clients, {duration:.0f} s windows in run order"
            f" (syncs: {commits} store COMMITs group-committed + the binder's rounds)",
            (
                "drive",
                "clients",
                "forks",
                "forks/s",
                "p50 ms",
                "p99 ms",
                "app-server CPU ms/fork",
                "own CPU ms/fork",
                "of it sys",
                "CPU ms/fork",
                "machine busy cores",
                "load 1m",
                "CPU probe ms",
            ),
            tuple(w.row() for w in windows),
        )
    )
    synced = [w for w in windows if w.drive == Drive.DRIVER_SYNCS.value]
    result.notes.append(
        "own CPU: this process (bare: its JSON-RPC client threads and readers, the committer and"
        " the syncs); host: the daemon and its workers"
    )
    result.notes.append(
        "store COMMITs per fsync in the ceiling windows: "
        + ", ".join(
            f"{w.clients} clients {w.store_commits_held / max(1, w.store_fsyncs):.1f}"
            for w in synced
        )
    )
    result.notes += ceiling.lines()
    result.figures = {
        "storeCommitsPerFork": commits,
        "storeCommitsCounted": counted_how,
        "sourceTurns": SOURCE_TURNS,
        "windows": [w.to_json() for w in windows],
        "ceilingForksPerSecond": ceiling.ceiling_forks_per_s,
        "hostForksPerSecond": ceiling.host_forks_per_s,
        "hostOverCeiling": ceiling.host_forks_per_s / ceiling.ceiling_forks_per_s,
    }
    c_cpu = ceiling.cpu(ceiling.ceiling, "app-server") + ceiling.cpu(ceiling.ceiling, "bench")
    profile = {"lines": ceiling.lines()}
    result.issue_target(
        "36:ceiling:forks-per-s",
        ceiling.ceiling_forks_per_s,
        measured=f"bench.fork_ceiling: {top} bare app-servers × {duration:.0f} s, driver's calls +"
        f" {commits} group-committed COMMITs + the binder's rounds, mean of"
        f" {len(ceiling.ceiling)} windows; host {ceiling.host_forks_per_s:.0f} forks/s in the"
        " same run",
        profile=profile,
    )
    result.issue_target(
        "36:ceiling:cpu-per-fork",
        c_cpu,
        measured=f"bench.fork_ceiling at {top} clients: app-servers"
        f" {ceiling.cpu(ceiling.ceiling, 'app-server'):.1f} + the bare driving and syncs"
        f" {ceiling.cpu(ceiling.ceiling, 'bench'):.1f} ms per fork",
        profile=profile,
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
