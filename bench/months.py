"""Benchmark: a store of months (issue 36 target 5). A generated store of 100,000 Sessions,
1,000,000 Turns and 10,000,000 Messages — one of its Sessions 10,000 Turns long and bound to
a real tutti-agent thread of the same 10,000 Turns, 10,000 fork operations left interrupted —
and, through a real daemon on a copy of it:

- recovery: the first start, which settles the 10,000 interrupted operations, until every one
  of them is terminal (the row: a `provider_accepted` leftover committed after the ready line
  is still recovery's work), its ready line printed beside it;
- start: a second start of the same store (nothing left to recover) to ready;
- `session.list` first page (50 Sessions), p99 of repeated reads;
- opening the 10,000-Turn Session: `session.get` + its newest `session.timeline` page (50 Turns),
  p99 of the pair;
- daemon RSS once 10,000 Sessions have been touched (a title update each: each one's actor ran);
- a fork through the big Session's last Turn, `fork.create` → committed (the first, cold: its
  app-server loads the 10,000-Turn thread; a second, warm, is printed beside it), with the
  daemon's own CPU in each and where each one's wall went (prepare / attest / provider+bind /
  commit / reply, from the operation's durable timestamps, as `bench.fork_overhead`).

The store is generated once and cached under `build/bench-cache/` (never in git): the schema
comes from `storage.schema` (a `Store.open`), the rows are written with plain SQL — `executemany`
inside one transaction, journal and fsync off on the builder's own connection, ids that sort in
insert order so every index is appended to — and the 10,000 interrupted operations through the
store's own `prepare_fork` / `mark_fork_*`. Each run measures a fresh copy of the cache.

`--scale F` sizes everything by F (full 1.0; `--quick` 0.02, `--smoke` 0.001), the targets stay
the issue's: a run below full size says so on every measured line. `--sessions`, `--turns`,
`--big-turns` and `--operations` set one dimension each over the scale's: a small store with the
full store's shape where a path depends on it (one 10,000-Turn Session, 10,000 interrupted
operations, a few thousand other Sessions) builds in minutes, not the full store's ~17:

    build/venv/bin/python -m bench.months [--quick|--smoke] [--scale F] [--json FILE]
    build/venv/bin/python -m bench.months --sessions 3000 --turns 40000 --big-turns 10000 \
        --operations 10000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from bench.common import (
    REPO,
    BenchResult,
    Latency,
    Mode,
    Table,
    command_for,
    cpu_probe_ms,
    log,
    pick,
)
from bench.fork_overhead import STAGES, stage_times
from bench.harness import WS, BenchDaemon, acknowledge, fork_until_terminal, sample
from bench.loadgen import now_ms
from bench.proc_cost import PROCS, by_process, fault_probe_us, machine_cpu, spent
from bench.providers import BareAppServer, _tutti_argv
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.schema import SCHEMA_VERSION
from storage.store import Store

MODULE = "bench.months"
CACHE = Path(os.environ.get("AGENTHOST_BENCH_CACHE") or REPO / "build" / "bench-cache")
"""Where generated stores are kept between runs (tests point it at their own tmp dir)."""
GENERATOR_VERSION = 1
"""Bumped when the generated rows change: a cache of another version is rebuilt."""
REUSABLE_SINCE_SCHEMA = 13
"""The oldest schema version whose cache a run reuses instead of regenerating (minutes at full
size): every migration after it is additive or cheap (a table, an index, triggers, a CHECK
restated, a back-fill). Such a cache is migrated once into the current schema's cache (a copy,
brought up by the store's own migration, then marked complete; the older one is left as it was
and may be removed by hand), so each run's first start is the daemon's recovery alone, not an
upgrade a real daemon pays once. Raise it to `SCHEMA_VERSION` when a migration rewrites rows the
generator wrote, or adds rows the daemon's own writes would have made: from v13 on, prepare
writes each fenced source's history witness (`history_fences`); an older cache's interrupted
operations have none, so its recovery measured an upgrade's (every commit re-proved by the
digest), not this daemon's."""
RUNTIME_CONTEXT = {"driverKind": "tutti-agent", "driverVersion": "0.1.0", "userAgent": "bench"}
DAY_MS = 86_400_000
SPAN_MS = 120 * DAY_MS
"""The Sessions' creation times are spread over four months."""
MESSAGES_PER_TURN = 10
"""A user message, eight items (reasoning, tool call, tool result...) and the reply."""
ITEM_KINDS = ("reasoning", "tool_call", "tool_result")
PAGE = 50


