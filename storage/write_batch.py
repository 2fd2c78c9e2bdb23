"""One thread's batch of writes (`Database.write_batch`): each write a nested savepoint of
the batch's one group member, its events handed to the batch and published after the COMMIT
that holds them all, so a Session actor's queued Turn writes land together."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import apsw

from domain.errors import StoreBusy
from storage.sqlite import typed_store_error
from storage.tx import Tx


class WriteBatch:
    """One thread's `Database.write_batch`: the member transaction its writes nest in, and
    why the batch was lost (set when SQLite aborted the transaction under it)."""

    __slots__ = ("tx", "thread", "broken")

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.thread = threading.get_ident()
        self.broken: str | None = None


@contextmanager
def batch_item(
    batch: WriteBatch,
    workspace_id: str | None,
    fence: str | None,
    now_ms: int,
    count: Callable[[bool], None],
) -> Iterator[Tx]:
    """One write inside a batch: a nested savepoint; a write that raises rolls back alone
    (`count(True)`), one that lands hands its events to the batch (`count(False)`). If SQLite
    aborted the whole transaction, the batch is marked lost and nothing of it will be written."""
    if batch.broken is not None:
        raise StoreBusy(f"the store lost this batch of writes, try again ({batch.broken})")
    conn = batch.tx.conn
    tx = Tx(conn, workspace_id, now_ms)
    try:
        conn.execute("SAVEPOINT agenthost_item")
        try:
            if fence is not None:
                tx.check_fence(fence)
            yield tx
        except BaseException as exc:
            count(True)
            try:
                if conn.getautocommit():
                    raise apsw.SQLError("the transaction was rolled back")
                conn.execute("ROLLBACK TO agenthost_item")
                conn.execute("RELEASE agenthost_item")
            except apsw.Error:
                # The whole transaction is gone: nothing of the batch will be written.
                batch.broken = type(exc).__name__
            raise
        conn.execute("RELEASE agenthost_item")
    except BaseException as exc:
        if conn.getautocommit() and batch.broken is None:
            batch.broken = type(exc).__name__
        typed = typed_store_error(exc)
        if typed is not None and typed is not exc:
            raise typed from exc
        raise
    for event in tx.events:
        batch.tx.emit(event)
    count(False)
