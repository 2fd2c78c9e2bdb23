"""Benchmark 5: scale. (a) A source of 1,000 Turns / 10,000 Messages: the store's prepare +
commit time and peak RSS growth (in a fresh process), and the same fork end to end through
the daemon; (b) start-up recovery of 10,000 non-terminal fork operations; (c) daemon RSS with
10,000 idle Sessions, before and after each one's actor has run and idled out; (d)
`session.get`/`fork.get` throughput and p99 with 8 clients.

`--only-big-fork` runs the store part of (a) alone, several times (issue 20 row 10): a store-only
copy of the big source (no provider thread: the store never reads it), then prepare +
transitions + commit in a fresh process on a fresh copy per round, wall and CPU time each.
`--rounds N` sets how many rounds (default 7 full, 3 quick, 1 smoke); `--profile` adds one more
round under cProfile (not counted) and prints the functions that bound it.
`--only-reads` runs (d) alone.

Fixtures are built with the storage API (and, for the big source, a real `tutti-agent
app-server` whose thread holds the same 1,000 provider Turns) before the daemon starts. The
builder turns fsync off on its own connection only, to build fast; everything measured runs
with the store's normal `synchronous=FULL`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Latency, Mode, Table, bench_main, log, pick
from bench.harness import WS, BenchDaemon, acknowledge, fork_until_terminal, sample
from bench.loadgen import ClientSpec, latencies, run_clients
from bench.profile import (
    QUIET_TIMEOUT_S,
    TreeProfile,
    cores_busy_between,
    cpu_line,
    machine_busy,
    py_spy,
    spy_lines,
    wait_until_quiet,
)
from bench.providers import BareAppServer, _tutti_argv
from bench.targets import BY_KEY
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store

MODULE = "bench.scale"
RUNTIME_CONTEXT = {"driverKind": "tutti-agent", "driverVersion": "0.1.0", "userAgent": "bench"}


def _fast_builder(store: Store) -> None:
    # Building fixtures only: this connection skips fsync; measured runs never use it.
    store.db._writer_connection().execute("PRAGMA synchronous=OFF")


def _settled_turn(
    store: Store, sid: str, i: int, provider_turn_id: str, extra_messages: int
) -> str:
    turn, _ = store.turns.claim_submit(WS, sid, f"req-{i}", f"turn {i}: " + "u" * 60)
    store.turns.bind_provider_turn(WS, sid, turn.turn_id, provider_turn_id)
    kinds = ("reasoning", "tool_call", "tool_result")
    for k in range(extra_messages - 1):
        store.history.append_message(
            WS, sid, turn.turn_id, kind=kinds[k % 3], text=f"item {k} of turn {i}: " + "x" * 80
        )
    final = store.history.append_message(
        WS, sid, turn.turn_id, kind="assistant", text=f"echo: turn {i}"
    )
    store.turns.settle_turn(
        WS, sid, turn.turn_id, outcome="completed", final_assistant_message_id=final.message_id
    )
    return turn.turn_id


def build_big_source(
    home: Path, turns: int, messages_per_turn: int
) -> tuple[str, str, str, list[str]]:
    """A canonical source of `turns` Turns × `messages_per_turn` Messages whose provider
    thread (a real tutti-agent rollout in the Session's own runtime home) has the same Turns."""
    sid = str(uuid.uuid4())
    runtime_home = home / "runtimes" / WS / sid / "tutti-agent-home"
    bare = BareAppServer(_tutti_argv(), "TUTTI_AGENT_HOME", runtime_home, {})
    try:
        bare.run_turns(turns, lambda i: f"turn {i}")
    finally:
        bare.close()
    last = store_big_source(home, sid, bare.thread_id, bare.turn_ids, messages_per_turn)
    return sid, last, bare.thread_id, bare.turn_ids


def store_big_source(
    home: Path, sid: str, thread_id: str, provider_turn_ids: list[str], messages_per_turn: int
) -> str:
    """The big source's canonical side: Session `sid` bound to `thread_id`, one settled Turn
    per provider Turn id with `messages_per_turn` Messages; returns the last Turn's id."""
    store = Store.open(home / "store.sqlite3")
    try:
        _fast_builder(store)
        store.sessions.create_session(
            WS,
            session_id=sid,
            provider="tutti-agent",
            title="big source",
            cwd=str(home),
            settings={},
            provider_session_id=thread_id,
            runtime_context=RUNTIME_CONTEXT,
        )
        last = ""
        for i, provider_turn in enumerate(provider_turn_ids):
            last = _settled_turn(store, sid, i, provider_turn, messages_per_turn - 1)
    finally:
        store.close()
    return last


def bare_fork_at_scale(
    runtime_home: Path, tmp: Path, thread_id: str, turn_ids: list[str], n: int
) -> Latency:
    """The bare provider calls on a copy of the big source's provider home (same thread)."""
    copy = tmp / "bare-big-home"
    shutil.copytree(runtime_home, copy)
    bare = BareAppServer(_tutti_argv(), "TUTTI_AGENT_HOME", copy, {}, resume=(thread_id, turn_ids))
    try:
        bare.fork_once()  # warm
        return Latency.of(bare.fork_once() for _ in range(n))
    finally:
        bare.close()


def build_recovery_store(home: Path, operations: int) -> tuple[list[str], list[str]]:
    """`operations` sources, each with one settled Turn and one non-terminal fork operation:
    2/5 prepared, 2/5 dispatching, 1/5 provider_accepted. Returns (session ids, op ids)."""
    store = Store.open(home / "store.sqlite3")
    sids, ops = [], []
    try:
        _fast_builder(store)
        for i in range(operations):
            sid = str(uuid.uuid4())
            store.sessions.create_session(
                WS,
                session_id=sid,
                provider="tutti-agent",
                title=f"idle {i}",
                cwd=str(home),
                settings={},
                provider_session_id=f"thread-{i}",
                runtime_context=RUNTIME_CONTEXT,
            )
            turn_id = _settled_turn(store, sid, i, f"pturn-{i}", 1)
            op, _ = store.fork_prepare.prepare_fork(
                WS,
                ForkPrepareRequest(
                    source_session_id=sid,
                    request_id=f"fork-{i}",
                    target_session_id=str(uuid.uuid4()),
                    turn_id=turn_id,
                    driver_kind="tutti-agent",
                    driver_version="0.1.0",
                    binding_mode="host_copy",
                    runtime_identity={"cwd": str(home), "settings": {}, "runtime_context": {}},
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
                        provider_turn_ids=(f"pturn-{i}",),
                        binding_mode="host_copy",
                        receipt={"bench": True},
                    ),
                )
            sids.append(sid)
            ops.append(op.operation_id)
    finally:
        store.close()
    return sids, ops


# -- probes: run in a fresh process so RSS growth is the probe's own ---------------------------


def _rss() -> tuple[float, float]:
    s = sample(os.getpid())
    assert s is not None
    return s.rss_mb, s.hwm_mb


def probe_store_fork(path: str, sid: str, turn_id: str) -> dict[str, Any]:
    store = Store.open(path)
    store.sessions.get_session(WS, sid)
    rss0, _ = _rss()
    c0 = time.process_time()
    t0 = time.perf_counter()
    op, _ = store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id="probe",
            target_session_id=str(uuid.uuid4()),
            turn_id=turn_id,
            driver_kind="tutti-agent",
            driver_version="0.1.0",
            binding_mode="host_copy",
            runtime_identity={"cwd": "/", "settings": {}, "runtime_context": {}},
        ),
    )
    t1 = time.perf_counter()
    c1 = time.process_time()
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(
        WS,
        op.operation_id,
        ProviderForkEvidence(
            child_provider_session_id="probe-child",
            provider_turn_ids=tuple(op.source_provider_turn_ids),
            binding_mode="host_copy",
            receipt={"bench": True},
        ),
    )
    c2 = time.process_time()
    t2 = time.perf_counter()
    committed, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    t3 = time.perf_counter()
    c3 = time.process_time()
    _, hwm = _rss()
    assert committed.status.value == "committed"
    store.close()
    return {
        "prepareMs": (t1 - t0) * 1000,
        "transitionsMs": (t2 - t1) * 1000,
        "commitMs": (t3 - t2) * 1000,
        "prepareCommitMs": (t1 - t0 + t3 - t2) * 1000,
        "prepareCpuMs": (c1 - c0) * 1000,
        "commitCpuMs": (c3 - c2) * 1000,
        "rssBeforeMb": rss0,
        "peakGrowthMb": hwm - rss0,
    }


