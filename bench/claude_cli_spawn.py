"""What tying a Claude Code CLI to its worker costs its start: the bundled CLI (or `--cli`)
run as `<cli> --version` to its exit, directly and through the script the Claude driver gives
the SDK (`drivers.claude.tied.TiedCli`: `sh`, then `setpriv --pdeathsig KILL --`, then the
CLI, all one pid), alternating, `--rounds` of each. Prints each one's wall time and the CPU
time of the process (user + system, from `wait4`: the script's and `setpriv`'s execs are in
it), then the medians and in how many of the pairs the tied start cost more.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.claude_cli_spawn [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import cpu_probe_ms
from drivers.claude.tied import TiedCli


def _bundled() -> str:
    import claude_agent_sdk

    return str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall ms from spawn to exit, and the child's CPU ms (user + system)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - t0) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {proc.returncode}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.claude_cli_spawn")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--cli", default=None, help="the CLI (default: the SDK's bundled one)")
    args = parser.parse_args(argv)
    cli = args.cli or _bundled()
    tied = TiedCli(lambda: cli, None)
    script = tied.cli_path()
    if script is None:
        raise SystemExit("no setpriv --pdeathsig here: the CLI is not tied, nothing to measure")
    print(f"load {os.getloadavg()[0]:.2f} probe {cpu_probe_ms():.1f} ms", flush=True)
    try:
        _run([cli, "--version"])  # page cache
        direct: list[tuple[float, float]] = []
        through: list[tuple[float, float]] = []
        for i in range(args.rounds):
            order = [(direct, cli), (through, script)]
            for into, program in order if i % 2 == 0 else order[::-1]:
                into.append(_run([program, "--version"]))
            print(
                f"round {i}: direct {direct[-1][0]:.1f} ms wall {direct[-1][1]:.1f} ms cpu,"
                f" tied {through[-1][0]:.1f} ms wall {through[-1][1]:.1f} ms cpu",
                flush=True,
            )
    finally:
        tied.close()
    for what, index in (("wall", 0), ("cpu", 1)):
        a = statistics.median(x[index] for x in direct)
        b = statistics.median(x[index] for x in through)
        more = sum(t[index] > d[index] for d, t in zip(direct, through, strict=True))
        print(
            f"{what} p50: direct {a:.1f} ms, tied {b:.1f} ms ({b - a:+.1f} ms);"
            f" tied cost more in {more} of {args.rounds} pairs",
            flush=True,
        )
    print(
        f"command: build/venv/bin/python -m bench.claude_cli_spawn --rounds {args.rounds}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
