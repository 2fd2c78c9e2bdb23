"""One open write transaction as every store write sees it: its connection, clock reading,
pending change events (delivered after the COMMIT), and the source fence checked inside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

from domain.errors import ForkInProgress
from domain.fork_states import ACTIVE_SQL
from storage.models import ChangeEvent
from storage.sqlite import Row


class Tx:
    """One open write transaction: the cursor, its clock reading and its pending events."""

    __slots__ = ("conn", "workspace_id", "now_ms", "events", "_seen")

    def __init__(self, conn: apsw.Connection, workspace_id: str | None, now_ms: int) -> None:
        self.conn = conn
        self.workspace_id = workspace_id
        self.now_ms = now_ms
        self.events: list[ChangeEvent] = []
        self._seen: set[ChangeEvent] = set()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> apsw.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.conn.executemany(sql, rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    def changes(self) -> int:
        return int(self.conn.changes())

    def emit(self, event: ChangeEvent) -> None:
        # A set beside the list: one transaction may emit the same change many times.
        if event not in self._seen:
            self._seen.add(event)
            self.events.append(event)

    def check_fence(self, session_id: str) -> None:
        """Fail with `ForkInProgress` if an active fork operation holds `session_id`'s fence.

        Runs inside the caller's write transaction, so no fork can be prepared between the
        check and the write it guards (law 3).
        """
        row = self.one(
            "SELECT operation_id FROM fork_operations WHERE workspace_id = ?"
            " AND source_session_id = ?"
            f" AND status IN {ACTIVE_SQL} LIMIT 1",
            (self.workspace_id, session_id),
        )
        if row is not None:
            raise ForkInProgress(
                f"session {session_id} is being forked (operation {row[0]})",
                params={"operationId": row[0], "forkBoundaryReason": "source_fork_active"},
            )
