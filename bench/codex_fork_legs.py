"""A Codex fork leg by leg: where a host fork's time goes beyond the bare one.

    build/venv/bin/python -m bench.codex_fork_legs steps [N]   # the worker's fork, more steps
    build/venv/bin/python -m bench.codex_fork_legs host [N]    # bench.fork_overhead, codex only
    build/venv/bin/python -m bench.codex_fork_legs bare [N]    # the bare app-server's own CPU
    build/venv/bin/python -m bench.codex_fork_legs proof [N]   # the proof's CPU, two ways

`steps`: `bench.fork_path`'s in-process trace of the Codex driver's fork (a source of 5 Turns,
N forks a side, in a plain folder) with its source checks, ahead-validation, Turn listing,
release, directories made ahead and every app-server answer timed too. `host`: N host forks
against N bare ones (`bench.fork_overhead.measure`): p50s, stages, CPU a fork per process.
`bare`: the bare side's app-server CPU a fork, from /proc. `proof`: the in-worker readability
proof of one bound child (a real Codex fork of a 5-Turn source, bound by the real binder), its
CPU in N interleaved blocks of 50 proofs: decoding every line, and taking the bind's decoded
lines (`known`, as the driver passes them). A diagnosis driver (no target row):
its figures are quoted in docs/performance.md's Codex fork sections.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench.fork_path as fp


def _codex_steps(driver: Any) -> list[fp.Step]:
    """The Codex fork's steps beyond `fork_path`'s, and each app-server answer."""
    import drivers.binder as binder
    from drivers.app_server.process import AppServerProcess

    forks = driver.forks
    named = ("_source_refused", "_source_cut", "_validate_ahead", "_release")
    labels = ("source refused", "source cut", "ahead", "release")
    steps: list[fp.Step] = [
        (forks, name, lambda *_, label=label: label)
        for name, label in zip(named, labels, strict=True)
    ]
    steps.append((forks.runtimes, "list_turns", lambda *_: "list_turns"))
    steps.append((binder.DirsAhead, "run", lambda *_: "dirs ahead"))
    steps.append((AppServerProcess, "answer", lambda _self, method, *_: f"answer {method}"))
    return steps


def steps(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="codex-legs-") as tmp:
        m = fp._trace_provider("codex", n, 5, Path(tmp), _codex_steps)
    for side in m["cpus"]:
        t = m["traces"][side]
        print(
            f"{side}: wall p50 {statistics.median(m['walls'][side]):.2f} ms, CPU p50"
            f" {statistics.median(m['cpus'][side]):.2f} ms, app-server CPU a fork"
            f" {statistics.mean(m['appServerCpu'][side]):.2f} ms (+ its reaped children"
            f" {statistics.mean(m['appServerReapedCpu'][side]):.2f})"
        )
        print("  calls a fork:", {k: v / n for k, v in t.rpc.items()})
        print(f"  fsyncs a fork: {t.fsync_files / n:.1f} files + {t.fsync_dirs / n:.1f} dirs")
        for k, (w, c) in sorted(t.steps.items()):
            print(f"  {k}: {w / n:.2f} ms wall, {c / n:.2f} ms CPU a fork")


def host(n: int) -> None:
    from bench import fork_overhead as fo
    from bench.providers import PROVIDERS

    entry = next(e for e in PROVIDERS if e.name == "codex")
    with tempfile.TemporaryDirectory(prefix="codex-legs-") as tmp:
        m = fo.measure(entry, Path(tmp) / "codex", 5, n, 3)
    h, b = m["host"], m["bare"]
    print(f"host p50 {h.p50:.2f} ms, bare p50 {b.p50:.2f} ms, host / bare {h.p50 / b.p50:.2f}")
    print("stages p50 ms:", {k: round(v.p50, 2) for k, v in m["stages"].items()})
    forks = max(1, m["forks"])
    print("CPU ms a fork:", {k: round(1000 * v / forks, 2) for k, v in m["cpu"].items()})


def bare(n: int) -> None:
    from bench.providers import PROVIDERS

    entry = next(e for e in PROVIDERS if e.name == "codex")
    with entry.environment() as config, tempfile.TemporaryDirectory(prefix="codex-legs-") as tmp:
        side = entry.bare(Path(tmp) / "bare-home", 5, config)
        try:
            for _ in range(3):
                side.fork_once()
            a0 = fp._proc_cpu_ms(side.proc.pid)
            walls = [side.fork_once() for _ in range(n)]
            a1 = fp._proc_cpu_ms(side.proc.pid)
        finally:
            side.close()
    print(
        f"bare p50 {statistics.median(walls):.2f} ms, app-server CPU a fork"
        f" {(a1[0] - a0[0]) / n:.2f} ms (+ reaped children {(a1[1] - a0[1]) / n:.2f})"
    )


def proof(n: int) -> None:
    from bench.providers import PROVIDERS, BareAppServer
    from drivers.binder import RolloutBinder
    from drivers.codex.lineage import prove_codex_child

    entry = next(e for e in PROVIDERS if e.name == "codex")
    with entry.environment() as config, tempfile.TemporaryDirectory(prefix="codex-legs-") as tmp:
        side = entry.bare(Path(tmp) / "bare-home", 5, config)
        try:
            assert isinstance(side, BareAppServer)
            source, prefix = side.thread_id, list(side.turn_ids)
            params = {"threadId": source, "lastTurnId": prefix[-1], "excludeTurns": True}
            child = str(side.proc.request("thread/fork", params)["thread"]["id"])
        finally:
            side.close()
        target = Path(tmp) / "target" / "codex-home"
        receipt = RolloutBinder().bind(Path(tmp) / "bare-home", target, child)
        decoded: list[float] = []
        taken: list[float] = []
        for _ in range(n):
            for known, out in ((None, decoded), (receipt.parsed, taken)):
                c0 = time.process_time()
                for _ in range(50):
                    if prove_codex_child(target, child, source, prefix, known) is not None:
                        raise RuntimeError("the bound child is not proven readable")
                out.append((time.process_time() - c0) * 1000.0 / 50)
    lower = sum(b < a for a, b in zip(decoded, taken, strict=True))
    print(
        f"proof CPU p50: every line decoded {statistics.median(decoded):.3f} ms, the bind's"
        f" lines taken {statistics.median(taken):.3f} ms; lower in {lower} of {n} blocks"
    )


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "steps"
    n = int(argv[1]) if len(argv) > 1 else 15
    {"steps": steps, "host": host, "bare": bare, "proof": proof}[mode](n)
    print(f"command: build/venv/bin/python -m bench.codex_fork_legs {mode} {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
