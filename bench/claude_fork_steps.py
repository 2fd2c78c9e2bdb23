"""The Claude Code driver's fork, step by step, in this process (issue 36 target 1).

A warm 10-Turn source made with the pinned SDK (`bench.providers.BareClaude`, the fake model
the only fake), forked N times per side by the driver's own fork strategy (`ClaudeFork`) into
fresh target homes, the sides alternating fork by fork so both see the same machine:

- `serial`: the steps one after another — plan, `fork_session`, the move with its last round
  waited for (`relocate_child`), then the verification (what the fork did until 2026-12-03);
- `overlap`: `ClaudeFork.fork` as the worker runs it — the verification reads the child while
  the move's last round (the directories' fsyncs) runs, the answer after both.

Wall p50 per side and per step; the bare provider calls (`fork_session` + the SDK's read of
the child, `BareClaude.fork_once`) timed in the same loop as the reference. Not a benchmark
of record: the split, and the pair's difference, is what it is for.

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
    probe = cpu_probe_ms()
    walls: dict[str, list[float]] = {"serial": [], "overlap": [], "bare": []}
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

        def serial() -> str:
            req = request()
            plan = timed("plan", forks_.plan_fork, req)
            child = timed("fork_session", forks_.call_fork_session, req, plan)
            timed("move, waited", forks_.relocate_child, req, child)
            result = timed("verify", forks_.verify_child, req, plan, child)
            return str(result.disposition.value)

        def overlap() -> str:
            return str(forks_.fork(request()).disposition.value)

        (tmp / "runtimes").mkdir()
        for i in range(forks + 2):  # the first two rounds warm up, untimed
            for side, fn in (("serial", serial), ("overlap", overlap)) if i % 2 else (
                ("overlap", overlap),
                ("serial", serial),
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
        "serialStepsP50Ms": {k: statistics.median(v[-forks:]) for k, v in steps.items()},
        "pairDiffP50Ms": statistics.median(
            s - o for s, o in zip(walls["serial"], walls["overlap"], strict=True)
        ),
    }
    w = out["wallP50Ms"]
    print(
        f"claude-code fork in process, {forks} per side, CPU probe {probe:.1f} ms: serial p50"
        f" {w['serial']:.2f} ms, overlap p50 {w['overlap']:.2f} ms (pairs: serial − overlap p50"
        f" {out['pairDiffP50Ms']:.2f} ms), bare fork_session + read p50 {w['bare']:.2f} ms"
    )
    print(
        "  serial steps p50: "
        + ", ".join(f"{k} {v:.2f}" for k, v in out["serialStepsP50Ms"].items())
    )
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
