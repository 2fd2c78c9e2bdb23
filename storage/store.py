"""The public `Store`: one object per store file, safe to share between threads.

It composes the canonical history (`canonical.py`) and the fork contract (`fork_operations.py`)
over one write helper; `Store.open(path)` creates the file and runs migrations.
"""

from __future__ import annotations

import os
from pathlib import Path

from storage.base import DEFAULT_MAX_CONNECTIONS, Clock
from storage.canonical import CanonicalStore
from storage.fork_operations import ForkStore
from storage.fork_resolution import ResolutionStore
from storage.lineage_tree import LineageStore
from storage.sqlite import BUSY_TIMEOUT_MS


class Store(CanonicalStore, ForkStore, LineageStore, ResolutionStore):
    """The canonical store (see docs/design/store.md)."""

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        clock: Clock | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> Store:
        """Open (creating if needed) and migrate the store at `path`."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Owner-only from birth: SQLite gives the -wal and -shm files the database's mode.
        if not Path(path).exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        store = cls(
            path, clock=clock, busy_timeout_ms=busy_timeout_ms, max_connections=max_connections
        )
        try:
            store._migrate()
        except BaseException:
            store.close()
            raise
        return store
