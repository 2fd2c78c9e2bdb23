"""A failed soak says where it failed, its seed and how to replay it: the soaks put their words
under `REPLAY` in their test item's stash and the reliability suite's `conftest.py` adds them to
a failed report as its "soak replay" section (a long run's seed line is thousands of lines
above its failure, and the round is in no assertion)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.reliability.reliability_harness import REPO, replay_hint

INNER = """
import pytest

from tests.reliability.reliability_harness import REPLAY, replay_hint


def test_fails_in_round_3(request: pytest.FixtureRequest) -> None:
    at = ["the set-up"]
    request.node.stash[REPLAY] = lambda: replay_hint("a soak", 5302, at[0])
    at[0] = "round 3 of 5"
    assert False, "a law broke"


def test_passes(request: pytest.FixtureRequest) -> None:
    request.node.stash[REPLAY] = lambda: replay_hint("a soak", 77, "round 1 of 5")
"""


def test_a_failed_soak_reports_its_seed_its_round_and_the_replay(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.reliability.conftest import pytest_runtest_makereport  # noqa: F401\n"
    )
    (tmp_path / "test_inner.py").write_text(INNER)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    words = replay_hint("a soak", 5302, "round 3 of 5")
    assert "soak replay" in run.stdout and words in run.stdout, run.stdout
    assert "failed at round 3 of 5, seed 5302" in words
    assert words.endswith("AGENTHOST_SOAK_SEED=5302")
    assert "seed 77" not in run.stdout  # a soak that passed says nothing
