"""The index of `unknown` fork operations this Engine has seen (its own forks' replies, any
client's `fork.operation` events, `fork.resolve` results), by source and boundary Turn: what
a view marks and offers Inspect / Adopt / Abandon for.

A terminal status (`committed`, `failed`, `abandoned`) is final: the daemon never moves an
operation out of it. Copies of one operation reach the Engine on different threads, though (a
`fork.resolve` reply on the caller's, events on the event pump's), so an `unknown` copy built
before the operation was resolved can arrive after the terminal one: the event `fork.resolve`
publishes as it begins an Abandon is read back before the abandon commits, and may be taken
off the events socket after the reply that says `abandoned`. Such a copy is stale
(`is_stale_locked`): it puts no mark back (and `Reconciliation` moves no record with it).
"""

from __future__ import annotations

from client.engine.changes import ChangeFeed
from client.engine.values import ChangeKind, EngineChange
from protocol.objects import Operation

TERMINAL = frozenset({"committed", "failed", "abandoned"})
"""The statuses an operation never leaves."""

FINAL_REMEMBERED = 4096
"""Operations remembered as terminal (the oldest forgotten first): a stale copy arrives within
moments of its terminal one, not thousands of operations later."""


class UnknownOperations:
    """Operations last seen `unknown`, by operation id; a later copy in another status drops one."""

    def __init__(self, feed: ChangeFeed, final_remembered: int = FINAL_REMEMBERED) -> None:
        self._feed = feed
        self._unknown: dict[str, Operation] = {}
        # Operation ids seen in a terminal status, oldest first (a dict kept as an ordered set).
        self._final: dict[str, None] = {}
        self._final_remembered = final_remembered

    def of_source(self, source_session_id: str) -> dict[str, Operation]:
        """The `unknown` operations of a source, by boundary Turn id."""
        with self._feed.lock:
            return {
                str((op.get("point") or {}).get("turnId")): op.copy()
                for op in self._unknown.values()
                if op.get("sourceAgentSessionId") == source_session_id
            }

    def is_stale_locked(self, op: Operation) -> bool:
        """Whether this copy predates a terminal copy of the same operation seen here (its
        status is not terminal, and the operation was seen terminal); the caller holds the
        lock."""
        return op.get("status") not in TERMINAL and op.get("operationId") in self._final

    def note_locked(self, op: Operation) -> None:
        """Record what this copy of an operation says; the caller holds the lock. A change of
        the set is published as an `operation` change on the source and boundary Turn. A stale
        copy (`is_stale_locked`) changes nothing."""
        op_id = op.get("operationId")
        if not isinstance(op_id, str) or self.is_stale_locked(op):
            return
        point = op.get("point") or {}
        where = (str(op.get("sourceAgentSessionId")), str(point.get("turnId")))
        if op.get("status") in TERMINAL:
            self._final.pop(op_id, None)  # re-inserted last: the oldest are forgotten first
            self._final[op_id] = None
            if len(self._final) > self._final_remembered:
                del self._final[next(iter(self._final))]
        if op.get("status") == "unknown":
            if self._unknown.get(op_id) != op:
                self._unknown[op_id] = op.copy()
                self._feed.publish(EngineChange(ChangeKind.OPERATION, key=where))
        elif self._unknown.pop(op_id, None) is not None:
            self._feed.publish(EngineChange(ChangeKind.OPERATION, key=where))
