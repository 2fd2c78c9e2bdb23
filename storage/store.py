"""The public `Store`: one object per store file, safe to share between threads.

One owner, `Database` (storage/base.py: the connection pool, the write baton, subscribers),
and one part per concern composed over it, each in its own module: `sessions`, `goals`,
`turns`, `history`, the fork operation's `fork_prepare`, `fork_transitions`, `fork_commit`,
`fork_recovery`, `fork_queries` (with the fence read), `fork_workspace`, then `lineage` and
`resolution`. A caller names the part it uses (`store.turns.claim_submit(...)`); the parts
share nothing but the owner. `Store.open(path)` creates the file and runs migrations.
"""

from __future__ import annotations

import os
from pathlib import Path

from storage.base import DEFAULT_MAX_CONNECTIONS, Clock, Database
from storage.fork_commit import ForkCommit
from storage.fork_prepare import ForkPrepare
from storage.fork_queries import ForkFence, ForkQueries
from storage.fork_recovery import ForkRecovery
from storage.fork_resolution import ResolutionStore
from storage.fork_transitions import ForkTransitions
from storage.fork_workspace import ForkWorkspace
from storage.history import HistoryStore
from storage.lineage_tree import LineageStore
from storage.session_controls import SessionControls
from storage.sessions import SessionStore
from storage.sqlite import BUSY_TIMEOUT_MS
from storage.turns import TurnStore


class Store:
    """The canonical store (see docs/design/store.md): the owner and its parts."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        self.db = Database(
            path, clock=clock, max_connections=max_connections, busy_timeout_ms=busy_timeout_ms
        )
        db = self.db
        # Sessions and their history.
        self.sessions = SessionStore(db)
        self.goals = SessionControls(db)
        self.turns = TurnStore(db)
        self.history = HistoryStore(db)
        # The durable fork operation (seed 000 §3–§6, §8.3, §10).
        self.fork_prepare = ForkPrepare(db)
        self.fork_transitions = ForkTransitions(db)
        self.fork_commit = ForkCommit(db)
        self.fork_recovery = ForkRecovery(db)
        self.fork_fence = ForkFence(db)
        self.fork_queries = ForkQueries(db)
        self.fork_workspace = ForkWorkspace(db)
        # Lineage and `fork.resolve`.
        self.lineage = LineageStore(db)
        self.resolution = ResolutionStore(db)

    @property
    def path(self) -> str:
        return self.db.path

    def close(self) -> None:
        """Close every connection the store opened (in any thread)."""
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            store.db.migrate()
        except BaseException:
            store.close()
            raise
        return store
