"""Per-fork syscall counts and CPU of one tutti-agent fork path (issue 20), cheap and not
distorted by the machine's load: counts, not timings.

A real daemon (`bench.harness.BenchDaemon`), one Session of N Turns on tutti-agent, a few
warm-up forks, then F forks of the same boundary Turn. Reported per fork:

- CPU ms per process kind (daemon, worker, app-server) from /proc — CPU time, unlike wall
  time, is not inflated much by other processes sharing the cores;
- with `--strace`: syscall counts (fsync, fdatasync, openat, rename, mkdir, write, …) per
  process kind, from `strace -f -c` attached to the daemon, its worker and its app-server;
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
from pathlib import Path

from bench.harness import (
    BenchDaemon,
    acknowledge,
    cpu_by_kind,
    create_session,
    fork_until_terminal,
    last_settled_turn,
    process_kind,
    run_turn,
    tree,
)
from bench.profile import py_spy, summarise

SYSCALLS = (
    "fsync,fdatasync,openat,open,rename,renameat,renameat2,mkdir,mkdirat,unlink,unlinkat,"
    "write,read,lseek,newfstatat,fstat,getdents64"
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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--forks", type=int, default=50)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--py-spy", dest="pyspy", action="store_true")
    ap.add_argument(
        "--strace-log", type=Path, default=None, help="also write full strace logs (-y) here"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fork-syscalls-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = BenchDaemon(tmp / "home").start()
        tracers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        try:
            c = daemon.client()
            sid = create_session(c, "syscalls")
            for i in range(args.turns):
                run_turn(c, sid, f"turn {i}")
            boundary = last_settled_turn(c, sid)
            for _ in range(args.warmup):
                acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
            kinds = _pids_by_kind(daemon.pid)
            if args.strace:
                strace = shutil.which("strace")
                if strace is None:
                    raise SystemExit("strace is not installed")
                for kind in ("daemon", "worker", "app-server"):
                    for pid in kinds.get(kind, []):
                        out = tmp / f"strace-{kind}-{pid}.txt"
                        cmd = [strace, "-f", "-c", "-e", f"trace={SYSCALLS}", "-o", str(out)]
                        if args.strace_log is not None:
                            args.strace_log.mkdir(parents=True, exist_ok=True)
                            log = args.strace_log / f"{kind}-{pid}.log"
                            cmd = [strace, "-f", "-y", "-T", "-e", f"trace={SYSCALLS}"]
                            cmd += ["-o", str(log)]
                        proc = subprocess.Popen([*cmd, "-p", str(pid)], stderr=subprocess.DEVNULL)
                        tracers.append((kind, proc, out))
            if args.pyspy:
                spy = py_spy()
                if spy is None:
                    raise SystemExit("py-spy is not installed")
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
            for _ in range(args.forks):
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
            n = args.forks
            print(f"{n} forks of a {args.turns}-turn tutti-agent source, {1000 * wall / n:.1f} ms"
                  " wall per fork (load-dependent; tracers slow it)")
            print("CPU ms per fork by process kind:", {
                k: round(1000 * (after.get(k, 0.0) - before.get(k, 0.0)) / n, 1) for k in after
            })
            for kind, _, out in tracers:
                if not out.exists():
                    print(f"{kind}: no output")
                    continue
                text = out.read_text(errors="replace")
                if out.name.startswith("strace-"):
                    counts = _parse_strace_c(text)
                    per = {k: round(v / n, 2) for k, v in sorted(counts.items())}
                    print(f"strace {kind} ({process_kind_label(out)}) calls per fork: {per}")
                else:
                    print(f"py-spy {kind}:")
                    for line in summarise(text).lines(10):
                        print("   ", line)
        finally:
            for _, proc, _ in tracers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            daemon.stop()
    return 0


def process_kind_label(path: Path) -> str:
    return path.stem.split("-", 1)[1]


_ = process_kind

if __name__ == "__main__":
    sys.exit(main())
