"""The index of `unknown` fork operations this Engine has seen (its own forks' replies, any
client's `fork.operation` events, `fork.resolve` results), by source and boundary Turn: what
a view marks and offers Inspect / Adopt / Abandon for.
"""

from __future__ import annotations

from client.engine.changes import ChangeFeed
from client.engine.values import ChangeKind, EngineChange
from protocol.objects import Operation


class UnknownOperations:
    """Operations last seen `unknown`, by operation id; a later copy in another status drops one."""

    def __init__(self, feed: ChangeFeed) -> None:
        self._feed = feed
        self._unknown: dict[str, Operation] = {}

    def of_source(self, source_session_id: str) -> dict[str, Operation]:
        """The `unknown` operations of a source, by boundary Turn id."""
        with self._feed.lock:
            return {
                str((op.get("point") or {}).get("turnId")): op.copy()
                for op in self._unknown.values()
                if op.get("sourceAgentSessionId") == source_session_id
            }

    def note_locked(self, op: Operation) -> None:
        """Record what this copy of an operation says; the caller holds the lock. A change of
        the set is published as an `operation` change on the source and boundary Turn."""
        op_id = op.get("operationId")
        if not isinstance(op_id, str):
            return
        point = op.get("point") or {}
        where = (str(op.get("sourceAgentSessionId")), str(point.get("turnId")))
        if op.get("status") == "unknown":
            if self._unknown.get(op_id) != op:
                self._unknown[op_id] = op.copy()
                self._feed.publish(EngineChange(ChangeKind.OPERATION, key=where))
        elif self._unknown.pop(op_id, None) is not None:
            self._feed.publish(EngineChange(ChangeKind.OPERATION, key=where))