@dataclass(frozen=True, slots=True)
class Size:
    sessions: int
    turns: int
    big_turns: int
    operations: int
    touched: int

    @staticmethod
    def of(scale: float) -> Size:
        def n(full: int, least: int) -> int:
            return max(least, round(full * scale))

        return Size(
            sessions=n(100_000, 20),
            turns=n(1_000_000, 200),
            big_turns=n(10_000, 10),
            operations=n(10_000, 5),
            touched=n(10_000, 10),
        )

    def with_counts(
        self,
        sessions: int | None = None,
        turns: int | None = None,
        big_turns: int | None = None,
        operations: int | None = None,
    ) -> Size:
        """This size with the given dimensions set (the others kept)."""
        big = self.big_turns if big_turns is None else big_turns
        s = self.sessions if sessions is None else sessions
        # Every Session but the big one needs a Turn to fork through.
        t = max(self.turns if turns is None else turns, big + s - 1)
        ops = self.operations if operations is None else operations
        return Size(
            sessions=s, turns=t, big_turns=big, operations=ops, touched=min(self.touched, s)
        )

    @property
    def messages(self) -> int:
        return self.turns * MESSAGES_PER_TURN

    @property
    def key(self) -> str:
        return self.key_at(SCHEMA_VERSION)

    def key_at(self, schema: int) -> str:
        """The cache's name for this size generated at schema version `schema`."""
        return (
            f"months-s{self.sessions}-t{self.turns}-b{self.big_turns}-o{self.operations}"
            f"-schema{schema}-gen{GENERATOR_VERSION}"
        )

    def describe(self) -> str:
        return (
            f"{self.sessions:,} Sessions / {self.turns:,} Turns / {self.messages:,} Messages,"
            f" a {self.big_turns:,}-Turn Session, {self.operations:,} interrupted operations"
        )


def _id(kind: int, n: int) -> str:
    """A UUID-shaped id that sorts in generation order (each index is appended to)."""
    return f"{kind:08x}-0000-4000-8000-{n:012x}"


SESSION, TURN, MESSAGE = 1, 2, 3


# -- the generator --------------------------------------------------------------------------------


def cached_home(size: Size) -> Path:
    """The daemon home of the generated store, built on first use (minutes at full size); a
    complete cache of an older schema from `REUSABLE_SINCE_SCHEMA` on is migrated once into
    this schema's cache (`migrated_cache`) instead."""
    home = CACHE / size.key
    if (home / "complete").exists():
        return home
    for schema in range(SCHEMA_VERSION - 1, REUSABLE_SINCE_SCHEMA - 1, -1):
        older = CACHE / size.key_at(schema)
        if (older / "complete").exists():
            return migrated_cache(older, home, schema)
    building = CACHE / f"{size.key}.building"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    t0 = time.monotonic()
    log(f"months: generating {size.describe()} under {building}")
    generate(building, size)
    (building / "complete").write_text(
        json.dumps({"seconds": round(time.monotonic() - t0, 1), "size": size.key})
    )
    shutil.rmtree(home, ignore_errors=True)
    building.rename(home)
    log(f"months: store generated in {time.monotonic() - t0:.0f} s")
    return home


def migrated_cache(older: Path, home: Path, schema: int) -> Path:
    """`home`, the current schema's cache, made once from `older` (a complete cache of schema
    `schema`): a copy migrated offline by the store's own migration (`Store.open`), marked
    complete, then renamed into place; a kill leaves only a `.building` folder the next run
    redoes. `older` is left as it was. Each run's first start then pays recovery alone — the
    migration is an upgrade's one-off cost, printed here once."""
    building = home.with_name(f"{home.name}.building")
    shutil.rmtree(building, ignore_errors=True)
    log(f"months: migrating the schema v{schema} store {older.name} to v{SCHEMA_VERSION} once")
    t0 = time.monotonic()
    shutil.copytree(older, building, ignore=shutil.ignore_patterns("complete"))
    os.sync()  # the copy written back first: the migration's own commit does not wait on it
    copy_s = time.monotonic() - t0
    wall, cpu = time.monotonic(), time.process_time()
    Store.open(building / "store.sqlite3").close()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    (building / "complete").write_text(
        json.dumps(
            {
                "migratedFrom": older.name,
                "copyS": round(copy_s, 1),
                "migrateS": round(wall, 2),
                "migrateCpuS": round(cpu, 2),
                "size": home.name,
            }
        )
    )
    shutil.rmtree(home, ignore_errors=True)
    building.rename(home)
    log(
        f"months: migrated v{schema} -> v{SCHEMA_VERSION} in {wall:.1f} s ({cpu:.1f} s CPU;"
        f" the copy {copy_s:.0f} s), once: {home.name} is this schema's cache from now on"
    )
    return home


