"""Point reads of committed state on a connection of their own: the read path.

The daemon answers `session.get` and `fork.get` on the transport thread with one of these
instead of leasing a pooled connection on a reader thread: no thread hop, no pool lock, and
SQLite's statement cache warm for the two queries. The connection is `query_only`: it can
never write, so it never takes the write lock and never waits for the writer (WAL readers
do not block the writer, nor it them).

Read-your-writes: every read here starts its own read transaction and ends it before it
returns, so it sees every transaction committed before it began — in particular any write
the daemon acknowledged to a client before that client's read arrived. Nothing keeps a
snapshot open between two reads.

The generation (`generation()`, SQLite's `PRAGMA data_version`) lets a caller keep what it
read: it changes whenever any other connection, in this process or another, commits to the
database (and never because of this connection, which cannot write). A value taken *before*
a read and found unchanged later proves that nothing was committed since, so what the read
returned is still the committed state (the daemon's reply cache, `agenthost.reply_cache`).

One `ReadView` belongs to one thread (its caller); it is not a pool.
"""

from __future__ import annotations

import contextlib

import apsw

from storage.models import ForkOperation, Session
from storage.rows import ProjectionCache, load_op, require_session
from storage.sqlite import open_connection

READ_BUSY_TIMEOUT_MS = 50
"""A WAL reader waits only in SQLite's rare recovery cases; past this the caller gets
`apsw.BusyError` and may retry elsewhere (the daemon falls back to its reader pool)."""


class ReadView:
    """A read-only connection for point reads; see the module docstring."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_ms: int = READ_BUSY_TIMEOUT_MS,
        projections: ProjectionCache | None = None,
    ) -> None:
        self.path = path
        # The store's cache of committed projections (`Database.projections`), shared with
        # it; None: each committed read rebuilds its projection.
        self._projections = projections
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: apsw.Connection | None = None
        self._closed = False

    def _connection(self) -> apsw.Connection:
        conn = self._conn
        if conn is None:
            if self._closed:
                raise RuntimeError("read view is closed")
            conn = open_connection(self.path, self._busy_timeout_ms)
            conn.execute("PRAGMA query_only=1")
            self._conn = conn
        return conn

    def generation(self) -> int:
        """The database's commit generation as this connection sees it now (a read
        transaction of its own, ended before it returns); see the module docstring. Take it
        before the reads it stamps: a commit between the two then only makes it stale."""
        value = self._connection().execute("PRAGMA data_version").get
        assert isinstance(value, int)
        return value

    def get_session(self, ws: str, sid: str) -> Session:
        """The live Session, or `SessionNotFound`; one statement, so one snapshot."""
        conn = self._connection()
        return require_session(conn, ws, sid)

    def session_exists(self, ws: str, sid: str) -> bool:
        """Whether the live (not deleted) Session exists — `get_session` without building
        the Session: what routing a request to its Session actor needs."""
        row = (
            self._connection()
            .execute(
                "SELECT 1 FROM sessions WHERE workspace_id = ? AND session_id = ? AND deleted = 0",
                (ws, sid),
            )
            .fetchone()
        )
        return row is not None

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation:
        """The operation (a committed one with its child projection). Its row is one
        statement; a committed one's snapshot, read by a second, never changes once written."""
        return load_op(self._connection(), ws, op_id, projections=self._projections)

    @property
    def in_transaction(self) -> bool:
        """True while a read holds a snapshot (never between two reads)."""
        return self._conn is not None and self._conn.txn_state() != apsw.SQLITE_TXN_NONE

    def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(apsw.Error):
                conn.close()
