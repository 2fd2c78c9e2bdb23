"""What one `Store` remembers between a fork's prepare and its commit, keyed by the frozen
snapshot's hash: the snapshot document prepare froze (so the commit, having hashed the stored
bytes, skips a second decode of a multi-MB text) and the child's ids and remapped Message rows
(a pure function of those bytes, minted once for prepare's dry run and the commit). Owned by
the store instance that fills it, bounded, and released by the commit; a miss (another store,
a restart, an eviction) recomputes the same values.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Generic, TypeVar

V = TypeVar("V")

FROZEN_BUDGET_CHARS = 8_000_000
"""Encoded snapshot bytes held in all; a bigger single snapshot is not held."""
HISTORY_SIZE = 8
"""Operations between prepare and commit whose child histories are held."""
HISTORY_BUDGET_ROWS = 60_000
"""Message rows held in all (~20 MB at most)."""


class _Bounded(Generic[V]):
    """An LRU of `key → (value, weight)` bounded by entries and total weight (the newest entry
    is always kept)."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._max_entries = max_entries
        self._max_weight = max_weight

    def put(self, key: str, value: V, weight: int) -> None:
        with self._lock:
            self._items[key] = (value, weight)
            self._items.move_to_end(key)
            total = sum(w for _, w in self._items.values())
            while len(self._items) > 1 and (
                len(self._items) > self._max_entries or total > self._max_weight
            ):
                _, (_, dropped) = self._items.popitem(last=False)
                total -= dropped

    def get(self, key: str, *, take: bool = False) -> V | None:
        with self._lock:
            held = self._items.pop(key, None) if take else self._items.get(key)
            if held is None:
                return None
            if not take:
                self._items.move_to_end(key)
            return held[0]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class ForkMemo:
    """The two memos of one store: frozen snapshot documents and child histories."""

    def __init__(self) -> None:
        self.frozen: _Bounded[dict[str, Any]] = _Bounded(1_000_000, FROZEN_BUDGET_CHARS)
        self.histories: _Bounded[Any] = _Bounded(HISTORY_SIZE, HISTORY_BUDGET_ROWS)

    def remember_frozen(self, digest: str, document: dict[str, Any], size: int) -> None:
        if size <= FROZEN_BUDGET_CHARS:
            self.frozen.put(digest, document, size)

    def take_frozen(self, digest: str) -> dict[str, Any] | None:
        """Taken once: the commit is the only consumer, and no reader can mutate a document
        another reader holds."""
        return self.frozen.get(digest, take=True)
