"""Benchmark 6 (issue 20): two costs on the fork path, each measured against what replaced it,
interleaved sample by sample so both sides see the same machine load.

1. **Readability proof** of a bound tutti-agent fork child: the in-worker proof the driver now
   makes (`drivers.readability.prove_tutti_child`: tutti_agent's own `ThreadStore` load of the
   child's lineage from the target home + its turn reduction) vs the former proof (spawn a
   `tutti-agent app-server` on the target home, `initialize`, `thread/read` with turns, close).
   The child is a real Referenced fork of a real source of N turns, bound by the real binder.
2. **Codex launch**: spawn → `initialize` answered, through the npm `node` wrapper
   (`node_modules/.bin/codex`) vs the native binary the driver now resolves behind it
   (`drivers.codex.native_behind_npm_shim`); CPU per launch from the reaped children's rusage.

Each side reports p50/p99 ms and CPU ms per sample (the children's CPU for spawns; this
process's CPU for the in-worker proof). Nothing here asserts a target: issue 20's targets are
whole-fork figures (benchmark 1); this one shows where those gains come from.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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
    from drivers.app_server import AppServerProcess, private_env
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
    from drivers.app_server import JsonRpcError

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
    from drivers.app_server import AppServerProcess, private_env
    from drivers.readability import prove_tutti_child

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
    from drivers.app_server import AppServerProcess, private_env
    from drivers.codex import PINNED_PREFIX, native_behind_npm_shim

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


def _rows(
    label: str, walls: dict[str, list[float]], cpus: dict[str, list[float]], old: str, new: str
) -> list[tuple[Any, ...]]:
    rows = []
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
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
