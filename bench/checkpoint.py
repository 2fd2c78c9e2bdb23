"""What a workspace checkpoint costs: a real git repository of many files (10,000 at full
size) with a few changed between checkpoints (10), timed side by side with an idle
`git status` of the same tree — the cost an incremental checkpoint is meant to match — and the
first (cold) checkpoint, and writing a checkpoint out as a new directory (`materialize`).

    build/venv/bin/python -m bench.checkpoint [--quick | --smoke] [--json PATH]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import BenchResult, Latency, Mode, Table, bench_main, cpu_probe_ms, log, pick
from workspace.shadow import Checkpoint, ShadowStore

TARGET_P50_MS = 100.0


def _git(repo: Path, *args: str) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@x",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@x",
    }
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def make_tree(root: Path, files: int) -> list[Path]:
    """A committed repository of `files` small files in 100-file directories."""
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    paths = []
    for i in range(files):
        d = root / f"pkg{i // 100:03d}"
        d.mkdir(exist_ok=True)
        p = d / f"mod{i % 100:02d}.py"
        p.write_text(f"# module {i}\nVALUE = {i}\n")
        paths.append(p)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "tree")
    return paths


def run(mode: Mode) -> BenchResult:
    files = pick(mode, 10_000, 2_000, 200)
    rounds = pick(mode, 30, 10, 3)
    changed = 10
    result = BenchResult("checkpoint", "", mode.value)
    probe = cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        base = Path(tmp)
        paths = make_tree(base / "repo", files)
        repo = base / "repo"
        store = ShadowStore(base / "home" / "checkpoints", timeout_s=120)
        t0 = time.perf_counter()
        cold = store.capture(repo)
        cold_ms = 1000 * (time.perf_counter() - t0)
        assert isinstance(cold, Checkpoint), cold
        log(f"cold checkpoint of {files} files: {cold_ms:.0f} ms")
        capture_ms, status_ms = [], []
        for r in range(rounds):
            for p in paths[r * changed % len(paths) :][:changed]:
                p.write_text(p.read_text() + f"# round {r}\n")
            # Interleaved, so both see the same page cache and load.
            t0 = time.perf_counter()
            subprocess.run(
                ["git", "status", "--porcelain"],
                cwd=repo,
                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
                check=True,
                capture_output=True,
            )
            status_ms.append(1000 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            cp = store.capture(repo)
            capture_ms.append(1000 * (time.perf_counter() - t0))
            assert isinstance(cp, Checkpoint), cp
        t0 = time.perf_counter()
        store.materialize(repo, cp.commit, base / "copy")
        materialize_ms = 1000 * (time.perf_counter() - t0)
        capture, status = Latency.of(capture_ms), Latency.of(status_ms)
    result.tables.append(
        Table(
            f"checkpoint of {files} files, {changed} changed per round ({rounds} rounds)",
            ("what", "p50 ms", "p90 ms", "max ms"),
            (
                ("incremental checkpoint", capture.p50, capture.p90, capture.max),
                ("idle git status, same tree", status.p50, status.p90, status.max),
                ("first (cold) checkpoint", cold_ms, cold_ms, cold_ms),
                (
                    "materialize into a new directory",
                    materialize_ms,
                    materialize_ms,
                    materialize_ms,
                ),
            ),
        )
    )
    result.figures = {
        "files": files,
        "changedPerRound": changed,
        "checkpoint": capture,
        "gitStatus": status,
        "coldMs": cold_ms,
        "materializeMs": materialize_ms,
        "cpuProbeMsAtStart": probe,
        "loadAverage1mAtStart": round(os.getloadavg()[0], 2),
    }
    if mode is Mode.FULL:
        result.target(
            "checkpoint p50, 10,000 files / 10 changed (ms)",
            capture.p50,
            TARGET_P50_MS,
            higher_is_better=False,
            measured=f"{rounds} rounds; idle git status p50 {status.p50:.1f} ms beside it",
        )
    result.notes.append(f"CPU probe at start {probe} ms; load {os.getloadavg()[0]:.2f}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.checkpoint", __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
