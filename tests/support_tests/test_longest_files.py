"""The suite's order for `make test`'s workers (tests/conftest.py `LONGEST_FILES`): the longest
files are collected first, longest first, the rest by their number of tests; a name in the
table that is no file is caught here, not silently ignored."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from tests.conftest import LONGEST_FILES, ROOT


def test_every_file_the_table_names_exists() -> None:
    missing = [name for name in LONGEST_FILES if not (ROOT / name).is_file()]
    assert not missing, f"LONGEST_FILES names no file: {missing}"


def _collected(*paths: str) -> list[str]:
    """The files of `pytest --collect-only` over `paths`, one per test, in the order collected."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line]


def test_the_longest_files_are_collected_first_and_the_rest_by_their_number_of_tests() -> None:
    longest = sorted(LONGEST_FILES, key=lambda name: -LONGEST_FILES[name])[:2]
    collected = _collected("tests/layers", "tests/domain", *reversed(longest))
    files = list(dict.fromkeys(collected))
    runs = [name for i, name in enumerate(collected) if i == 0 or collected[i - 1] != name]
    assert runs == files, f"a file's tests split apart: {runs}"
    assert files[:2] == longest, files
    rest, counts = files[2:], Counter(collected)
    assert rest and not set(rest) & set(LONGEST_FILES)
    assert [counts[name] for name in rest] == sorted((counts[n] for n in rest), reverse=True)
