"""The client-observed ACK of a committed fork (seed 000 §8.3): `fork.acknowledge` with a
deadline per attempt and capped backoff between retries, until the daemon confirms it
(`AckState.PENDING` → `AckState.OBSERVED`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

from client.engine.cache import EngineCache
from client.engine.ports import Reply
from client.engine.values import AckState, BoundaryKey
from transport.client import ClientClosed


class Acknowledgements(EngineCache):
    """Sends and retries the ACK of each committed, adopted mutation."""

    def _send_ack_locked(self, key: BoundaryKey) -> None:
        slot, record = self._slots[key], self._records[key]
        slot.ack_attempt += 1
        attempt = slot.ack_attempt
        self._put_locked(replace(record, ack_attempts=record.ack_attempts + 1))
        slot.ack_timer = self.scheduler.call_later(
            self.ack_deadline,
            lambda: self._on_ack_failed(key, attempt, f"no reply within {self.ack_deadline:g} s"),
        )
        future = self._submit(
            "fork.acknowledge",
            {"workspaceId": self.workspace_id, "operationId": record.operation_id},
        )
        if future is not None:
            future.add_done_callback(lambda f: self._on_ack_reply(key, attempt, f))

    def _on_ack_reply(self, key: BoundaryKey, attempt: int, future: Future[Reply]) -> None:
        try:
            status, body = future.result()
        except ClientClosed:
            return
        except Exception as exc:  # noqa: BLE001
            self._on_ack_failed(key, attempt, str(exc))
            return
        if status >= 400:
            self._on_ack_failed(key, attempt, str(body.get("reason", status)))
            return
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if slot is None or record is None or record.ack is AckState.OBSERVED:
                return
            # Any successful ACK of this operation (even a late one) is an observation.
            for timer in (slot.ack_timer, slot.ack_retry):
                if timer is not None:
                    timer.cancel()
            slot.ack_timer = slot.ack_retry = None
            self._put_locked(replace(record, ack=AckState.OBSERVED, error=None))
            self._settle_locked(key)
        self._flush()

    def _on_ack_failed(self, key: BoundaryKey, attempt: int, why: str) -> None:
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if self._closed or slot is None or record is None:
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
            delay = self.ack_backoff[min(slot.ack_failures, len(self.ack_backoff) - 1)]
            slot.ack_failures += 1
            slot.ack_retry = self.scheduler.call_later(delay, lambda: self._retry_ack(key))
            self._put_locked(replace(record, error=f"ack failed: {why}"))
        self._flush()

    def _retry_ack(self, key: BoundaryKey) -> None:
        with self._lock:
            slot, record = self._slots.get(key), self._records.get(key)
            if self._closed or slot is None or record is None or record.ack is not AckState.PENDING:
                return
            slot.ack_retry = None
            self._send_ack_locked(key)
        self._flush()

    def next_ack_retry_delay(self, source_session_id: str, turn_id: str) -> float | None:
        """The backoff the next ACK failure of this record would wait (for tests and views)."""
        with self._lock:
            slot = self._slots.get((source_session_id, turn_id))
            if slot is None:
                return None
            return self.ack_backoff[min(slot.ack_failures, len(self.ack_backoff) - 1)]
