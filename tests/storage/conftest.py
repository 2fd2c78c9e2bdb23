"""Fixtures for the store tests: a real SQLite file in a tmp dir, and session/turn builders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from store_builders import WS

from storage.store import Store


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "home" / "store.sqlite3"


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    s = Store.open(store_path)
    yield s
    s.close()


@pytest.fixture
def ws() -> str:
    return WS