def probe_store_fork_profile(path: str, sid: str, turn_id: str) -> dict[str, Any]:
    """The same prepare + commit under cProfile: the functions that bound it."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    timings = probe_store_fork(path, sid, turn_id)
    profiler.disable()
    stats = pstats.Stats(profiler)
    entries = []
    for (file, line, fn), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = "/".join(file.split("/")[-2:])
        entries.append((f"{fn} ({where}:{line})", calls, tottime * 1000, cumtime * 1000))
    by_self = sorted(entries, key=lambda e: -e[2])[:10]
    by_cum = sorted(entries, key=lambda e: -e[3])[:10]
    return {
        "timings": timings,
        "topSelf": [[f, c, round(t, 2)] for f, c, t, _ in by_self],
        "topCumulative": [[f, c, round(cu, 2)] for f, c, _, cu in by_cum],
    }


def probe_recovery(path: str) -> dict[str, Any]:
    from actors.recovery import recover_fork_operations

    store = Store.open(path)
    t0 = time.perf_counter()
    report = recover_fork_operations(store)
    elapsed = time.perf_counter() - t0
    store.close()
    return {
        "seconds": elapsed,
        "failed": report.failed,
        "unknown": report.unknown,
        "committed": report.committed,
        "errors": report.errors,
    }


def _run_probe(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", MODULE, "--probe", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _copy_store(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copy(f"{src}{suffix}", dst / f"store.sqlite3{suffix}")
    return dst / "store.sqlite3"


# -- the benchmark ----------------------------------------------------------------------------


def store_probes(
    store: Path, tmp: Path, sid: str, last: str, rounds: int, quiet_s: float = 30.0
) -> list[dict[str, Any]]:
    """`probe_store_fork` `rounds` times, each in a fresh process on a fresh copy of `store`."""
    probes = []
    for i in range(max(1, rounds)):
        copy = _copy_store(store, tmp / f"copy-{i}")
        # The copy's own write-back and whatever ran before (the fixture's app-server, an
        # earlier benchmark's tree) are not the store's cost: start each round on a quiet
        # machine, and record how busy the machine was during it.
        quiet = wait_until_quiet(timeout_s=quiet_s)
        busy0 = machine_busy()
        probe = _run_probe("store-fork", str(copy), sid, last)
        busy1 = machine_busy()
        probe["busyCoresBefore"] = round(quiet, 2)
        probe["busyCoresDuring"] = round(cores_busy_between(busy0, busy1), 2)
        probes.append(probe)
        shutil.rmtree(copy.parent)
    return probes


def median_store_probe(
    store: Path, tmp: Path, sid: str, last: str, rounds: int, quiet_s: float = 30.0
) -> dict[str, Any]:
    """The store's prepare + commit of the big source `rounds` times, each in a fresh process on
    a fresh copy of the store; the median round (by prepare + commit), with every round's figure
    beside it. One probe alone is too noisy to decide the row (267 and 354 ms in two runs of a
    day)."""
    probes = store_probes(store, tmp, sid, last, rounds, quiet_s)
    ordered = sorted(probes, key=lambda p: float(p["prepareCommitMs"]))
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["roundsPrepareCommitMs"] = [round(float(p["prepareCommitMs"]), 1) for p in probes]
    median["roundsBusyCores"] = [[p["busyCoresBefore"], p["busyCoresDuring"]] for p in probes]
    return median


def big_source(
    tmp: Path, turns: int, per_turn: int, forks: int, probes: int = 3, quiet_s: float = 30.0
) -> dict[str, Any]:
    home = tmp / "big"
    t0 = time.monotonic()
    sid, last, thread_id, turn_ids = build_big_source(home, turns, per_turn)
    built = time.monotonic() - t0
    log(f"scale: big source of {turns} turns × {per_turn} messages built in {built:.0f} s")
    runtime_home = home / "runtimes" / WS / sid / "tutti-agent-home"
    bare = bare_fork_at_scale(runtime_home, tmp, thread_id, turn_ids, max(2, forks - 1))
    store_probe = median_store_probe(home / "store.sqlite3", tmp, sid, last, probes, quiet_s)
    if not store_probe["prepareCommitMs"] <= BY_KEY["prepare-commit"].limit:
        # Missed: the same fork again, on a fresh copy, under cProfile.
        again = _copy_store(home / "store.sqlite3", tmp / "big-copy-profiled")
        store_probe["cProfile"] = _run_probe("store-fork-profile", str(again), sid, last)
    daemon = BenchDaemon(home).start()
    lat = []
    try:
        c = daemon.client(timeout=300)
        c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
        before = sample(daemon.pid)
        for _ in range(forks):
            t = time.perf_counter()
            op = fork_until_terminal(c, sid, last)
            lat.append((time.perf_counter() - t) * 1000)
            if op["status"] != "committed":
                raise RuntimeError(f"big-source fork did not commit: {op}")
            acknowledge(c, op["operationId"])
        after = sample(daemon.pid)
    finally:
        daemon.stop()
    assert before is not None and after is not None
    return {
        "turns": turns,
        "messages": turns * per_turn,
        "buildSeconds": built,
        "store": store_probe,
        "firstForkMs": lat[0],
        "endToEnd": Latency.of(lat[1:] or lat),
        "bare": bare,
        "daemonRssBeforeMb": before.rss_mb,
        "daemonPeakGrowthMb": after.hwm_mb - before.rss_mb,
    }


def recovery_and_idle(tmp: Path, operations: int, readers: int, read_s: float) -> dict[str, Any]:
    empty = BenchDaemon(tmp / "empty").start()
    baseline_ready = empty.ready_seconds
    empty.stop()
    home = tmp / "many"
    t0 = time.monotonic()
    sids, ops = build_recovery_store(home, operations)
    built = time.monotonic() - t0
    log(f"scale: {operations} sessions with non-terminal forks built in {built:.0f} s")
    copy = _copy_store(home / "store.sqlite3", tmp / "many-copy")
    recovery = _run_probe("recovery", str(copy))
    daemon = BenchDaemon(home, idle_actor_seconds=2.0).start()
    out: dict[str, Any] = {
        "operations": operations,
        "recoveryInProcessS": recovery["seconds"],
        "recoveryReport": recovery,
        "readySeconds": daemon.ready_seconds,
        "emptyReadySeconds": baseline_ready,
    }
    try:
        s0 = sample(daemon.pid)
        assert s0 is not None
        out["rssAfterStartMb"] = s0.rss_mb
        # Reads first: touching every actor below may exhaust the daemon (see the docs).
        log(f"scale: reads with {readers} clients for {read_s:.0f} s")
        specs = [
            ClientSpec("read", {"ws": WS, "sids": sids[:2000], "ops": ops[:2000], "offset": 97 * i})
            for i in range(readers)
        ]
        profile = TreeProfile(daemon.pid, tmp / "reads.pyspy.txt", use_py_spy=False)
        records = run_clients(daemon.api, specs, read_s, on_start=profile.start)
        profile.stop()
        flat = [r for recs in records for r in recs]
        for kind in ("session.get", "fork.get"):
            out[kind] = Latency.of(latencies(flat, kind))
        out["readErrors"] = sum(1 for r in flat if r["status"] >= 400)
        out["readsPerSecond"] = len(flat) / read_s
        out["readLatency"] = Latency.of(latencies(flat))
        out["readCpuMsPerRequest"] = {
            k: 1000 * v / max(1, len(flat)) for k, v in profile.cpu.items()
        }
        out["readMachineBusyCores"] = profile.machine_busy_cores
        out["readLoadGeneratorCores"] = profile.load_generator_cores
        out["readSpyLines"] = []
        missed = not (
            out["readsPerSecond"] >= BY_KEY["reads-per-s"].limit
            and out["readLatency"].p99 <= BY_KEY["reads-p99"].limit
        )
        if missed and py_spy() is not None:
            # The measured phase ran without the sampler; its profile comes from a second one.
            log("scale: a read target is missed: reads again under py-spy")
            spied = TreeProfile(daemon.pid, tmp / "reads.pyspy.txt")
            run_clients(daemon.api, specs, read_s / 2, on_start=spied.start)
            spied.stop()
            out["readSpyLines"] = spy_lines(spied)
        elif missed:
            out["readSpyLines"] = spy_lines(None)
        # Every Session's actor runs once (a title update), then idles out.
        c = daemon.client(timeout=300)
        log(f"scale: one title update on each of {len(sids)} sessions")
        t = time.monotonic()
        pending: list[Future[Any]] = []
        threads_peak = 0
        errors = 0
        for i, sid in enumerate(sids):
            pending.append(
                c.submit(
                    "session.updateTitle",
                    {"workspaceId": WS, "agentSessionId": sid, "title": f"touched {i}"},
                )
            )
            if len(pending) >= 200:
                errors += sum(1 for f in pending if f.result(300)[0] >= 400)
                pending.clear()
                threads_peak = max(threads_peak, _threads(daemon.pid))
        errors += sum(1 for f in pending if f.result(300)[0] >= 400)
        out["touchErrors"] = errors
        out["touchSeconds"] = time.monotonic() - t
        s1 = sample(daemon.pid)
        assert s1 is not None
        out["rssAfterTouchMb"] = s1.rss_mb
        out["threadsPeak"] = max(threads_peak, _threads(daemon.pid))
        out["fdsAfterTouch"] = _fds(daemon.pid)
        deadline = time.monotonic() + 60
        while _threads(daemon.pid) > 100 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)
        s2 = sample(daemon.pid)
        assert s2 is not None
        out["rssAfterIdleMb"] = s2.rss_mb
        out["peakRssMb"] = s2.hwm_mb
        out["threadsAfterIdle"] = _threads(daemon.pid)
    finally:
        daemon.stop()
    return out


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(mode: Mode) -> BenchResult:
    turns = pick(mode, 1000, 200, 10)
    per_turn = 10
    forks = pick(mode, 6, 3, 2)  # the first one also starts the source's runtime
    operations = pick(mode, 10_000, 1_000, 50)
    readers = pick(mode, 8, 8, 2)
    read_s = pick(mode, 10.0, 4.0, 0.5)
    result = BenchResult("scale", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp_text:
        tmp = Path(tmp_text)
        big = big_source(tmp, turns, per_turn, forks, quiet_s=QUIET_TIMEOUT_S[mode.value])
        many = recovery_and_idle(tmp, operations, readers, read_s)
    st = big["store"]
    result.tables.append(
        Table(
            f"fork of a source of {big['turns']} Turns / {big['messages']} Messages",
            (
                "store prepare ms",
                "store commit ms",
                "prepare+commit ms",
                "store peak growth MB",
                "e2e first fork ms",
                "e2e warm p50 ms",
                "bare read+fork p50 ms",
                "daemon peak growth MB",
            ),
            (
                (
                    st["prepareMs"],
                    st["commitMs"],
                    st["prepareCommitMs"],
                    st["peakGrowthMb"],
                    big["firstForkMs"],
                    big["endToEnd"].p50,
                    big["bare"].p50,
                    big["daemonPeakGrowthMb"],
                ),
            ),
        )
    )
    result.tables.append(
        Table(
            f"{operations} non-terminal operations / {operations} idle Sessions",
            (
                "recovery s (in process)",
                "ready s",
                "ready s (empty store)",
                "RSS start MB",
                "RSS all touched MB",
                "threads peak",
                "open fds",
                "RSS idle again MB",
                "touch errors",
            ),
            (
                (
                    many["recoveryInProcessS"],
                    many["readySeconds"],
                    many["emptyReadySeconds"],
                    many["rssAfterStartMb"],
                    many["rssAfterTouchMb"],
                    many["threadsPeak"],
                    many["fdsAfterTouch"],
                    many["rssAfterIdleMb"],
                    many["touchErrors"],
                ),
            ),
        )
    )
    sg, fg, all_ = many["session.get"], many["fork.get"], many["readLatency"]
    result.tables.append(
        Table(
            f"reads with {readers} clients (one request in flight each), {read_s:.0f} s",
            ("method", "req/s", "p50 ms", "p99 ms"),
            (
                ("session.get", sg.n / read_s, sg.p50, sg.p99),
                ("fork.get", fg.n / read_s, fg.p50, fg.p99),
                ("both", many["readsPerSecond"], all_.p50, all_.p99),
            ),
        )
    )
    result.figures = {"bigSource": big, "many": many}
    prep_lines = [
        f"store prepare {st['prepareMs']:.1f} ms + commit {st['commitMs']:.1f} ms"
        f" (transitions between them {st['transitionsMs']:.1f} ms, not counted)",
    ]
    if "cProfile" in st:
        cp = st["cProfile"]
        prep_lines.append(
            "cProfile of the same probe on a fresh copy (open, prepare, transitions, commit,"
            " close), top self ms:"
        )
        prep_lines += [f"    {ms:8.1f}  ×{calls:<6} {f}" for f, calls, ms in cp["topSelf"][:8]]
        prep_lines.append("top cumulative ms:")
        prep_lines += [
            f"    {ms:8.1f}  ×{calls:<6} {f}" for f, calls, ms in cp["topCumulative"][:8]
        ]
    for key in ("prepare-commit", "36:big-fork"):  # issue 20 (200 ms) and 36 (50 ms)
        result.issue_target(
            key,
            st["prepareCommitMs"],
            measured=f"bench.scale: store prepare + commit of a {big['turns']}-Turn /"
            f" {big['messages']}-Message source, median of"
            f" {len(st['roundsPrepareCommitMs'])} fresh processes {st['roundsPrepareCommitMs']},"
            " each started on a quiet machine (busy cores before / during:"
            f" {st['roundsBusyCores']})",
            profile={"lines": prep_lines, "cProfile": st.get("cProfile")},
        )
    result.target("store peak RSS growth MB", st["peakGrowthMb"], 100, higher_is_better=False)
    recovery_s = many["readySeconds"] - many["emptyReadySeconds"]
    result.target(
        "start-up recovery s (ready − empty ready)", recovery_s, 5.0, higher_is_better=False
    )
    result.target(
        "daemon RSS MB, idle sessions (after start)",
        many["rssAfterStartMb"],
        300,
        higher_is_better=False,
    )
    result.target(
        "daemon RSS MB, idle sessions (each actor ran once, idled out)",
        many["rssAfterIdleMb"],
        300,
        higher_is_better=False,
    )
    read_lines = [
        f"session.get {sg.n / read_s:.0f} req/s p50 {sg.p50:.2f} / p99 {sg.p99:.2f} ms;"
        f" fork.get {fg.n / read_s:.0f} req/s p50 {fg.p50:.2f} / p99 {fg.p99:.2f} ms;"
        f" errors {many['readErrors']}",
        cpu_line(many["readCpuMsPerRequest"], "ms per read"),
        f"machine busy: {many['readMachineBusyCores']:.2f} cores, of which the {readers} load"
        f" clients (bench.loadgen.LeanClient) {many['readLoadGeneratorCores']:.2f}",
        *many["readSpyLines"],
    ]
    read_profile = {"lines": read_lines, "cpuMsPerRequest": many["readCpuMsPerRequest"]}
    measured = f"bench.scale: {readers} clients × {read_s:g} s, one request in flight each"
    result.issue_target(
        "reads-per-s", many["readsPerSecond"], measured=measured, profile=read_profile
    )
    result.issue_target("reads-p99", all_.p99, measured=measured, profile=read_profile)
    if mode is not Mode.FULL:
        result.notes.append(
            f"{mode.value} mode: {turns} turns and {operations} operations, not the issue's "
            "1,000 / 10,000"
        )
    return result


def run_reads_only(mode: Mode) -> BenchResult:
    """Only the read phase (d): the store of `operations` Sessions with one fork operation
    each, a daemon on it, 8 clients alternating `session.get` / `fork.get` (issue 20's
    targets 8-9), with the daemon's CPU per read."""
    operations = pick(mode, 10_000, 2_000, 50)
    readers = pick(mode, 8, 8, 2)
    read_s = pick(mode, 10.0, 4.0, 0.5)
    result = BenchResult("scale-reads", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-scale-reads-") as tmp_text:
        home = Path(tmp_text) / "many"
        sids, ops = build_recovery_store(home, operations)
        daemon = BenchDaemon(home).start()
        try:
            specs = [
                ClientSpec(
                    "read", {"ws": WS, "sids": sids[:2000], "ops": ops[:2000], "offset": 97 * i}
                )
                for i in range(readers)
            ]
            load = os.getloadavg()[0]
            profile = TreeProfile(daemon.pid, Path(tmp_text) / "reads.pyspy.txt", use_py_spy=False)
            records = run_clients(daemon.api, specs, read_s, on_start=profile.start)
            profile.stop()
        finally:
            daemon.stop()
    flat = [r for recs in records for r in recs]
    both = Latency.of(latencies(flat))
    cpu = {k: 1000 * v / max(1, len(flat)) for k, v in profile.cpu.items()}
    result.tables.append(
        Table(
            f"reads with {readers} clients, {read_s:g} s, {operations} Sessions"
            f" (1-min load average at start {load:.2f})",
            ("method", "req/s", "p50 ms", "p99 ms"),
            tuple(
                (kind, lat.n / read_s, lat.p50, lat.p99)
                for kind, lat in (
                    ("session.get", Latency.of(latencies(flat, "session.get"))),
                    ("fork.get", Latency.of(latencies(flat, "fork.get"))),
                    ("both", both),
                )
            ),
        )
    )
    result.notes.append(cpu_line(cpu, "ms per read"))
    result.notes.append(
        f"machine busy: {profile.machine_busy_cores:.2f} cores, of which the {readers} load"
        f" clients (bench.loadgen.LeanClient) {profile.load_generator_cores:.2f}"
        f" ({1000 * profile.load_generator_cores * read_s / max(1, len(flat)):.3f} ms per read)"
    )
    result.notes.append(f"errors {sum(1 for r in flat if r['status'] >= 400)}")
    quick = " --quick" if mode is Mode.QUICK else ""
    result.notes.append(f"command: build/venv/bin/python -m bench.scale --only-reads{quick}")
    result.figures = {
        "readsPerSecond": len(flat) / read_s,
        "cpuMsPerRead": cpu,
        "machineBusyCores": profile.machine_busy_cores,
        "loadGeneratorCores": profile.load_generator_cores,
    }
    return result


def build_store_source(home: Path, turns: int, messages_per_turn: int) -> tuple[str, str]:
    """`build_big_source`'s store side alone (synthetic provider Turn ids, no app-server): what
    the store's prepare + commit read and write is the same."""
    sid = str(uuid.uuid4())
    turn_ids = [f"provider-turn-{i}" for i in range(turns)]
    home.mkdir(parents=True, exist_ok=True)
    return sid, store_big_source(home, sid, f"thread-{sid}", turn_ids, messages_per_turn)


def run_big_fork_only(mode: Mode, rounds: int | None = None, profile: bool = False) -> BenchResult:
    """Only the store's prepare + commit of the big source (issue 20 row 10), `rounds` times,
    each in a fresh process on a fresh copy of the store: wall and CPU ms. `profile`: one more
    round under cProfile, reported beside (its figures are not in the median)."""
    turns = pick(mode, 1000, 1000, 10)
    per_turn = 10
    rounds = max(1, rounds) if rounds is not None else pick(mode, 7, 3, 1)
    profiled: dict[str, Any] | None = None
    result = BenchResult("scale-big-fork", "", mode.value)
    with tempfile.TemporaryDirectory(prefix="bench-scale-big-fork-") as tmp_text:
        tmp = Path(tmp_text)
        t0 = time.monotonic()
        sid, last = build_store_source(tmp / "big", turns, per_turn)
        log(f"scale: store-only source of {turns} turns built in {time.monotonic() - t0:.0f} s")
        load = os.getloadavg()[0]
        probes = store_probes(
            tmp / "big" / "store.sqlite3", tmp, sid, last, rounds, QUIET_TIMEOUT_S[mode.value]
        )
        load_end = os.getloadavg()[0]
        if profile:
            again = _copy_store(tmp / "big" / "store.sqlite3", tmp / "copy-profile")
            profiled = _run_probe("store-fork-profile", str(again), sid, last)
    rows = tuple(
        (
            i + 1,
            p["prepareMs"],
            p["commitMs"],
            p["prepareCommitMs"],
            p["prepareCpuMs"],
            p["commitCpuMs"],
            p["prepareCpuMs"] + p["commitCpuMs"],
            p["transitionsMs"],
            p["busyCoresBefore"],
            p["busyCoresDuring"],
        )
        for i, p in enumerate(probes)
    )
    median = Latency.of(p["prepareCommitMs"] for p in probes).p50
    median_cpu = Latency.of(p["prepareCpuMs"] + p["commitCpuMs"] for p in probes).p50
    result.tables.append(
        Table(
            f"store prepare + commit of a {turns}-Turn / {turns * per_turn}-Message source,"
            f" fresh process per round (1-min load average {load:.2f} at start,"
            f" {load_end:.2f} at end)",
            (
                "round",
                "prepare ms",
                "commit ms",
                "prepare+commit ms",
                "prepare CPU ms",
                "commit CPU ms",
                "prepare+commit CPU ms",
                "transitions ms (not counted)",
                "busy cores before",
                "busy cores during (its own ~1 in)",
            ),
            rows,
        )
    )
    result.notes.append(f"median prepare+commit {median:.1f} ms wall, {median_cpu:.1f} ms CPU")
    quick = {Mode.QUICK: " --quick", Mode.SMOKE: " --smoke"}.get(mode, "")
    extra = f" --rounds {rounds}" if rounds != pick(mode, 7, 3, 1) else ""
    extra += " --profile" if profile else ""
    result.notes.append(
        f"command: build/venv/bin/python -m bench.scale --only-big-fork{quick}{extra}"
    )
    if profiled is not None:
        result.notes.append("cProfile of one more round (not counted), by own time:")
        result.notes.extend(
            f"  {ms:8.2f} ms  {calls:6d}x  {fn}" for fn, calls, ms in profiled["topSelf"]
        )
        result.notes.append("… by cumulative time:")
        result.notes.extend(
            f"  {ms:8.2f} ms  {calls:6d}x  {fn}" for fn, calls, ms in profiled["topCumulative"]
        )
    for key in ("prepare-commit", "36:big-fork"):
        result.issue_target(
            key,
            median,
            measured=f"bench.scale --only-big-fork: median of {rounds} store prepare + commit of"
            f" a {turns}-Turn / {turns * per_turn}-Message source, fresh process each",
        )
    result.figures = {"probes": probes, "loadAverage": [load, load_end]}
    if profiled is not None:
        result.figures["cProfile"] = profiled
    return result


def _take_option(args: list[str], flag: str) -> str | None:
    """Remove `flag VALUE` from `args`; the VALUE, or None when the flag is absent."""
    if flag not in args:
        return None
    at = args.index(flag)
    if at + 1 >= len(args):
        raise SystemExit(f"{flag} needs a value")
    value = args[at + 1]
    del args[at : at + 2]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--only-big-fork" in args:
        args.remove("--only-big-fork")
        rounds_text = _take_option(args, "--rounds")
        profile = "--profile" in args
        if profile:
            args.remove("--profile")
        rounds = None if rounds_text is None else int(rounds_text)
        return bench_main(
            MODULE,
            __doc__ or "",
            lambda mode: run_big_fork_only(mode, rounds=rounds, profile=profile),
            args,
        )
    if "--only-reads" in args:
        args.remove("--only-reads")
        return bench_main(MODULE, __doc__ or "", run_reads_only, args)
    if args[:1] == ["--probe"]:
        kind, rest = args[1], args[2:]
        probes: dict[str, Callable[..., dict[str, Any]]] = {
            "store-fork": probe_store_fork,
            "store-fork-profile": probe_store_fork_profile,
            "recovery": probe_recovery,
        }
        data = probes[kind](*rest)
        print(json.dumps(data))
        return 0
    return bench_main(MODULE, __doc__ or "", run, args)


if __name__ == "__main__":
    sys.exit(main())
