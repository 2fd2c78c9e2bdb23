"""Benchmark 6 (issue 20): two costs on the fork path, each measured against what replaced it,
interleaved sample by sample so both sides see the same machine load.

1. **Readability proof** of a bound tutti-agent fork child: the in-worker proof the driver now
   makes (`drivers.tutti_agent.prove_tutti_child`: tutti_agent's own `ThreadStore` load of the
   child's lineage from the target home + its turn reduction) vs the former proof (spawn a
   `tutti-agent app-server` on the target home, `initialize`, `thread/read` with turns, close).
   The child is a real Referenced fork of a real source of N turns, bound by the real binder.
2. **Codex launch**: spawn → `initialize` answered, through the npm `node` wrapper
   (`node_modules/.bin/codex`) vs the native binary the driver now resolves behind it
   (`drivers.codex.native_behind_npm_shim`); CPU per launch from the reaped children's rusage.

3. **The worker's fork, traced**: the real driver (tutti-agent's or Codex's) in this
   process, as the worker runs it, forking a live 10-turn source N times into fresh target
   homes: wall and CPU ms per step (the source read, `thread/fork`, the binder, the
   readability proof), JSON-RPC calls and fsyncs per fork, app-servers spawned, and the CPU
   of the source's app-server (and of the children it reaped) per fork. Two sides,
   interleaved: `reread` (the source's turns read before every fork, as before issue 20's
   verified-read reuse: the Session's history generation bumped before each fork) and
   `reuse` (what the driver does now for an unchanged source). The source works in a small
   folder of its own, as the daemon's Sessions do (`BenchDaemon.workdir`), not in the
   checkout: Codex's `thread/fork` collects a child's git info in its cwd (~12 `git`
   processes, ~35 ms a fork in a git work tree against ~16 in a plain folder).

Each side reports p50/p99 ms and CPU ms per sample (the children's CPU for spawns; this
process's CPU for the in-worker proof). Nothing here asserts a target: issue 20's targets are
whole-fork figures (benchmark 1); this one shows where those gains come from.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Latency, Mode, Table, bench_main, log, pick, ratio

MODULE = "bench.fork_path"


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000.0


def _self_cpu_ms() -> float:
    return time.process_time() * 1000.0


def _timed(fn: Callable[[], Any], cpu: Callable[[], float]) -> tuple[float, float]:
    c0, t0 = cpu(), time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0, cpu() - c0


def _tutti_child(root: Path, turns: int) -> tuple[Path, str, str, list[str]]:
    """A real source of `turns` turns, a Referenced fork through its last turn, bound into
    `root/target` by the real binder: (target home, child id, source id, prefix)."""
    from drivers.app_server.process import AppServerProcess, private_env
    from drivers.binder import RolloutBinder

    tutti = str(Path(sys.executable).parent / "tutti-agent")
    home = root / "source"
    server = AppServerProcess(
        [tutti, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", home)
    )
    server.start()
    try:
        server.initialize("bench", "0")
        thread = server.request("thread/start", {"cwd": str(root)})["thread"]["id"]
        prefix: list[str] = []
        for i in range(turns):
            done = _run_turn(server, thread, f"turn {i}")
            prefix.append(done)
        child = server.request(
            "thread/fork",
            {"threadId": thread, "lastTurnId": prefix[-1], "persistence": "referenced"},
        )["thread"]["id"]
    finally:
        server.close()
    target = root / "target"
    RolloutBinder().bind(home, target, child)
    return target, child, thread, prefix


def _run_turn(server: Any, thread: str, text: str) -> str:
    """`turn/start`, then poll `thread/read` until that turn is no longer in progress.

    `thread/read` can show the previous turn settled a moment before the server lets the
    thread take the next one (seen under heavy load): `turn/start` is retried for that."""
    from drivers.app_server.process import JsonRpcError

    params = {"threadId": thread, "input": [{"type": "text", "text": text, "text_elements": []}]}
    deadline = time.monotonic() + 30
    while True:
        try:
            started = server.request("turn/start", params)
            break
        except JsonRpcError as exc:
            if "already has an active turn" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    turn_id = str(started["turn"]["id"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        read = server.request("thread/read", {"threadId": thread, "includeTurns": True})
        status = {t["id"]: t["status"] for t in read["thread"]["turns"]}
        if status.get(turn_id) not in (None, "inProgress"):
            return turn_id
        time.sleep(0.01)
    raise TimeoutError(f"turn {turn_id} did not settle")


def _proof_samples(n: int, turns: int) -> dict[str, Any]:
    import tutti_agent
    from drivers.app_server.process import AppServerProcess, private_env
    from drivers.tutti_agent import prove_tutti_child

    tutti = str(Path(sys.executable).parent / "tutti-agent")
    with tempfile.TemporaryDirectory(prefix="bench-proof-") as tmp:
        target, child, source, prefix = _tutti_child(Path(tmp), turns)

        def in_worker() -> None:
            problem = prove_tutti_child(target, child, source, prefix, tutti_agent.__version__)
            assert problem is None, problem

        def spawned() -> None:
            reader = AppServerProcess(
                [tutti, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", target)
            )
            reader.start()
            try:
                reader.initialize("bench", "0")
                read = reader.request("thread/read", {"threadId": child, "includeTurns": True})
                assert [t["id"] for t in read["thread"]["turns"]] == prefix
            finally:
                reader.close()

        # Untimed warm-up of each side: a worker imports the reader once in its lifetime, and
        # the first spawn pays for cold page-cache reads of the interpreter's files.
        in_worker()
        spawned()
        walls: dict[str, list[float]] = {"in_worker": [], "app_server": []}
        cpus: dict[str, list[float]] = {"in_worker": [], "app_server": []}
        for i in range(n):
            if i % 10 == 0:
                log(f"proof sample {i + 1}/{n}")
            for name, fn, cpu in (
                ("in_worker", in_worker, _self_cpu_ms),
                ("app_server", spawned, _children_cpu_ms),
            ):
                wall, used = _timed(fn, cpu)
                walls[name].append(wall)
                cpus[name].append(used)
    return {"walls": walls, "cpus": cpus}


def _launch_samples(n: int) -> dict[str, Any] | str:
    from drivers.app_server.process import AppServerProcess, private_env
    from drivers.codex.command import PINNED_PREFIX, native_behind_npm_shim

    shim = PINNED_PREFIX / "node_modules" / ".bin" / "codex"
    if not shim.exists() or shutil.which("node") is None:
        return f"Codex npm install (with node) not found at {shim}; run `make providers`"
    native = native_behind_npm_shim(str(shim))
    if native is None:
        return f"no native Codex binary behind {shim}"
    launchers = {"npm_wrapper": [str(shim)], "native": [str(native)]}
    walls: dict[str, list[float]] = {k: [] for k in launchers}
    cpus: dict[str, list[float]] = {k: [] for k in launchers}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        home = Path(tmp) / "codex-home"
        home.mkdir()
        env = private_env(None, "CODEX_HOME", home)
        for argv in launchers.values():  # untimed warm-up: page cache, node's compile cache
            warm = AppServerProcess([*argv, "app-server"], env=env, cwd=str(home))
            warm.start()
            try:
                warm.initialize("bench", "0")
            finally:
                warm.close()
        for i in range(n):
            if i % 10 == 0:
                log(f"launch sample {i + 1}/{n}")
            for name, argv in launchers.items():
                proc = AppServerProcess([*argv, "app-server"], env=env, cwd=str(home))
                c0, t0 = _children_cpu_ms(), time.perf_counter()
                proc.start()
                try:
                    proc.initialize("bench", "0")
                    walls[name].append((time.perf_counter() - t0) * 1000.0)
                finally:
                    proc.close()
                cpus[name].append(_children_cpu_ms() - c0)
    return {"walls": walls, "cpus": cpus, "argv": launchers}


class _Trace:
    """What the in-process driver did during one side's traced forks."""

    def __init__(self) -> None:
        self.rpc: dict[str, int] = {}
        self.fsync_files = 0
        self.fsync_dirs = 0
        self.steps: dict[str, list[float]] = {}  # step -> [wall ms, cpu ms]


