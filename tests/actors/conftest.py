"""The in-process saga tests' store: a real SQLite file per test under its home."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.store import Store


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    s = Store.open(home / "store.sqlite3")
    try:
        yield s
    finally:
        s.close()
