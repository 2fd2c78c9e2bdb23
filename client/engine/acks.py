"""The client-observed ACK of a committed fork (seed 000 §8.3): `fork.acknowledge` with a
deadline per attempt and capped backoff between retries, until the daemon confirms it
(`AckState.PENDING` → `AckState.OBSERVED`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import cast

from client.engine.calls import WorkspaceCalls
from client.engine.changes import ChangeFeed
from client.engine.ports import Scheduler
from client.engine.records import MutationRecords
from client.engine.values import AckState, BoundaryKey
from protocol.methods import FORK_ACKNOWLEDGE, OperationParams, OperationResult
from transport.client import ClientClosed, Reply


class Acknowledgements:
    """Sends and retries the ACK of each committed, adopted mutation."""

    def __init__(
        self,
        feed: ChangeFeed,
        records: MutationRecords,
        calls: WorkspaceCalls,
        scheduler: Scheduler,
        *,
        deadline: float,
        backoff: tuple[float, ...],
    ) -> None:
        self._feed = feed
        self._records = records
        self._calls = calls
        self._scheduler = scheduler
        self.deadline = deadline
        self.backoff = backoff

    def send_locked(self, key: BoundaryKey) -> None:
        """Send the next ACK attempt of a committed record; the caller holds the lock."""
        slot, record = self._records.slot_of(key), self._records.record_of(key)
        slot.ack_attempt += 1
        attempt = slot.ack_attempt
        self._records.put(replace(record, ack_attempts=record.ack_attempts + 1))
        slot.ack_timer = self._scheduler.call_later(
            self.deadline,
            lambda: self._on_failed(key, attempt, f"no reply within {self.deadline:g} s"),
        )
        future = self._calls.submit(
            FORK_ACKNOWLEDGE,
            OperationParams(
                workspaceId=self._calls.workspace_id, operationId=cast(str, record.operation_id)
            ),
        )
        if future is not None:
            future.add_done_callback(lambda f: self._on_reply(key, attempt, f))

    def next_retry_delay(self, key: BoundaryKey) -> float | None:
        """The backoff the next ACK failure of this record would wait."""
        with self._feed.lock:
            slot = self._records.slot(key)
            if slot is None:
                return None
            return self.backoff[min(slot.ack_failures, len(self.backoff) - 1)]

    def _on_reply(
        self, key: BoundaryKey, attempt: int, future: Future[Reply[OperationResult]]
    ) -> None:
        try:
            reply = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001
            self._on_failed(key, attempt, str(exc))
            return
        error = reply.error()
        if error is not None:
            self._on_failed(key, attempt, str(error.get("reason", reply.status)))
            return
        with self._feed.lock:
            slot, record = self._records.slot(key), self._records.get(key)
            if slot is None or record is None or record.ack is AckState.OBSERVED:
                return
            # Any successful ACK of this operation (even a late one) is an observation.
            for timer in (slot.ack_timer, slot.ack_retry):
                if timer is not None:
                    timer.cancel()
            slot.ack_timer = slot.ack_retry = None
            self._records.put(replace(record, ack=AckState.OBSERVED, error=None))
            self._records.settle(key)
        self._feed.flush()

    def _on_failed(self, key: BoundaryKey, attempt: int, why: str) -> None:
        with self._feed.lock:
            slot, record = self._records.slot(key), self._records.get(key)
            if self._feed.closed or slot is None or record is None:
                return
            # The deadline and a late error reply of one attempt must schedule one retry only.
            if record.ack is not AckState.PENDING or attempt != slot.ack_attempt:
                return
            if slot.ack_handled >= attempt:
                return
            slot.ack_handled = attempt
            if slot.ack_timer is not None:
                slot.ack_timer.cancel()
                slot.ack_timer = None
            delay = self.backoff[min(slot.ack_failures, len(self.backoff) - 1)]
            slot.ack_failures += 1
            slot.ack_retry = self._scheduler.call_later(delay, lambda: self._retry(key))
            self._records.put(replace(record, error=f"ack failed: {why}"))
        self._feed.flush()

    def _retry(self, key: BoundaryKey) -> None:
        with self._feed.lock:
            slot, record = self._records.slot(key), self._records.get(key)
            if (
                self._feed.closed
                or slot is None
                or record is None
                or record.ack is not AckState.PENDING
            ):
                return
            slot.ack_retry = None
            self.send_locked(key)
        self._feed.flush()