class _Tracer:
    """Counts and times into the active side's `_Trace` (None: not counting). The wrappers
    only observe: every wrapped call still happens."""

    def __init__(self) -> None:
        self.active: _Trace | None = None

    def count_rpc(self, method: str) -> None:
        if self.active is not None:
            self.active.rpc[method] = self.active.rpc.get(method, 0) + 1

    def count_fsync(self, is_dir: bool) -> None:
        if self.active is not None:
            if is_dir:
                self.active.fsync_dirs += 1
            else:
                self.active.fsync_files += 1

    def add(self, step: str, wall_ms: float, cpu_ms: float) -> None:
        if self.active is not None:
            acc = self.active.steps.setdefault(step, [0.0, 0.0])
            acc[0] += wall_ms
            acc[1] += cpu_ms


def _proc_cpu_ms(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU ms of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = 1000.0 / os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) * tick, (int(fields[13]) + int(fields[14])) * tick


Step = tuple[Any, str, Callable[..., str]]
"""A callable to time as a step: (owner, attribute name, its label from the call's arguments)."""


def timed_step(real: Any, tracer: _Tracer, label: Callable[..., str]) -> Any:
    """`real`, adding each call's wall and CPU ms to `tracer` under `label(*args)`."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            wall = (time.perf_counter() - t0) * 1000.0
            tracer.add(label(*args), wall, (time.process_time() - c0) * 1000.0)

    return timed


@contextlib.contextmanager
def _instrumented(driver: Any, tracer: _Tracer, more: Sequence[Step] = ()) -> Iterator[None]:
    """The driver's fork steps (and `more`), its app-server client and `os.fsync`, wrapped
    while inside."""
    import stat

    from drivers.app_server.process import AppServerProcess

    undo: list[Callable[[], None]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        real = getattr(owner, name)
        setattr(owner, name, make(real))
        undo.append(lambda: setattr(owner, name, real))

    def rpc(real: Any) -> Any:
        def request_async(self: Any, method: str, params: Any) -> Any:
            tracer.count_rpc(method)
            return real(self, method, params)

        return request_async

    def fsync(real: Any) -> Any:
        def counted(fd: int) -> None:
            tracer.count_fsync(stat.S_ISDIR(os.fstat(fd).st_mode))
            real(fd)

        return counted

    def step(label: str) -> Callable[[Any], Any]:
        return lambda real: timed_step(real, tracer, lambda *_: label)

    patch(AppServerProcess, "request_async", rpc)
    patch(os, "fsync", fsync)
    # The fork steps live in the driver's fork part (`ForkThroughTurn`), the binder is shared.
    forks = driver.forks
    patch(forks, "_source_turns", step("source read"))
    # `begin`: the bind up to its names' round, which runs beside the proof (the fork waits
    # for it after the proof; that wait is in the fork's total, not in a step).
    patch(forks.binder, "begin", step("bind"))
    patch(forks, "_prove_readable", step("proof"))
    for owner, name, label in more:
        patch(owner, name, lambda real, label=label: timed_step(real, tracer, label))
    try:
        yield
    finally:
        for fn in reversed(undo):
            fn()


def _driver_for(provider: str, model_config: dict[str, str]) -> Any:
    from drivers.failpoints import Failpoints

    if provider == "tutti-agent":
        from drivers.tutti_agent import create_driver

        return create_driver({}, Failpoints())
    from drivers.codex.driver import create_driver as codex_driver

    return codex_driver(dict(model_config), Failpoints())


def _trace_provider(
    provider: str,
    n: int,
    turns: int,
    root: Path,
    more_steps: Callable[[Any], Sequence[Step]] = lambda _driver: (),
) -> dict[str, Any]:
    """N forks per side of one live source, in this process; the sides alternate. The
    driver's `more_steps(driver)` are timed too."""
    from bench.providers import _codex_environment
    from domain.worker_messages import ForkRequest
    from tests.support.events import EventLog, completed

    env: Any = _codex_environment() if provider == "codex" else contextlib.nullcontext({})
    with env as model_config:
        driver = _driver_for(provider, model_config)
        try:
            home = root / provider / "runtimes" / "source" / "home"
            work = root / provider / "work"  # not a git work tree (see the module's docstring)
            work.mkdir(parents=True, exist_ok=True)
            started = driver.start_session(
                {"agentSessionId": "source", "home": str(home), "cwd": str(work), "settings": {}}
            )
            events = EventLog()
            prefix = []
            for i in range(turns):
                done = driver.start_turn(
                    {"agentSessionId": "source", "turnId": f"T{i}", "text": f"turn {i}"}, events
                )
                events.wait_for(completed(f"T{i}"), timeout=120)
                prefix.append(str(done["providerTurnId"]))
            session = driver._sessions["source"]
            app_server = session.runtime.proc.pid
            version = started["runtimeContext"]["driverVersion"]

            def request(i: int) -> ForkRequest:
                return ForkRequest.from_wire(
                    {
                        "source": {
                            "agentSessionId": "source",
                            "providerSessionId": started["providerSessionId"],
                            "home": str(home),
                            "cwd": str(work),
                        },
                        "target": {
                            "agentSessionId": f"child-{i}",
                            "home": str(root / provider / "runtimes" / f"child-{i}" / "home"),
                        },
                        "providerTurnIds": prefix,
                        "title": "child",
                        "driverKind": provider,
                        "driverVersion": version,
                    }
                )

            traces = {"reread": _Trace(), "reuse": _Trace()}
            walls: dict[str, list[float]] = {k: [] for k in traces}
            cpus: dict[str, list[float]] = {k: [] for k in traces}
            app_cpu: dict[str, list[float]] = {k: [] for k in traces}
            reaped: dict[str, list[float]] = {k: [] for k in traces}
            spawned = {k: 0 for k in traces}
            tracer = _Tracer()
            count = 0
            with _instrumented(driver, tracer, more_steps(driver)):
                for i in range(n + 1):  # the first round is an untimed warm-up
                    for side, trace in traces.items():
                        count += 1
                        if side == "reread":
                            session.history_changed()  # as if the source had changed
                        spawns0 = getattr(driver, "spawns", 0)
                        a0 = _proc_cpu_ms(app_server)
                        tracer.active = trace if i > 0 else None
                        c0, t0 = time.process_time(), time.perf_counter()
                        result = driver.fork(request(count))
                        wall = (time.perf_counter() - t0) * 1000.0
                        cpu = (time.process_time() - c0) * 1000.0
                        tracer.active = None
                        a1 = _proc_cpu_ms(app_server)
                        if result.disposition.value != "accepted":
                            raise RuntimeError(f"{provider} fork not accepted: {result.error}")
                        if i > 0:
                            walls[side].append(wall)
                            cpus[side].append(cpu)
                            app_cpu[side].append(a1[0] - a0[0])
                            reaped[side].append(a1[1] - a0[1])
                            spawned[side] += getattr(driver, "spawns", 0) - spawns0
            return {
                "walls": walls,
                "cpus": cpus,
                "appServerCpu": app_cpu,
                "appServerReapedCpu": reaped,
                "spawns": spawned,
                "traces": traces,
                "n": n,
            }
        finally:
            driver.close()


