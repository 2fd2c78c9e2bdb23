"""Encoded replies of the point reads, kept while the database is unchanged.

A `session.get` and the `fork.get` of a settled operation are functions of committed state
alone (and of the provider catalog, fixed for the daemon's life). The transport thread keeps
each one's encoded `result` map, keyed by (method, workspace, id), under the generation of
the read view it was read from (`storage.base.ReadView.generation`, SQLite's
`data_version`, taken *before* the read). While that generation is unchanged no connection has
committed anything since, so the bytes are exactly what a fresh read would encode: a repeat
read is answered with them — one `PRAGMA` instead of the SELECT, the row decode, the
projection and the encode.

Invalidation is whole and exact: any commit to the database, by anyone, changes the
generation and the next lookup empties the cache. So a reply is never stale — and under a
steady write load the cache rarely hits (it costs then one `PRAGMA` per point read); it is
for the read-mostly case, a GUI polling its Sessions and operations.

Bounded: at most `max_entries` replies and `max_bytes` bytes (oldest first out); a reply over
`max_reply_bytes` is not kept. Owned by one thread (the transport thread); not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable

DEFAULT_MAX_ENTRIES = 16_384
DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_MAX_REPLY_BYTES = 64 << 10


class ReplyCache:
    """Packed `result` maps by key, valid for one database generation; see the module
    docstring."""

    __slots__ = (
        "_entries",
        "_bytes",
        "_generation",
        "max_entries",
        "max_bytes",
        "max_reply_bytes",
        "hits",
    )

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self._entries: dict[Hashable, bytes] = {}
        self._bytes = 0
        self._generation: int | None = None
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_reply_bytes = max_reply_bytes
        self.hits = 0
        """Replies answered from the cache (tests pin the path with it)."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, generation: int, key: Hashable) -> bytes | None:
        """The packed result kept for `key` at `generation` (the view's generation now), or
        None. A new generation empties the cache first: everything in it may be stale."""
        if generation != self._generation:
            self._entries.clear()
            self._bytes = 0
            self._generation = generation
            return None
        packed = self._entries.get(key)
        if packed is not None:
            self.hits += 1
        return packed

    def put(self, generation: int, key: Hashable, packed: bytes) -> None:
        """Keep `packed`, read under `generation` (taken before the read): kept only if that
        is still the cache's generation."""
        if (
            generation != self._generation
            or len(packed) > min(self.max_reply_bytes, self.max_bytes)
            or self.max_entries <= 0
        ):
            return
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        while entries and (
            len(entries) >= self.max_entries or self._bytes + len(packed) > self.max_bytes
        ):
            oldest = next(iter(entries))
            self._bytes -= len(entries.pop(oldest))
        entries[key] = packed
        self._bytes += len(packed)
