"""The test files' rewritten bytecode is written once, by collect-only runs with bytecode
writing on, even where `PYTHONDONTWRITEBYTECODE=1` would have pytest write none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.rewrite_cache import named_test_files, write_rewritten

TEST_TEXT = "def test_one() -> None:\n    value = 2\n    assert value + 1 == 3\n"


def rewritten(path: Path) -> Path:
    """Where pytest keeps `path`'s rewritten bytecode."""
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
    return path.parent / "__pycache__" / f"{path.stem}.{tag}"


def two_test_files(root: Path) -> list[Path]:
    (root / "a").mkdir()
    (root / "b").mkdir()
    files = [root / "a" / "test_one.py", root / "b" / "test_two.py"]
    for path in files:
        path.write_text(TEST_TEXT)
    (root / "a" / "helper.py").write_text("X = 1\n")
    return files


def test_the_files_named_are_the_test_files_of_each_folder_and_file(tmp_path: Path) -> None:
    files = two_test_files(tmp_path)
    assert named_test_files(tmp_path, ["a", "b/test_two.py::test_one", "missing"]) == files
    assert named_test_files(tmp_path, [str(tmp_path)]) == files


def test_rewritten_bytecode_is_written_though_the_environment_forbids_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = two_test_files(tmp_path)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    # A plain collect-only run in that environment writes none: what each worker met.
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    assert not any(rewritten(path).exists() for path in files)
    assert write_rewritten(tmp_path, files) == [0, 0]
    assert all(rewritten(path).is_file() for path in files)
