"""`bench.mutation_solo`: one mutation client alone, its CPU per request and (with perf) the
daemon's kernel-counted events per request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.mutation_solo import parse_perf_csv

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_perf_csv_is_read_by_event_and_uncounted_lines_are_left_out() -> None:
    text = (
        "# started on Sat Dec  5 07:37:01 2026\n\n"
        "163940,,raw_syscalls:sys_enter,4012345,100.00,,\n"
        "39353,,syscalls:sys_enter_futex,4012345,100.00,,\n"
        "36700,,context-switches,4012345,100.00,,\n"
        "<not counted>,,syscalls:sys_enter_fdatasync,0,0.00,,\n"
    )
    assert parse_perf_csv(text) == {
        "sys_enter": 163940.0,
        "sys_enter_futex": 39353.0,
        "context-switches": 36700.0,
    }


def test_one_client_alone_prints_the_daemon_trees_cpu_per_request() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.mutation_solo", "--seconds", "1", "--warm", "0.5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    first = out.stdout.splitlines()[0]
    assert first.startswith("requests ") and int(first.split()[1]) > 3, out.stdout
    assert "CPU ms per request:" in out.stdout and " daemon " in out.stdout, out.stdout
    assert "command: build/venv/bin/python -m bench.mutation_solo" in out.stdout
