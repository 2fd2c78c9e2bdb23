"""What workspace checkpoints add to a Turn: the same echo Turns (tutti-agent's built-in model,
one Session, one client) timed from `turn.submit` to settled with `[workspace] checkpoints`
on and off, in an empty folder and in a committed repository of many files (2,000 at full
size) with 10 changed before each Turn. A Turn with checkpoints takes its `before` before the
provider gets it and its `after` before it settles, so the difference is the two captures
(each a handful of git calls) plus the thread hops.

    build/venv/bin/python -m bench.turn_checkpoints [--quick | --smoke] [--json PATH]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.checkpoint import make_tree
from bench.common import BenchResult, Latency, Mode, Table, bench_main, cpu_probe_ms, log, pick
from bench.harness import WS, BenchDaemon, run_turn

MODULE = "bench.turn_checkpoints"


def _turns(base: Path, name: str, enabled: bool, cwd: Path, paths: list[Path], n: int) -> Latency:
    d = BenchDaemon(base / name, workspace={"checkpoints": enabled}).start()
    try:
        c = d.client(timeout=120)
        sid = str(
            c.call(
                "session.create",
                {"workspaceId": WS, "provider": "tutti-agent", "title": name, "cwd": str(cwd)},
            )["session"]["agentSessionId"]
        )
        run_turn(c, sid, "warm up")  # the runtime's start and the cold checkpoint
        samples = []
        for i in range(n):
            for p in paths[i * 10 % max(1, len(paths)) :][:10]:
                p.write_text(p.read_text() + f"# turn {i}\n")
            t0 = time.perf_counter()
            run_turn(c, sid, f"turn {i}")
            samples.append(1000 * (time.perf_counter() - t0))
        return Latency.of(samples)
    finally:
        d.stop()


def run(mode: Mode) -> BenchResult:
    files = pick(mode, 2_000, 500, 50)
    n = pick(mode, 40, 15, 3)
    result = BenchResult("turn checkpoints", "", mode.value)
    probe = cpu_probe_ms()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-turn-checkpoints-") as tmp:
        base = Path(tmp)
        empty = base / "empty"
        empty.mkdir()
        paths = make_tree(base / "repo", files)
        for label, cwd, changing in (
            ("empty folder", empty, []),
            (f"repository of {files} files, 10 changed per turn", base / "repo", paths),
        ):
            off = _turns(base, f"off-{cwd.name}", False, cwd, changing, n)
            on = _turns(base, f"on-{cwd.name}", True, cwd, changing, n)
            log(f"{label}: p50 off {off.p50:.0f} ms, on {on.p50:.0f} ms")
            rows.append((label, n, off.p50, on.p50, on.p50 - off.p50, off.p90, on.p90))
            result.figures[cwd.name] = {"off": off.brief(), "on": on.brief()}
    result.tables.append(
        Table(
            "Turn latency (submit to settled, ms) with [workspace] checkpoints off and on",
            ("cwd", "turns", "p50 off", "p50 on", "p50 added", "p90 off", "p90 on"),
            tuple(rows),
        )
    )
    result.notes.append(f"CPU probe {probe:.0f} ms (a quiet machine: 25-40 ms)")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, (__doc__ or "").splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