def generate(home: Path, size: Size) -> None:
    big_sid = _id(SESSION, 0)
    runtime_home = home / "runtimes" / WS / big_sid / "tutti-agent-home"
    t0 = time.monotonic()
    bare = BareAppServer(_tutti_argv(), "TUTTI_AGENT_HOME", runtime_home, {})
    try:
        bare.run_turns(size.big_turns, lambda i: f"turn {i}")
    finally:
        bare.close()
    log(f"months: tutti-agent thread of {size.big_turns} turns in {time.monotonic() - t0:.0f} s")
    path = home / "store.sqlite3"
    store = Store.open(path)  # the real schema, every migration
    try:
        store.sessions.create_session(
            WS,
            session_id=big_sid,
            provider="tutti-agent",
            title="the long one",
            cwd=str(home),
            settings={},
            provider_session_id=bare.thread_id,
            runtime_context=RUNTIME_CONTEXT,
        )
    finally:
        store.close()
    t0 = time.monotonic()
    last_turns = bulk_rows(path, size, str(home), bare.turn_ids)
    log(f"months: rows written in {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    interrupt_operations(path, size, str(home), last_turns)
    log(f"months: {size.operations} interrupted operations in {time.monotonic() - t0:.0f} s")


def _turn_counts(size: Size) -> Iterator[int]:
    """Turns per Session after the big one: the rest spread evenly."""
    others = size.sessions - 1
    rest = size.turns - size.big_turns
    base, extra = divmod(rest, others)
    for i in range(others):
        yield base + (1 if i < extra else 0)


def bulk_rows(path: Path, size: Size, cwd: str, big_provider_turns: list[str]) -> list[str]:
    """Every Session but the big one's row, then every Session's Turns and Messages, in one
    transaction on a connection of its own with the journal and fsync off (a fixture: nothing
    measured runs like this). Returns the last Turn id of each small Session, in order."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode=OFF").fetchall()
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA foreign_keys=OFF")  # every row below is written in a valid order
    conn.execute("PRAGMA cache_size=-262144")
    now = int(time.time() * 1000)
    start = now - SPAN_MS
    step = SPAN_MS // max(1, size.sessions)
    runtime = json.dumps(RUNTIME_CONTEXT, separators=(",", ":"))
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO sessions (workspace_id, session_id, kind, provider, provider_session_id,"
        " title, cwd, settings_json, runtime_context_json, created_at_ms, updated_at_ms)"
        " VALUES (?, ?, 'root', 'tutti-agent', ?, ?, ?, '{}', ?, ?, ?)",
        (
            (WS, _id(SESSION, s), f"thread-{s}", f"session {s}", cwd, runtime, t, t + 3_600_000)
            for s in range(1, size.sessions)
            for t in (start + s * step,)
        ),
    )
    keys = dict(
        conn.execute(
            "SELECT session_id, session_key FROM session_keys WHERE workspace_id = ?", (WS,)
        )
    )
    counter = {"turn": 0, "message": 0}
    last_turns: list[str] = []

    def rows(sid: str, n_turns: int, provider_turns: Sequence[str] | None, t: int) -> None:
        key = keys[sid]
        turns: list[tuple[Any, ...]] = []
        messages: list[tuple[Any, ...]] = []
        position = 0
        turn_id = ""
        for seq in range(1, n_turns + 1):
            counter["turn"] += 1
            turn_id = _id(TURN, counter["turn"])
            created = t + seq * 1000
            first = counter["message"] + 1
            counter["message"] += MESSAGES_PER_TURN
            final = _id(MESSAGE, counter["message"])
            ptid = provider_turns[seq - 1] if provider_turns else f"pturn-{counter['turn']}"
            turns.append((WS, sid, turn_id, seq, ptid, final, created, created + 900))
            for k in range(MESSAGES_PER_TURN):
                position += 1
                mid = _id(MESSAGE, first + k)
                if k == 0:
                    kind, text = "user", f"turn {seq}: " + "u" * 60
                elif k == MESSAGES_PER_TURN - 1:
                    kind, text = "assistant", f"echo: turn {seq}"
                else:
                    kind, text = ITEM_KINDS[k % 3], f"item {k} of turn {seq}: " + "x" * 80
                messages.append((WS, sid, mid, turn_id, kind, text, position, created + k, key))
        conn.executemany(
            "INSERT INTO turns (workspace_id, session_id, turn_id, sequence,"
            " sequence_provenance, phase, outcome, root_provider_turn_id,"
            " final_assistant_message_id, created_at_ms, settled_at_ms)"
            " VALUES (?, ?, ?, ?, 'host', 'settled', 'completed', ?, ?, ?, ?)",
            turns,
        )
        conn.executemany(
            "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
            " payload_json, version, position, created_at_ms, session_key)"
            " VALUES (?, ?, ?, ?, ?, ?, '{}', 1, ?, ?, ?)",
            messages,
        )
        last_turns.append(turn_id)

    rows(_id(SESSION, 0), size.big_turns, big_provider_turns, start)
    last_turns.clear()  # the big Session's last Turn is read back by the benchmark
    t0 = time.monotonic()
    for s, n_turns in enumerate(_turn_counts(size), 1):
        rows(_id(SESSION, s), n_turns, None, start + s * step)
        if s % 10_000 == 0:
            log(f"months: {s:,} Sessions written ({time.monotonic() - t0:.0f} s)")
    conn.execute("COMMIT")
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.close()
    return last_turns


def interrupt_operations(path: Path, size: Size, cwd: str, last_turns: list[str]) -> None:
    """`size.operations` fork operations left as a crash leaves them, through the store's own
    API, on Sessions spread over the store: 2/5 prepared, 2/5 dispatching, 1/5
    provider_accepted (as `bench.scale` builds its recovery store)."""
    store = Store.open(path)
    try:
        store.db._writer_connection().execute("PRAGMA synchronous=OFF")  # a fixture, not measured
        stride = max(1, len(last_turns) // size.operations)
        for i in range(size.operations):
            s = 1 + (i * stride) % len(last_turns)
            sid, turn_id = _id(SESSION, s), last_turns[s - 1]
            op, _ = store.fork_prepare.prepare_fork(
                WS,
                ForkPrepareRequest(
                    source_session_id=sid,
                    request_id=f"fork-{i}",
                    target_session_id=_id(SESSION, 10**9 + i),
                    turn_id=turn_id,
                    driver_kind="tutti-agent",
                    driver_version="0.1.0",
                    binding_mode="host_copy",
                    runtime_identity={"cwd": cwd, "settings": {}, "runtime_context": {}},
                ),
            )
            if i % 5 >= 2:
                store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
            if i % 5 == 4:
                store.fork_transitions.mark_fork_provider_accepted(
                    WS,
                    op.operation_id,
                    ProviderForkEvidence(
                        child_provider_session_id=f"child-{i}",
                        provider_turn_ids=_provider_turns(path, sid),
                        binding_mode="host_copy",
                        receipt={"bench": True},
                    ),
                )
    finally:
        store.close()


def _provider_turns(path: Path, sid: str) -> tuple[str, ...]:
    """The Session's provider Turn ids in order: the evidence a provider fork returns."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT root_provider_turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
            " ORDER BY sequence",
            (WS, sid),
        ).fetchall()
    finally:
        conn.close()
    return tuple(str(r[0]) for r in rows)


