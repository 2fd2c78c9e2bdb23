"""Where the provider side of the months cold fork spends its CPU, by step and by function:
tutti-agent's app-server and the worker's bind and proof of a fork through the last Turn of
the months store's 10,000-Turn thread, in ONE process (no daemon), each step's thread profiled
by `cProfile` on its own CPU clock (`time.thread_time`), the collector held off as the fork
holds it.

The steps are those of a real cold fork (`drivers.app_server.fork`, `tutti_agent.server`), in
their order, each run to its end before the next (what runs beside another on 2 cores in the
daemon's tree runs alone here, so each step's CPU is its own):

- app-server: `thread/resume` without turns (answered from the head), its deferred load (the
  history parsed and made live), the `prewarm` thread's lean reduction, the source's lean
  `thread/read`, the `thread/fork` through the last Turn (`loaded: false`, `turnItems: false`);
- worker: `RolloutBinder.validate_ahead` of the source (its body kept as a span), the bind of
  the child (`begin`: plan, parse taking the span, the file written and fsynced), the proof's
  derivations (`derive_for_proof`), the names' syncs, the readability proof
  (`prove_tutti_child`).

    AGENTHOST_BENCH_CACHE=... PYTHONPATH=$TREE build/venv/bin/python -m bench.tutti_fork_profile \\
        --scale 1 [--top 12] [--rounds 3] [--only app|worker]

`--rounds N` repeats the whole fork in fresh homes (a fresh app-server and binder each round:
every round is a cold fork) and prints each step's median CPU; the functions are those of the
last round. Run from one tree with another tree's code first on `PYTHONPATH`, it times that
tree's code: an A/B of the provider side by the CPU clock.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.common import cpu_probe_ms
from bench.harness import WS
from bench.months import SESSION, Size, _id, cached_home

MODULE = "bench.tutti_fork_profile"

Step = tuple[str, float, pstats.Stats | None]


class _Profiled:
    """Each thread started while it is on whose name begins with one of `prefixes` runs under
    a `cProfile.Profile` of its own on the thread's CPU clock; `(name, cpu ms, stats)` kept."""

    def __init__(self, prefixes: tuple[str, ...], steps: list[Step], profile: bool = True) -> None:
        self.prefixes = prefixes
        self.profile = profile
        self.steps = steps
        self._run = threading.Thread.run
        self._lock = threading.Lock()

    def __enter__(self) -> _Profiled:
        outer = self

        def run(thread: threading.Thread) -> None:
            if not thread.name.startswith(outer.prefixes):
                outer._run(thread)
                return
            prof = cProfile.Profile(time.thread_time) if outer.profile else None
            cpu = time.thread_time()
            if prof is not None:
                prof.enable()
            try:
                outer._run(thread)
            finally:
                if prof is not None:
                    prof.disable()
                cpu = time.thread_time() - cpu
                got = None if prof is None else _stats(prof)
                with outer._lock:
                    outer.steps.append((thread.name.split("-")[0], cpu * 1000, got))

        threading.Thread.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        threading.Thread.run = self._run  # type: ignore[method-assign]


def _stats(prof: cProfile.Profile) -> pstats.Stats:
    return pstats.Stats(prof, stream=io.StringIO())


def _timed(steps: list[Step], name: str, call: Callable[[], Any], profile: bool = True) -> Any:
    prof = cProfile.Profile(time.thread_time) if profile else None
    cpu = time.thread_time()
    if prof is not None:
        prof.enable()
    try:
        return call()
    finally:
        if prof is not None:
            prof.disable()
        steps.append(
            (name, (time.thread_time() - cpu) * 1000, None if prof is None else _stats(prof))
        )


