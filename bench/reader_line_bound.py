"""The reader's cost per line of bounding it: the CPU time (`thread_time`) of reading 400,000
delta-sized JSON lines from a `cat` pipe by iteration (`for raw in stdout`, unbounded: A) and
by `readline(MAX_LINE_BYTES)` with the past-the-bound check, as `AppServerProcess._read_loop`
reads (B), interleaved ABAB `--rounds` times; the medians and every round are printed:

    PYTHONPATH=. build/venv/bin/python bench/reader_line_bound.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import tempfile
import time
from pathlib import Path

from drivers.app_server.process import MAX_LINE_BYTES

LINES = 400_000
LINE = (
    b'{"method":"item/agentMessage/delta","params":{"threadId":"t","turnId":"u",'
    b'"itemId":"i","delta":"abcd"}}\n'
)


def _read(data: Path, bounded: bool) -> float:
    proc = subprocess.Popen(["cat", str(data)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    stdout = proc.stdout
    n = 0
    t0 = time.thread_time()
    if bounded:
        limit = MAX_LINE_BYTES
        for raw in iter(functools.partial(stdout.readline, limit), b""):
            if len(raw) >= limit and not raw.endswith(b"\n"):
                break
            n += 1
    else:
        for _raw in stdout:
            n += 1
    cpu = time.thread_time() - t0
    proc.wait()
    assert n == LINES
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "lines"
        data.write_bytes(LINE * LINES)
        runs: dict[str, list[float]] = {"A iterate": [], "B readline(bound)": []}
        for _ in range(args.rounds):
            runs["A iterate"].append(_read(data, bounded=False))
            runs["B readline(bound)"].append(_read(data, bounded=True))
    for name, cpu in runs.items():
        cpu.sort()
        rounds = [round(c * 1000) for c in cpu]
        print(f"{name}: median {cpu[len(cpu) // 2] * 1000:.1f} ms CPU per {LINES} lines {rounds}")


if __name__ == "__main__":
    main()