# -- the measurements -----------------------------------------------------------------------------


def _interrupted(home: Path) -> int:
    """Fork operations not yet terminal in the store of `home` (read-only, beside a daemon)."""
    ro = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        ro.setbusytimeout(5000)
        return int(
            ro.execute(
                "SELECT count(*) FROM fork_operations"
                " WHERE status IN ('prepared', 'dispatching', 'provider_accepted')"
            ).fetchall()[0][0]
        )
    finally:
        ro.close()


def _timed(c: Any, method: str, params: dict[str, Any]) -> float:
    t = time.perf_counter()
    status, body = c.call_raw(method, params)
    ms = (time.perf_counter() - t) * 1000
    if status >= 400:
        raise RuntimeError(f"{method} failed: {status} {body}")
    return ms


class _GcPauses:
    """The longest pause of this process's cyclic collector while it is installed."""

    def __init__(self) -> None:
        self.longest_ms = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._started) * 1000)

    def close(self) -> float:
        gc.callbacks.remove(self._on_gc)
        return round(self.longest_ms, 2)


def _cpu_ms(pid: int) -> float:
    """utime + stime of process `pid` so far, ms (0 if it is gone)."""
    s = sample(pid)
    return 0.0 if s is None else s.cpu_s * 1000


def read_loops(api: str, reads: int, after: int, daemon_pid: int = 0) -> dict[str, Any]:
    """`reads` first pages of `session.list`, then `reads` opens of the big Session
    (`session.get` + the timeline page after sequence `after`), one at a time, each timed in
    ms; this process's heap frozen first and its collector's longest pause reported. Beside
    the times, the CPU per read of the daemon (`daemon_pid`) and of this client: the client
    does the same work whatever the store, so its CPU per read is the host's speed during the
    loop (it swings ~2x between minutes here), the ruler a p50 or p99 is read against."""
    from transport.client import Client

    c = Client(api, timeout=600)
    try:
        big = _id(SESSION, 0)
        gc.collect()
        gc.freeze()
        client_gc = _GcPauses()
        cpu: dict[str, float] = {}
        d0, c0 = _cpu_ms(daemon_pid), time.process_time()
        listed = [
            _timed(c, "session.list", {"workspaceId": WS, "limit": PAGE}) for _ in range(reads)
        ]
        d1, c1 = _cpu_ms(daemon_pid), time.process_time()
        timeline = {"workspaceId": WS, "agentSessionId": big, "afterSequence": after}
        opened = [
            _timed(c, "session.get", {"workspaceId": WS, "agentSessionId": big})
            + _timed(c, "session.timeline", {**timeline, "limit": PAGE})
            for _ in range(reads)
        ]
        d2, c2 = _cpu_ms(daemon_pid), time.process_time()
        if daemon_pid:
            cpu["listDaemonCpuMs"] = round((d1 - d0) / reads, 3)
            cpu["openDaemonCpuMs"] = round((d2 - d1) / reads, 3)
        cpu["listClientCpuMs"] = round((c1 - c0) * 1000 / reads, 3)
        cpu["openClientCpuMs"] = round((c2 - c1) * 1000 / reads, 3)
        return {
            "list": listed,
            "open": opened,
            **cpu,
            "clientThreads": threading.active_count(),
            "clientGcMaxMs": client_gc.close(),
        }
    finally:
        c.close()