def one_fork(rollout: Path, only: str | None, profile: bool = True) -> list[Step]:
    """The provider side of one cold fork of the thread of `rollout` (see the docstring)."""
    import gc

    import tutti_agent
    from drivers.app_server.fork import _DeriveForProof
    from drivers.binder import RolloutBinder
    from drivers.tutti_agent import TuttiAgentProvider, prove_tutti_child
    from tutti_agent.model import BuiltinModel
    from tutti_agent.rollout import gc_paused
    from tutti_agent.server import AppServer
    from tutti_agent.store import ThreadStore

    thread_id = rollout.name[-len(".jsonl") - 36 : -len(".jsonl")]
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="tutti-fork-profile-") as tmp:
        runtime_home, target_home = Path(tmp) / "runtime", Path(tmp) / "target"
        copy = runtime_home / "sessions" / rollout.name
        copy.parent.mkdir(parents=True)
        target_home.mkdir()
        shutil.copyfile(rollout, copy)
        os.sync()
        out = io.StringIO()
        server = AppServer(ThreadStore(runtime_home), BuiltinModel(), out)
        answers: list[dict[str, Any]] = []
        answer_bytes: dict[str, int] = {}

        def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
            out.seek(0)
            out.truncate()
            server.handle_line(
                json.dumps({"id": len(answers) + 1, "method": method, "params": params})
            )
            text = out.getvalue().split("\n", 1)[0]
            answer_bytes[method] = len(text.encode())
            answer: dict[str, Any] = orjson.loads(text)
            if "error" in answer:
                raise SystemExit(f"{method}: {answer['error']}")
            answers.append(answer)
            return answer

        ask("initialize", {"clientInfo": {"name": MODULE, "version": "0"}})
        gc.collect()
        app = profile and only in (None, "app")
        with _Profiled(("prewarm", "validate-ahead", "derive-for-proof"), steps, profile):
            # The deferred load runs in `handle_line` after the answer is written (`Reply.then`).
            _timed(
                steps,
                "app: resume + deferred load",
                lambda: ask("thread/resume", {"threadId": thread_id, "excludeTurns": True}),
                app,
            )
            for t in threading.enumerate():
                if t.name.startswith("prewarm"):
                    t.join()
            # As the worker asks (`TuttiAgentProvider.turn_columns`: the turns as columns).
            columns = bool(getattr(TuttiAgentProvider, "turn_columns", False))
            lean = {"includeTurns": True, "turnItems": False}
            if columns:
                lean["turnColumns"] = True
            read = _timed(
                steps,
                "app: source read",
                lambda: ask("thread/read", {"threadId": thread_id, **lean}),
                app,
            )
            source = read["result"]["thread"]
            prefix = list(source["turnIds"]) if columns else [str(t["id"]) for t in source["turns"]]
            fork = {
                "threadId": thread_id,
                "lastTurnId": prefix[-1],
                "loaded": False,
                "turnItems": False,
            }
            if columns:
                fork["turnColumns"] = True
            answer = _timed(steps, "app: thread/fork", lambda: ask("thread/fork", fork), app)
            child_id = str(answer["result"]["thread"]["id"])
            wk = profile and only in (None, "worker")
            binder = RolloutBinder()
            derived = _DeriveForProof(TuttiAgentProvider({}))
            litter: list[object] = []
            with gc_paused():
                ahead = binder.start_ahead(runtime_home, thread_id)
                if ahead is not None:
                    ahead.join()
                receipt, names = _timed(
                    steps,
                    "worker: bind (begin)",
                    lambda: binder.begin(
                        str(runtime_home), str(target_home), child_id, planned=derived.start
                    ),
                    wk,
                )
                derived.join()
                _timed(steps, "worker: names' syncs (wait)", names.wait, wk)
                problem = _timed(
                    steps,
                    "worker: proof",
                    lambda: prove_tutti_child(
                        target_home,
                        child_id,
                        thread_id,
                        prefix,
                        tutti_agent.__version__,
                        receipt.parsed,
                        litter=litter,
                    ),
                    wk,
                )
                if problem is not None:
                    raise SystemExit(f"the proof failed: {problem}")
        server.shutdown()
    print(
        "answer bytes: "
        + ", ".join(f"{m} {n:,}" for m, n in answer_bytes.items() if m.startswith("thread/")),
        file=sys.stderr,
    )
    order = {
        "app: resume + deferred load": 0,
        "prewarm": 1,
        "app: source read": 2,
        "app: thread/fork": 3,
        "validate": 4,
        "worker: bind (begin)": 5,
        "derive": 6,
        "worker: names' syncs (wait)": 7,
        "worker: proof": 8,
    }
    names = {
        "prewarm": "app: prewarm (lean turns)",
        "validate": "worker: validate ahead",
        "derive": "worker: derive for proof",
    }
    steps.sort(key=lambda s: order.get(s[0], 99))
    return [(names.get(n, n), cpu, st) for n, cpu, st in steps]


def _top(stats: pstats.Stats, top: int) -> str:
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(line for line in lines[start:] if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.add_argument("--scale", type=float, default=0.001)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--only", choices=("app", "worker"), default=None)
    ap.add_argument(
        "--no-profile",
        action="store_true",
        help="no cProfile: each step's CPU alone (the numbers to compare between trees)",
    )
    args = ap.parse_args(argv)
    home = cached_home(Size.of(args.scale))
    rollout = next((home / "runtimes" / WS / _id(SESSION, 0)).rglob("rollout-*.jsonl"))
    load, probe = os.getloadavg()[0], cpu_probe_ms()
    print(f"# 1-min load {load:.2f}, CPU probe {probe:.1f} ms; {rollout.stat().st_size:,} bytes")
    rounds = [one_fork(rollout, args.only, not args.no_profile) for _ in range(args.rounds)]
    print(f"{'step':36} {'CPU ms (median of ' + str(args.rounds) + ')':>22}  each")
    total = []
    for i, (name, _, _) in enumerate(rounds[-1]):
        each = [r[i][1] for r in rounds]
        print(f"{name:36} {statistics.median(each):22.1f}  {' '.join(f'{c:.1f}' for c in each)}")
    for r in rounds:
        total.append(sum(c for _, c, _ in r))
    print(
        f"{'all steps':36} {statistics.median(total):22.1f}  {' '.join(f'{c:.1f}' for c in total)}"
    )
    if args.top:
        for name, cpu, stats in rounds[-1]:
            if stats is not None:
                print(f"\n## {name}: {cpu:.1f} ms (profiled)\n{_top(stats, args.top)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
