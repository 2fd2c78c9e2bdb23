"""Per-fork syscall counts and CPU of one tutti-agent fork path (issue 20), cheap and not
distorted by the machine's load: counts, not timings.

A real daemon (`bench.harness.BenchDaemon`), one Session of N Turns on tutti-agent, a few
warm-up forks, then F forks of the same boundary Turn. Reported per fork:

- CPU ms per process kind (daemon, worker, app-server) from /proc — CPU time, unlike wall
  time, is not inflated much by other processes sharing the cores;
- with `--strace`: syscall counts (fsync, fdatasync, openat, rename, mkdir, write, execve —
  a process spawned on the fork path —, …) per process kind, from `strace -f -c` attached to
  the daemon, its worker and its app-server;
- with `--py-spy`: the top self/inclusive frames of the worker and the app-server.

    build/venv/bin/python -m bench.fork_syscalls [--forks 50] [--turns 10] [--strace] [--py-spy]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import (
    BenchDaemon,
    acknowledge,
    cpu_by_kind,
    create_session,
    fork_until_terminal,
    last_settled_turn,
    run_turn,
    tree,
)
from bench.profile import py_spy, summarise

SYSCALLS = (
    "fsync,fdatasync,openat,open,rename,renameat,renameat2,mkdir,mkdirat,unlink,unlinkat,"
    "write,read,lseek,newfstatat,fstat,getdents64,execve"
)


def _pids_by_kind(root: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in tree(root):
        out.setdefault(s.kind, []).append(s.pid)
    return out


def _parse_strace_c(text: str) -> dict[str, int]:
    """`strace -c` table → {syscall: calls}."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and re.fullmatch(r"[\d.]+", parts[0]) and parts[-1] != "total":
            try:
                counts[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return counts


@dataclass
class Report:
    forks: int
    wall_ms_per_fork: float
    cpu_ms_per_fork: dict[str, float]
    calls_per_fork: dict[str, dict[str, float]] = field(default_factory=dict)  # kind → calls
    spy_lines: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"{self.forks} forks, {self.wall_ms_per_fork:.1f} ms wall per fork"
            " (load-dependent; tracers slow it)",
            f"CPU ms per fork by process kind: {self.cpu_ms_per_fork}",
        ]
        out += [f"strace {k} calls per fork: {v}" for k, v in self.calls_per_fork.items()]
        for kind, lines in self.spy_lines.items():
            out.append(f"py-spy {kind}:")
            out += [f"    {line}" for line in lines]
        return out


def measure(
    *,
    forks: int,
    turns: int,
    warmup: int = 3,
    strace: bool = False,
    pyspy: bool = False,
    strace_log: Path | None = None,
) -> Report:
    """Fork a `turns`-Turn tutti-agent source `forks` times through a real daemon."""
    with tempfile.TemporaryDirectory(prefix="fork-syscalls-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        tracers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        try:
            c = daemon.client()
            sid = create_session(c, "syscalls")
            for i in range(turns):
                run_turn(c, sid, f"turn {i}")
            boundary = last_settled_turn(c, sid)
            for _ in range(warmup):
                acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
            kinds = _pids_by_kind(daemon.pid)
            if strace:
                tool = shutil.which("strace")
                if tool is None:
                    raise RuntimeError("strace is not installed")
                for kind in ("daemon", "worker", "app-server"):
                    for pid in kinds.get(kind, []):
                        out = tmp / f"strace-{kind}-{pid}.txt"
                        cmd = [tool, "-f", "-c", "-e", f"trace={SYSCALLS}", "-o", str(out)]
                        if strace_log is not None:
                            strace_log.mkdir(parents=True, exist_ok=True)
                            log = strace_log / f"{kind}-{pid}.log"
                            cmd = [tool, "-f", "-y", "-tt", "-T", "-e", f"trace={SYSCALLS}"]
                            cmd += ["-o", str(log)]
                        proc = subprocess.Popen([*cmd, "-p", str(pid)], stderr=subprocess.DEVNULL)
                        tracers.append((kind, proc, out))
            if pyspy:
                spy = py_spy()
                if spy is None:
                    raise RuntimeError("py-spy is not installed")
                for kind in ("worker", "app-server"):
                    for pid in kinds.get(kind, []):
                        out = tmp / f"spy-{kind}-{pid}.txt"
                        cmd = [spy, "record", "--gil", "--format", "raw", "--rate", "500"]
                        cmd += ["-o", str(out)]
                        proc = subprocess.Popen(
                            [*cmd, "-p", str(pid)],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        tracers.append((kind, proc, out))
            time.sleep(1.0 if tracers else 0.0)  # let the tracers attach
            before = cpu_by_kind(tree(daemon.pid))
            wall = time.monotonic()
            for _ in range(forks):
                op = fork_until_terminal(c, sid, boundary)
                if op["status"] != "committed":
                    raise RuntimeError(f"fork did not commit: {op}")
                acknowledge(c, op["operationId"])
            wall = time.monotonic() - wall
            after = cpu_by_kind(tree(daemon.pid))
            for _, proc, _ in tracers:
                proc.send_signal(signal.SIGINT)
            for _, proc, _ in tracers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
            report = Report(
                forks,
                1000 * wall / forks,
                {
                    k: round(1000 * (after.get(k, 0.0) - before.get(k, 0.0)) / forks, 1)
                    for k in after
                },
            )
            for kind, _, out in tracers:
                if not out.exists():
                    continue
                text = out.read_text(errors="replace")
                if out.name.startswith("strace-"):
                    counts = _parse_strace_c(text)
                    report.calls_per_fork[kind] = {
                        k: round(v / forks, 2) for k, v in sorted(counts.items())
                    }
                else:
                    report.spy_lines[kind] = summarise(text).lines(10)
            return report
        finally:
            for _, proc, _ in tracers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            daemon.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--forks", type=int, default=50)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--py-spy", dest="pyspy", action="store_true")
    ap.add_argument(
        "--strace-log", type=Path, default=None, help="also write full strace logs (-y -tt -T) here"
    )
    args = ap.parse_args(argv)
    report = measure(
        forks=args.forks,
        turns=args.turns,
        warmup=args.warmup,
        strace=args.strace,
        pyspy=args.pyspy,
        strace_log=args.strace_log,
    )
    print(f"source of {args.turns} turns (tutti-agent)")
    for line in report.lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
