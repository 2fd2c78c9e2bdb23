"""Histories a worker read for `session.history` and holds for the pages that follow.

A history past one page is answered page by page (`domain.worker_messages.history_page`); each
page asked again read the provider's whole history again (a 70 MiB Claude transcript: ~9 reads
for one `session.history`). The first page's read is held under a cursor the answer names
(`historyCursor`), and the next pages are cut from it. Bounded: a cursor not asked for again
within `HOLD_SECONDS` is dropped, and at most `HELD_MOST` are held (the oldest dropped first);
the last page drops its cursor. A page whose cursor is gone is answered from a new read, as
before."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HOLD_SECONDS = 60.0
"""How long a held history waits for its next page's request."""

HELD_MOST = 4
"""The most histories a worker holds at once."""


@dataclass(frozen=True, slots=True)
class HeldHistory:
    """One read: the driver's answer (its `turns` whole) and the `final` judged before it."""

    answer: Mapping[str, Any]
    turns: Sequence[Mapping[str, Any]]
    final: bool


class HistoryCursors:
    """The held histories by cursor, each with the time it is dropped at."""

    def __init__(
        self,
        hold_seconds: float = HOLD_SECONDS,
        most: int = HELD_MOST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hold = hold_seconds
        self._most = most
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, tuple[HeldHistory, float]] = OrderedDict()

    def hold(self, held: HeldHistory) -> str:
        """Hold `held` under a new cursor (dropping the oldest past `most`)."""
        cursor = uuid.uuid4().hex
        with self._lock:
            self._expire()
            self._held[cursor] = (held, self._clock() + self._hold)
            while len(self._held) > self._most:
                self._held.popitem(last=False)
        return cursor

    def take(self, cursor: str) -> HeldHistory | None:
        """The history held under `cursor` (its time to be dropped starts again), or None."""
        with self._lock:
            self._expire()
            entry = self._held.get(cursor)
            if entry is None:
                return None
            self._held[cursor] = (entry[0], self._clock() + self._hold)
            return entry[0]

    def drop(self, cursor: str) -> None:
        with self._lock:
            self._held.pop(cursor, None)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._held)

    def _expire(self) -> None:
        now = self._clock()
        for cursor in [c for c, (_, until) in self._held.items() if until <= now]:
            del self._held[cursor]
