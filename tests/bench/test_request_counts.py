"""`python -m bench.request_counts` runs against a real daemon and reports a rename's CPU and
wake-ups by thread (figures not asserted: counts of a loaded machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_request_counts_reports_a_renames_cost_by_thread() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.request_counts", "--renames", "100"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    cpu = re.search(r"100 renames in .* daemon CPU ([0-9.]+) ms per rename \[(.*)\]", out.stdout)
    assert cpu is not None, out.stdout
    # By thread: each daemon thread that ran is named with its share. Which ones show depends
    # on the kernel's 10 ms CPU ticks over ~30 ms of CPU (a CI run once saw only the writer).
    assert float(cpu.group(1)) > 0, out.stdout
    shares = cpu.group(2)
    assert re.fullmatch(r"\S+ [0-9.]+(, \S+ [0-9.]+)*", shares) and "agenthost-" in shares, shares
    assert re.search(r"wake-ups [0-9.]+ per rename", out.stdout), out.stdout
