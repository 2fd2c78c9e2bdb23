"""The test files' bytecode as pytest's assertion rewriting makes it, written once before the
xdist workers start. Each worker collects every test file; under `PYTHONDONTWRITEBYTECODE=1`
(this machine's environment, and a CI's) pytest rewrites and compiles each of them in every
worker, every run (~15 s of CPU a worker, four workers), and writes nothing it could reuse. Two
collect-only runs over halves of the files, with bytecode writing on, leave pytest's own cached
files (`__pycache__/<name>.<tag>-pytest-<version>.pyc`, which it checks against the source's
mtime and size) and the support modules' bytecode, which every worker then reads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

WRITING_ENV = "AGENTHOST_TEST_BYTECODE_WRITING"
"""Set in the collect-only runs: their own configure writes nothing again."""


def named_test_files(root: Path, args: Iterable[str]) -> list[Path]:
    """The test files `args` (pytest's arguments: folders, files, `file::test` ids) name."""
    files: set[Path] = set()
    for arg in args:
        path = Path(arg.split("::", 1)[0])
        path = path if path.is_absolute() else root / path
        if path.is_dir():
            files.update(path.rglob("test_*.py"))
        elif path.is_file() and path.suffix == ".py":
            files.add(path)
    return sorted(files)


def write_rewritten(root: Path, files: list[Path], processes: int = 2) -> list[int]:
    """Collects `files` in `processes` pytest runs at once, bytecode writing on; their exit
    codes (the runs' output is not shown: a file that fails to collect fails the real run)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env[WRITING_ENV] = "1"
    shares = [files[index::processes] for index in range(processes)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"]
            + ["-p", "no:xdist", *map(str, share)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for share in shares
        if share
    ]
    return [run.wait() for run in runs]