def _read_loops_apart(api: str, reads: int, after: int, daemon_pid: int) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            MODULE,
            "--read-loops",
            json.dumps([api, reads, after, daemon_pid]),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=str(REPO),
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "list": Latency.of(got["list"]),
        "open": Latency.of(got["open"]),
        "clientThreads": got["clientThreads"],
        "clientGcMaxMs": got["clientGcMaxMs"],
        **{k: v for k, v in got.items() if k.endswith("CpuMs")},
    }


def measure(home: Path, tmp: Path, size: Size, reads: int) -> dict[str, Any]:
    work = tmp / "home"
    t0 = time.monotonic()
    shutil.copytree(home, work, ignore=shutil.ignore_patterns("complete"))
    log(f"months: copied the store in {time.monotonic() - t0:.0f} s")
    # The copy's gigabytes are the fixture's, still dirty in the page cache: written back
    # before the daemon starts, so its first fsyncs (recovery's COMMITs) do not wait behind
    # them (the filesystem's journal commit flushes them first), as no real restart would.
    t0 = time.monotonic()
    os.sync()
    out_sync_s = time.monotonic() - t0
    log(f"months: the copy written back in {out_sync_s:.1f} s")
    out: dict[str, Any] = {"size": size.describe(), "copySyncS": round(out_sync_s, 2)}
    empty = BenchDaemon(tmp / "empty").start()
    out["emptyReadyS"] = empty.ready_seconds  # what a start costs with nothing stored
    empty.stop()
    first = BenchDaemon(work).start(timeout=1200)
    out["recoveryReadyS"] = first.ready_seconds
    # The commits a start defers past its ready line (actors.recovery.DeferredCommits):
    # the time from the start until the last one is made, read from the store itself.
    ready_at = time.monotonic()
    out["operationsLeftAtReady"] = _interrupted(work)
    while (left := _interrupted(work)) and time.monotonic() - ready_at < 1200:
        time.sleep(0.02)
    out["recoveryCommittedS"] = first.ready_seconds + (time.monotonic() - ready_at)
    first.stop()
    out["operationsLeft"] = left
    daemon = BenchDaemon(work, idle_actor_seconds=2.0).start(timeout=600)
    ops: list[dict[str, Any]] = []
    try:
        out["readyS"] = daemon.ready_seconds
        s0 = sample(daemon.pid)
        out["rssAfterStartMb"] = s0.rss_mb if s0 else None
        c = daemon.client(timeout=600)
        big = _id(SESSION, 0)
        # The reads are timed from a fresh process of their own (`read_loops`): under
        # `bench.run_all` this one holds every earlier benchmark's results and threads, whose
        # collections and GIL turns would land inside the timed reads.
        after = max(0, size.big_turns - PAGE)
        out.update(_read_loops_apart(daemon.api, reads, after, daemon.pid))
        # Touch `size.touched` Sessions spread over the store: each one's actor runs once.
        stride = max(1, (size.sessions - 1) // size.touched)
        t = time.monotonic()
        pending: list[Any] = []
        errors = 0
        for i in range(size.touched):
            sid = _id(SESSION, 1 + (i * stride) % (size.sessions - 1))
            params = {"workspaceId": WS, "agentSessionId": sid, "title": f"touched {i}"}
            pending.append(c.submit("session.updateTitle", params))
            if len(pending) >= 200:
                errors += sum(1 for f in pending if f.result(300)[0] >= 400)
                pending.clear()
        errors += sum(1 for f in pending if f.result(300)[0] >= 400)
        out["touchErrors"], out["touchSeconds"] = errors, time.monotonic() - t
        s1 = sample(daemon.pid)
        out["rssAfterTouchMb"] = s1.rss_mb if s1 else None
        out["hwmAfterTouchMb"] = s1.hwm_mb if s1 else None
        # The big Session's last Turn: read back, as a client would.
        last = c.call(
            "session.timeline",
            {"workspaceId": WS, "agentSessionId": big, "afterSequence": after, "limit": PAGE},
        )["turns"][-1]["turnId"]
        forks, cpu, costs, machine = [], [], [], []
        # The VM's speed just before the forks (it swings ~2x between minutes; the probe at the
        # run's start is ~20 s earlier), and the machine's busy and stolen CPU inside each fork.
        out["cpuProbeAtForkMs"] = cpu_probe_ms()
        for _ in range(2):
            before, m0 = by_process(daemon.pid), machine_cpu()
            d0, t0 = _cpu_ms(daemon.pid), now_ms()
            t = time.perf_counter()
            op = fork_until_terminal(c, big, str(last), poll_s=0.005)
            forks.append((time.perf_counter() - t) * 1000)
            ops.append({"operationId": op["operationId"], "t0": t0, "t1": now_ms()})
            cpu.append(round(_cpu_ms(daemon.pid) - d0, 1))
            costs.append(spent(before, by_process(daemon.pid)))
            machine.append({k: round((v - m0[k]) * 1000) for k, v in machine_cpu().items()})
            if op["status"] != "committed":
                raise RuntimeError(f"the big Session's fork did not commit: {op}")
            acknowledge(c, op["operationId"])
        out["forkColdMs"], out["forkWarmMs"] = forks
        # The daemon's own CPU in each fork (its worker's and app-server's are not counted).
        out["forkDaemonCpuMs"] = cpu
        # Each fork's processes (the app-server of the cold one started inside it): CPU and
        # system CPU ms, minor / major page faults, disk MB read — what tells a cold page cache
        # (major faults, disk reads) from a slow VM minute (system CPU per fault) in the cold row.
        out["forkMachineCpuMs"] = machine
        out["forkProcesses"] = [
            {
                name: {k: round(v * 1000 if k in ("cpu", "sys") else v, 1) for k, v in got.items()}
                for name, got in cost.items()
            }
            for cost in costs
        ]
        s2 = sample(daemon.pid)
        out["hwmAfterForksMb"] = s2.hwm_mb if s2 else None
    finally:
        daemon.stop()
    # Where each fork's wall went, from its durable timestamps (read once the daemon is gone):
    # fork.create → created → dispatched → provider accepted → committed → seen by the client.
    stages = stage_times(work / "store.sqlite3", ops)
    if all(len(stages[stage]) == len(ops) for stage in STAGES):
        out["forkStagesMs"] = [[stages[stage][i] for stage in STAGES] for i in range(len(ops))]
    return out


def _fork_context(m: dict[str, Any]) -> str:
    """What the cold fork ran on, said beside its target row: the CPU probe just before it and
    the machine's busy CPU in it against the fork's own processes' (more than its own: another
    process shared the 2 cores) — the row varies ~2x with these, not with the store's pages."""
    machine = (m.get("forkMachineCpuMs") or [{}])[0]
    own = sum(p.get("cpu", 0.0) for p in (m.get("forkProcesses") or [{}])[0].values())
    return (
        f" at a CPU probe of {m.get('cpuProbeAtForkMs', float('nan')):.1f} ms, busy"
        f" {machine.get('busy', float('nan')):.0f} ms in it (its own processes"
        f" {own:.0f} ms), stolen {machine.get('steal', float('nan')):.0f} ms"
    )


def run(
    mode: Mode, scale: float | None = None, counts: dict[str, int] | None = None
) -> BenchResult:
    scale = pick(mode, 1.0, 0.02, 0.001) if scale is None else scale
    size = Size.of(scale).with_counts(**(counts or {}))
    reads = pick(mode, 300, 100, 10)
    result = BenchResult("a store of months", "", mode.value)
    home = cached_home(size)
    # The host as the measurement starts: every figure below is read against these.
    probe, load, fault_us = cpu_probe_ms(), os.getloadavg()[0], fault_probe_us()
    log(
        f"months: CPU probe {probe:.1f} ms, load average {load:.1f}, a first-touch page fault"
        f" {fault_us:.1f} µs"
    )
    with tempfile.TemporaryDirectory(prefix="months-run-") as tmp:
        m = measure(home, Path(tmp), size, reads)
    result.figures = {
        "scale": scale,
        "readsEach": reads,
        "cpuProbeMs": round(probe, 1),
        "loadAverage": round(load, 2),
        "pageFaultUs": round(fault_us, 2),
        **m,
    }
    store_mb = (home / "store.sqlite3").stat().st_size / 2**20
    result.figures["storeMb"] = round(store_mb, 1)
    at = f"{size.describe()} ({store_mb:,.0f} MB)" + (
        "" if size == Size.of(1.0) else "; not the issue's full store"
    )
    lst, opn = m["list"], m["open"]
    result.tables.append(
        Table(
            f"store of months: {at}",
            ("what", "value", "unit"),
            (
                (
                    "first start (recovery of the interrupted operations) to ready",
                    m["recoveryReadyS"] * 1000,
                    "ms",
                ),
                (
                    "first start: every interrupted operation terminal (from the start)",
                    m["recoveryCommittedS"] * 1000,
                    "ms",
                ),
                (
                    "operations awaiting their commit at the ready line",
                    m["operationsLeftAtReady"],
                    "",
                ),
                ("second start to ready", m["readyS"] * 1000, "ms"),
                ("an empty store's start to ready (same run)", m["emptyReadyS"] * 1000, "ms"),
                ("operations still interrupted after its commits", m["operationsLeft"], ""),
                (
                    f"session.list first page ({PAGE}) p50 / p99",
                    f"{lst.p50:.2f} / {lst.p99:.2f}",
                    "ms",
                ),
                (
                    f"session.get + newest timeline page ({PAGE}) p50 / p99",
                    f"{opn.p50:.2f} / {opn.p99:.2f}",
                    "ms",
                ),
                (
                    "fork through the big Session's last Turn, cold / warm",
                    f"{m['forkColdMs']:.0f} / {m['forkWarmMs']:.0f}",
                    "ms",
                ),
                (
                    "the forks' daemon CPU, cold / warm",
                    " / ".join(f"{v:.0f}" for v in m.get("forkDaemonCpuMs", ())) or "-",
                    "ms",
                ),
                (
                    f"the forks' stages, cold; warm ({' / '.join(STAGES)})",
                    "; ".join(
                        " / ".join(f"{v:.0f}" for v in row) for row in m.get("forkStagesMs", ())
                    )
                    or "-",
                    "ms",
                ),
                (
                    "the forks' CPU / system CPU ms, cold; warm ("
                    + " / ".join(PROCS)
                    + "; the cold one's app-server started inside it)",
                    "; ".join(
                        " / ".join(
                            f"{f.get(p, {}).get('cpu', 0.0):.0f}/{f.get(p, {}).get('sys', 0.0):.0f}"
                            for p in PROCS
                        )
                        for f in m.get("forkProcesses", ())
                    )
                    or "-",
                    "ms",
                ),
                (
                    "the machine's busy / stolen CPU in the forks, cold; warm (every process);"
                    " the CPU probe just before them",
                    "; ".join(f"{f['busy']} / {f['steal']}" for f in m.get("forkMachineCpuMs", ()))
                    + f"; probe {m.get('cpuProbeAtForkMs', float('nan')):.1f}",
                    "ms",
                ),
                (
                    "the forks' minor / major page faults, disk MB read, cold ("
                    + " / ".join(PROCS)
                    + "): a cold page cache shows as major faults and reads",
                    " / ".join(
                        f"{f.get('minflt', 0):.0f}/{f.get('majflt', 0):.0f}"
                        f" {f.get('readMB', 0.0):.1f}"
                        for f in (m["forkProcesses"][0].get(p, {}) for p in PROCS)
                    )
                    if m.get("forkProcesses")
                    else "-",
                    "",
                ),
                (
                    "CPU per read, daemon / the reading client: list; open",
                    f"{m.get('listDaemonCpuMs', float('nan')):.2f} /"
                    f" {m['listClientCpuMs']:.2f}; {m.get('openDaemonCpuMs', float('nan')):.2f}"
                    f" / {m['openClientCpuMs']:.2f}",
                    "ms",
                ),
                (
                    "the reading client (its own process): threads / longest GC pause",
                    f"{m['clientThreads']} / {m['clientGcMaxMs']:.2f}",
                    "- / ms",
                ),
                ("daemon RSS after start", m["rssAfterStartMb"], "MB"),
                (f"daemon RSS with {size.touched:,} Sessions touched", m["rssAfterTouchMb"], "MB"),
                ("touch errors", m["touchErrors"], ""),
                (
                    "CPU probe / load average / a first-touch page fault at the start",
                    f"{probe:.1f} / {load:.1f} / {fault_us:.1f}",
                    "ms / - / µs",
                ),
            ),
        )
    )
    for key, value, what in (
        ("ready", m["readyS"] * 1000, "second start of the store to the ready line"),
        ("list-p99", lst.p99, f"{lst.n} session.list (limit {PAGE}) one at a time"),
        ("open-p99", opn.p99, f"{opn.n} session.get + session.timeline (newest {PAGE} Turns)"),
        (
            "fork",
            m["forkColdMs"],
            "fork.create → committed, the first (cold) fork, on a machine" + _fork_context(m),
        ),
        (
            "recovery",
            m["recoveryCommittedS"] * 1000,
            f"first start until every one of {size.operations:,} interrupted operations is"
            f" terminal (its ready line at {m['recoveryReadyS'] * 1000:.0f} ms)",
        ),
        ("rss", m["rssAfterTouchMb"], f"VmRSS after a title update on {size.touched:,} Sessions"),
    ):
        result.issue_target(
            f"36:months:{key}",
            float("nan") if value is None else float(value),
            measured=f"bench.months: {what}; {at}",
            profile={
                "lines": [
                    f"store: {at}; CPU probe {probe:.1f} ms, load average {load:.1f} at the start",
                    f"an empty store's daemon starts to ready in {m['emptyReadyS'] * 1000:.0f} ms"
                    " in the same run (interpreter, imports, sockets)",
                    "the first start's deferred commits all made"
                    f" {m['recoveryCommittedS'] * 1000:.0f} ms after it"
                    f" ({m['operationsLeftAtReady']:,} awaiting at ready)",
                    "CPU per read, daemon / reading client (the host's speed):"
                    f" list {m.get('listDaemonCpuMs', float('nan')):.2f} /"
                    f" {m['listClientCpuMs']:.2f} ms, open"
                    f" {m.get('openDaemonCpuMs', float('nan')):.2f} /"
                    f" {m['openClientCpuMs']:.2f} ms",
                    f"warm fork {m['forkWarmMs']:.0f} ms; RSS after start"
                    f" {m['rssAfterStartMb'] or 0:.1f} MB, peak after the forks"
                    f" {m['hwmAfterForksMb'] or 0:.1f} MB",
                ]
            },
        )
    if size != Size.of(1.0):
        result.notes.append(f"{size.describe()}: not the issue's full store")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.months", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--scale", type=float, default=None, help="size of the store, 1.0 = issue's")
    for dim in ("sessions", "turns", "big-turns", "operations"):
        ap.add_argument(f"--{dim}", type=int, default=None, help=f"{dim}, over the scale's")
    ap.add_argument("--generate-only", action="store_true", help="build the cache and stop")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--read-loops", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.read_loops is not None:
        api, reads, after, pid = json.loads(args.read_loops)
        print(json.dumps(read_loops(str(api), int(reads), int(after), int(pid))))
        return 0
    mode = Mode.SMOKE if args.smoke else Mode.QUICK if args.quick else Mode.FULL
    counts = {
        key: value
        for key in ("sessions", "turns", "big_turns", "operations")
        if (value := getattr(args, key)) is not None
    }
    if args.generate_only:
        scale = pick(mode, 1.0, 0.02, 0.001) if args.scale is None else args.scale
        print(cached_home(Size.of(scale).with_counts(**counts)))
        return 0
    started = time.monotonic()
    result = run(mode, args.scale, counts)
    result.seconds = time.monotonic() - started
    extra = [] if args.scale is None else ["--scale", f"{args.scale:g}"]
    for key, value in counts.items():
        extra += [f"--{key.replace('_', '-')}", str(value)]
    result.command = command_for(
        MODULE, {Mode.FULL: [], Mode.QUICK: ["--quick"], Mode.SMOKE: ["--smoke"]}[mode] + extra
    )
    print(result.render(), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