def _trace_rows(provider: str, m: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    n = max(1, m["n"])
    for side, trace in m["traces"].items():
        rpc = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(trace.rpc.items()))
        steps = ", ".join(
            f"{k} {w / n:.1f}/{c / n:.1f}" for k, (w, c) in sorted(trace.steps.items())
        )
        rows.append(
            (
                provider,
                side,
                m["n"],
                Latency.of(m["walls"][side]).p50,
                Latency.of(m["cpus"][side]).p50,
                Latency.of(m["appServerCpu"][side]).mean,
                Latency.of(m["appServerReapedCpu"][side]).mean,
                rpc,
                f"{trace.fsync_files / n:.1f} + {trace.fsync_dirs / n:.1f}",
                m["spawns"][side],
                steps,
            )
        )
    return rows


def _rows(
    label: str, walls: dict[str, list[float]], cpus: dict[str, list[float]], old: str, new: str
) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for name in (old, new):
        lat = Latency.of(walls[name])
        cpu = Latency.of(cpus[name])
        rows.append((label, name, lat.n, lat.p50, lat.p99, cpu.p50))
    before, after = Latency.of(walls[old]).p50, Latency.of(walls[new]).p50
    rows.append((label, f"{new} / {old} (p50)", "", ratio(after, before), "", ""))
    return rows


