"""The records of fork mutations, one per boundary, with the bookkeeping of each (its timers
and attempt counters), the indexes by operation and by target session, and the pruning of
settled records beyond `max_settled`.

Every method expects the caller to hold the Engine's lock (`ChangeFeed.lock`); a changed
record is published on the feed as a `mutation` change.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from client.engine.changes import ChangeFeed
from client.engine.ports import Timer
from client.engine.values import BoundaryKey, ChangeKind, EngineChange, ForkMutation


@dataclass(slots=True)
class Slot:
    """Mutable bookkeeping of one record (timers, attempt counters); never leaves the Engine."""

    attempt: int = 0
    create_timer: Timer | None = None
    poll_timer: Timer | None = None
    ack_attempt: int = 0
    ack_handled: int = 0
    ack_failures: int = 0
    ack_timer: Timer | None = None
    ack_retry: Timer | None = None
    settled_seq: int = 0

    def cancel_all(self) -> None:
        for timer in (self.create_timer, self.poll_timer, self.ack_timer, self.ack_retry):
            if timer is not None:
                timer.cancel()
        self.create_timer = self.poll_timer = self.ack_timer = self.ack_retry = None


class MutationRecords:
    """The fork mutations of one Engine by boundary key, and their slots and indexes."""

    def __init__(self, feed: ChangeFeed, max_settled: int) -> None:
        self._feed = feed
        self.max_settled = max_settled
        self._records: dict[BoundaryKey, ForkMutation] = {}
        self._slots: dict[BoundaryKey, Slot] = {}
        self._by_operation: dict[str, BoundaryKey] = {}
        self._by_target: dict[str, BoundaryKey] = {}
        self._settled_seq = itertools.count(1)

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: BoundaryKey) -> ForkMutation | None:
        return self._records.get(key)

    def all(self) -> list[ForkMutation]:
        return list(self._records.values())

    def record_of(self, key: BoundaryKey) -> ForkMutation:
        """The record of a boundary known to have one."""
        return self._records[key]

    def slot(self, key: BoundaryKey) -> Slot | None:
        return self._slots.get(key)

    def slot_of(self, key: BoundaryKey) -> Slot:
        """The slot of a record known to exist (every record has one)."""
        return self._slots[key]

    def tracking(self, operation_id: object) -> list[BoundaryKey]:
        """Every record that already follows this operation."""
        return [k for k, r in self._records.items() if r.operation_id == operation_id]

    def by_operation(self, operation_id: str) -> BoundaryKey | None:
        return self._by_operation.get(operation_id)

    def by_target(self, target_session_id: str) -> BoundaryKey | None:
        return self._by_target.get(target_session_id)

    # -- writes ------------------------------------------------------------------------------

    def open(self, record: ForkMutation) -> Slot:
        """A new record with fresh bookkeeping (its boundary must hold none)."""
        slot = Slot()
        self._slots[record.key] = slot
        self.put(record)
        return slot

    def put(self, record: ForkMutation) -> None:
        if self._records.get(record.key) == record:
            return
        self._records[record.key] = record
        self.index(record)
        self._feed.publish(EngineChange(ChangeKind.MUTATION, key=record.key))

    def index(self, record: ForkMutation) -> None:
        if record.operation_id is not None:
            self._by_operation[record.operation_id] = record.key
        self._by_target[record.target_session_id] = record.key

    def forget(self, key: BoundaryKey) -> None:
        record = self._records.pop(key, None)
        slot = self._slots.pop(key, None)
        if slot is not None:
            slot.cancel_all()
        if record is not None:
            if (
                record.operation_id is not None
                and self._by_operation.get(record.operation_id) == key
            ):
                del self._by_operation[record.operation_id]
            if self._by_target.get(record.target_session_id) == key:
                del self._by_target[record.target_session_id]

    def settle(self, key: BoundaryKey) -> None:
        """Stamp a settled record and prune the oldest settled ones beyond `max_settled`."""
        slot = self._slots.get(key)
        if slot is not None and slot.settled_seq == 0:
            slot.settled_seq = next(self._settled_seq)
        settled = [(self._slots[k].settled_seq, k) for k, r in self._records.items() if r.settled]
        excess = len(settled) - self.max_settled
        if excess > 0:
            for _, old in sorted(settled)[:excess]:
                self.forget(old)
                self._feed.publish(EngineChange(ChangeKind.MUTATION, key=old))

    def cancel_timers(self) -> None:
        """Stop every record's timers (ACK retries included): the Engine is closing."""
        for slot in self._slots.values():
            slot.cancel_all()
