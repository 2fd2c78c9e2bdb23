"""The interleaved A/B drivers (`bench.fork_pairs`, `bench.turn_cpu --pairs`): each sample runs
the code of the tree it names, the order alternates from pair to pair, the summary counts the
pairs in which `this` was higher and prints the command that reruns them; both run end to end
with `--quick` (the same tree on both sides: figures not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ab_pairs import AGAINST, THIS, Pair, interleave, run_in_tree, summary
from bench.turn_cpu import probe_figures

REPO = Path(__file__).resolve().parents[2]


def test_a_sample_runs_the_code_of_its_own_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "bench").mkdir(parents=True)
    (tree / "bench" / "__init__.py").write_text("")
    (tree / "build").symlink_to(REPO / "build")
    out = run_in_tree(tree, ["-c", "import bench, os; print(bench.__file__, os.getcwd())"])
    assert out.split() == [str(tree / "bench" / "__init__.py"), str(tree)]


def test_pairs_alternate_which_tree_runs_first() -> None:
    ran: list[Path] = []
    trees = {AGAINST: Path("/a"), THIS: Path("/b")}
    got = interleave(trees, 4, lambda tree: ran.append(tree) or {"x": 1.0})
    assert ran == [Path(p) for p in ("/a", "/b", "/b", "/a", "/a", "/b", "/b", "/a")]
    assert [p.first for p in got] == [AGAINST, THIS, AGAINST, THIS]


def test_the_summary_counts_the_pairs_this_tree_was_higher_by_who_ran_first() -> None:
    pairs = [
        Pair(AGAINST, {AGAINST: {"cpu": 1.0}, THIS: {"cpu": 1.5}}),
        Pair(THIS, {AGAINST: {"cpu": 2.0}, THIS: {"cpu": 1.0}}),
        Pair(AGAINST, {AGAINST: {"cpu": 3.0}, THIS: {"cpu": 3.2}}),
        Pair(THIS, {AGAINST: {"cpu": 1.0}, THIS: {"cpu": 1.1}}),
    ]
    (row,) = summary("t", pairs, ["cpu"]).rows
    figure, against, this, higher, against_first, this_first, delta = row
    assert (figure, against, this) == ("cpu", 1.5, 1.3)
    assert (higher, against_first, this_first) == ("3 of 4", "2 of 2", "1 of 2")
    assert delta == "+0.150"  # the median of +0.5, -1.0, +0.2, +0.1


def test_the_probes_line_reads_as_figures_a_turn() -> None:
    line = (
        "probe=13ms load=2.32 turns=100 | app-server=5.57ms daemon=7.08ms worker=3.40ms"
        " | cs:app-server=44.0 cs:daemon=98.5 cs:worker=50.1"
    )
    assert probe_figures(line) == {
        "app-server ms": 5.57,
        "daemon ms": 7.08,
        "worker ms": 3.40,
        "cs:app-server": 44.0,
        "cs:daemon": 98.5,
        "cs:worker": 50.1,
    }


def _quick(module: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--against", str(REPO), "--quick", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    command = f"command: cd {REPO} && PYTHONPATH=. build/venv/bin/python -m {module} --against"
    assert command in done.stdout, done.stdout
    return done.stdout


@pytest.mark.timeout(300)
def test_fork_pairs_quick_prints_each_figures_pairs_and_its_command() -> None:
    out = _quick("bench.fork_pairs", "--provider", "tutti-agent")
    assert "## tutti-agent: the worker's fork, against vs this" in out, out
    for figure in ("worker CPU ms, reuse", "worker CPU ms, reread", "wall ms, reuse"):
        assert re.search(rf"^{re.escape(figure)} .* [0-2] of 2 ", out, re.M), out


@pytest.mark.long  # the pairs' machinery is the fork pairs' (pinned above); make soak runs it
@pytest.mark.timeout(300)
def test_turn_cpu_pairs_quick_prints_each_kinds_pairs_and_its_command() -> None:
    out = _quick("bench.turn_cpu")
    for figure in ("worker ms", "daemon ms", "app-server ms", "cs:worker"):
        assert re.search(rf"^{re.escape(figure)} .* [0-2] of 2 ", out, re.M), out
