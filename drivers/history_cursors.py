"""Histories a worker read for `session.history` and holds for the pages that follow.

A history past one page is answered page by page (`domain.worker_messages.history_page`); each
page asked again read the provider's whole history again (a 70 MiB Claude transcript: ~9 reads
for one `session.history`). The first page's read is held under a cursor the answer names
(`historyCursor`), and the next pages are cut from it. Bounded: a cursor not asked for again
within `HOLD_SECONDS` is dropped, at most `HELD_MOST` are held and at most `HELD_MOST_CHARS`
of their Turns' text (the oldest dropped first; the newest is held whatever its size); the last
page drops its cursor. A page whose cursor is gone is answered from a new read, as
before."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.worker_messages import history_turn_chars

HOLD_SECONDS = 60.0
"""How long a held history waits for its next page's request."""

HELD_MOST = 4
"""The most histories a worker holds at once."""

HELD_MOST_CHARS = 128 << 20
"""The most characters of Turn text (`history_turn_chars`) a worker holds at once, all held
histories together: two 64 Mi-character histories (a Tutti Agent's history is bounded by its
app-server's 64 MiB line, a Claude transcript by nothing), not four."""


@dataclass(frozen=True, slots=True)
class HeldHistory:
    """One read: the driver's answer (its `turns` whole) and the `final` judged before it."""

    answer: Mapping[str, Any]
    turns: Sequence[Mapping[str, Any]]
    final: bool

    def chars(self) -> int:
        """Its Turns' size as a page counts it."""
        return sum(history_turn_chars(turn) for turn in self.turns)


class HistoryCursors:
    """The held histories by cursor, each with the time it is dropped at."""

    def __init__(
        self,
        hold_seconds: float = HOLD_SECONDS,
        most: int = HELD_MOST,
        clock: Callable[[], float] = time.monotonic,
        most_chars: int = HELD_MOST_CHARS,
    ) -> None:
        self._hold = hold_seconds
        self._most = most
        self._most_chars = most_chars
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, tuple[HeldHistory, float, int]] = OrderedDict()
        self._chars = 0

    def hold(self, held: HeldHistory) -> str:
        """Hold `held` under a new cursor, dropping the oldest past `most` histories or past
        `most_chars` in all (never `held` itself: a page cut from it is one read, not many)."""
        cursor = uuid.uuid4().hex
        size = held.chars()
        with self._lock:
            self._expire()
            self._held[cursor] = (held, self._clock() + self._hold, size)
            self._chars += size
            while len(self._held) > 1 and (
                len(self._held) > self._most or self._chars > self._most_chars
            ):
                self._pop(next(iter(self._held)))
        return cursor

    @property
    def chars(self) -> int:
        """The characters held now (`HeldHistory.chars`, summed)."""
        with self._lock:
            self._expire()
            return self._chars

    def take(self, cursor: str) -> HeldHistory | None:
        """The history held under `cursor` (its time to be dropped starts again), or None."""
        with self._lock:
            self._expire()
            entry = self._held.get(cursor)
            if entry is None:
                return None
            self._held[cursor] = (entry[0], self._clock() + self._hold, entry[2])
            return entry[0]

    def drop(self, cursor: str) -> None:
        with self._lock:
            self._pop(cursor)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._held)

    def _expire(self) -> None:
        now = self._clock()
        for cursor in [c for c, (_, until, _) in self._held.items() if until <= now]:
            self._pop(cursor)

    def _pop(self, cursor: str) -> None:
        entry = self._held.pop(cursor, None)
        if entry is not None:
            self._chars -= entry[2]
