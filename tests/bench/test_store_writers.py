"""`bench.store_writers` times real renames on a real store file: one latency per rename, and
the COMMITs that held them from the store's own count."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.store_writers import WRITERS, measure

pytestmark = pytest.mark.timeout(60)


def test_the_probe_counts_the_renames_it_made_and_the_commits_that_held_them(
    tmp_path: Path,
) -> None:
    report = measure(str(tmp_path), 0.3, busy=1)
    assert report.renames >= WRITERS  # each writer renamed at least once
    assert report.latency.n == report.renames
    assert 1 <= report.commits <= report.renames  # a group commit holds one or more
    assert report.latency.p99 >= report.latency.p50 > 0.0
    assert "renames per COMMIT" in report.line()
