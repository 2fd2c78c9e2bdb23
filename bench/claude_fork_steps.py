"""The Claude Code driver's fork, step by step, in this process (issue 36 target 1).

A warm 10-Turn source made with the pinned SDK (`bench.providers.BareClaude`, the fake model
the only fake), forked N times by the driver's own fork strategy (`ClaudeFork`) into fresh
target homes, two ways alternating fork by fork so both see the same machine:

- `steps`: the steps `ClaudeFork.fork` takes, one after another, each timed — plan,
  `fork_session`, the move (`relocate_child`: the file's fsync, the rename, the directories'
  round), the verification from the child's home;
- `fork`: `ClaudeFork.fork` itself, as the worker runs it (the same steps; the pair's
  difference is the timing's own cost and the machine's noise);

and the bare provider calls (`fork_session` + the SDK's read of the child,
`BareClaude.fork_once`, what `bench.fork_overhead` times as bare) in the same loop. The
interpreter's switch interval is the worker's under the Claude driver. Not a benchmark of
record: the split is what it is for (docs/performance.md, "hostfork": a move made beside
the verification, and the directories made during `fork_session`, measured with it and
dropped).

    PYTHONPATH=<tree> build/venv/bin/python -m bench.claude_fork_steps --forks 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms


def run(forks: int, turns: int) -> dict[str, Any]:
    from bench.providers import _claude_bare, _claude_environment, _claude_unavailable
    from domain.worker_messages import ForkRequest
    from drivers.claude.env import sdk_version
    from drivers.claude.fork import ClaudeFork
    from drivers.claude_transcript import encode_binding
    from drivers.failpoints import Failpoints

    why = _claude_unavailable()
    if why is not None:
        raise SystemExit(f"claude-code: {why}")
    # As in the worker, where the Claude driver shortens the interpreter's switch interval.
    from drivers.claude.driver import SWITCH_INTERVAL_S

    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    probe = cpu_probe_ms()
    walls: dict[str, list[float]] = {"steps": [], "fork": [], "bare": []}
    steps: dict[str, list[float]] = {}
    with _claude_environment() as config, tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        bare = _claude_bare(tmp / "source", turns, config)
        assert bare.checkpoint is not None
        forks_ = ClaudeFork(Failpoints(), threading.Lock())
        count = 0

        def request() -> ForkRequest:
            nonlocal count
            count += 1
            return ForkRequest.from_wire(
                {
                    "source": {
                        "agentSessionId": "source",
                        "providerSessionId": bare.session_id,
                        "home": str(bare.config_dir),
                        "cwd": str(bare.cwd),
                    },
                    "target": {
                        "agentSessionId": f"child-{count}",
                        "home": str(tmp / "runtimes" / f"child-{count}" / "home"),
                    },
                    "providerTurnIds": list(bare.turn_ids),
                    "providerTurnBindings": [encode_binding(bare.checkpoint)] * len(bare.turn_ids),
                    "title": "child",
                    "driverKind": "claude-code",
                    "driverVersion": sdk_version(),
                }
            )

        def timed(step: str, fn: Any, *args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                steps.setdefault(step, []).append((time.perf_counter() - t0) * 1000.0)

        def stepwise() -> str:
            req = request()
            plan = timed("plan", forks_.plan_fork, req)
            child = timed("fork_session", forks_.call_fork_session, req, plan)
            timed("move, waited", forks_.relocate_child, req, plan, child)
            result = timed("verify", forks_.verify_child, req, plan, child)
            return str(result.disposition.value)

        def whole() -> str:
            return str(forks_.fork(request()).disposition.value)

        (tmp / "runtimes").mkdir()
        for i in range(forks + 2):  # the first two rounds warm up, untimed
            for side, fn in (
                (("steps", stepwise), ("fork", whole))
                if i % 2
                else (
                    ("fork", whole),
                    ("steps", stepwise),
                )
            ):
                t0 = time.perf_counter()
                verdict = fn()
                wall = (time.perf_counter() - t0) * 1000.0
                if verdict != "accepted":
                    raise RuntimeError(f"{side} fork not accepted: {verdict}")
                if i >= 2:
                    walls[side].append(wall)
            bare_ms = bare.fork_once()
            if i >= 2:
                walls["bare"].append(bare_ms)
        bare.close()
    out = {
        "forks": forks,
        "cpuProbeMs": probe,
        "wallP50Ms": {k: statistics.median(v) for k, v in walls.items()},
        "stepsP50Ms": {k: statistics.median(v[-forks:]) for k, v in steps.items()},
        "pairDiffP50Ms": statistics.median(
            s - o for s, o in zip(walls["steps"], walls["fork"], strict=True)
        ),
    }
    w = out["wallP50Ms"]
    print(
        f"claude-code fork in process, {forks} per side, CPU probe {probe:.1f} ms: steps p50"
        f" {w['steps']:.2f} ms, fork p50 {w['fork']:.2f} ms (pairs: steps − fork p50"
        f" {out['pairDiffP50Ms']:.2f} ms), bare fork_session + read p50 {w['bare']:.2f} ms"
    )
    print("  steps p50: " + ", ".join(f"{k} {v:.2f}" for k, v in out["stepsP50Ms"].items()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forks", type=int, default=60)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = run(args.forks, args.turns)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
