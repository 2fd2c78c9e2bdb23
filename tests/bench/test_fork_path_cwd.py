"""`bench.fork_path`'s worker trace runs its Codex source where the daemon's Sessions run
theirs: a small folder of its own, not the checkout (a git work tree, where Codex's
`thread/fork` starts `git` processes for every child). Real Codex and the real driver; only
the model is faked."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.fork_path import _trace_provider
from bench.providers import _codex_unavailable
from drivers.codex.lineage import session_meta

pytestmark = pytest.mark.timeout(180)


def _in_git_work_tree(path: str) -> bool:
    done = subprocess.run(
        ["git", "-C", path, "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0 and done.stdout.strip() == "true"


def test_the_codex_trace_works_outside_any_git_work_tree(tmp_path: Path) -> None:
    why = _codex_unavailable()
    if why is not None:
        pytest.skip(why)
    root = tmp_path / "trace"
    measured = _trace_provider("codex", 1, 1, root)
    assert measured["walls"]["reuse"]  # it forked
    home = root / "codex" / "runtimes" / "source" / "home"
    rollouts = sorted(home.rglob("rollout-*.jsonl"))
    assert rollouts  # the source's and the children Codex wrote in its home
    cwds = {str(session_meta(path).get("cwd")) for path in rollouts}
    assert cwds == {str(root / "codex" / "work")}
    assert not any(_in_git_work_tree(cwd) for cwd in cwds)