def run(mode: Mode) -> BenchResult:
    n = pick(mode, 60, 15, 2)
    turns = pick(mode, 10, 10, 2)
    result = BenchResult("fork path costs (issue 20)", "", mode.value)
    result.figures["loadAverage1mAtStart"] = round(os.getloadavg()[0], 2)
    rows: list[tuple[Any, ...]] = []
    log(f"readability proof: {n} samples per side, source of {turns} turns")
    proof = _proof_samples(n, turns)
    rows += _rows("tutti-agent proof", proof["walls"], proof["cpus"], "app_server", "in_worker")
    result.figures["proof"] = {
        k: {"wallMs": Latency.of(proof["walls"][k]), "cpuMs": Latency.of(proof["cpus"][k])}
        for k in proof["walls"]
    }
    log(f"codex launch: {n} samples per launcher")
    launch = _launch_samples(n)
    if isinstance(launch, str):
        result.notes.append(launch)
    else:
        rows += _rows("codex launch", launch["walls"], launch["cpus"], "npm_wrapper", "native")
        result.figures["launch"] = {
            k: {"wallMs": Latency.of(launch["walls"][k]), "cpuMs": Latency.of(launch["cpus"][k])}
            for k in launch["walls"]
        }
        result.figures["launchArgv"] = launch["argv"]
    result.tables.append(
        Table("costs", ("what", "side", "n", "p50 ms", "p99 ms", "CPU ms p50"), tuple(rows))
    )
    trace_rows: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        for provider in ("tutti-agent", "codex"):
            if provider == "codex":
                from bench.providers import _codex_unavailable

                why = _codex_unavailable()
                if why is not None:
                    result.notes.append(f"worker trace, codex: {why}")
                    continue
            log(f"worker fork trace: {provider}, {n} forks per side, source of {turns} turns")
            m = _trace_provider(provider, n, turns, Path(tmp))
            trace_rows += _trace_rows(provider, m)
            result.figures[f"trace:{provider}"] = {
                side: {
                    "wallMs": Latency.of(m["walls"][side]),
                    "workerCpuMs": Latency.of(m["cpus"][side]),
                    "appServerCpuMsMean": Latency.of(m["appServerCpu"][side]).mean,
                    "appServerReapedCpuMsMean": Latency.of(m["appServerReapedCpu"][side]).mean,
                    "rpcPerFork": {k: v / m["n"] for k, v in m["traces"][side].rpc.items()},
                    "fsyncsPerFork": {
                        "files": m["traces"][side].fsync_files / m["n"],
                        "dirs": m["traces"][side].fsync_dirs / m["n"],
                    },
                    "spawns": m["spawns"][side],
                    "stepsMsPerFork": {
                        k: {"wall": w / m["n"], "cpu": c / m["n"]}
                        for k, (w, c) in m["traces"][side].steps.items()
                    },
                }
                for side in m["walls"]
            }
    result.tables.append(
        Table(
            "the worker's fork, traced (in-process driver; wall/CPU ms; app-server CPU ms per"
            " fork, mean; fsyncs files + dirs; steps wall/CPU ms)",
            (
                "provider",
                "side",
                "n",
                "wall p50",
                "worker CPU p50",
                "app-server CPU",
                "its reaped children",
                "JSON-RPC per fork",
                "fsyncs per fork",
                "spawns",
                "steps",
            ),
            tuple(trace_rows),
        )
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
