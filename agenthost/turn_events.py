"""What a `turn.updated` event carries (issue 15 #6): the Turn's fields plus only the messages
added or changed since that Turn's previous `turn.updated`, not the whole Turn every time.

Wire form (docs/protocol.md "Events"): an event whose `turn` has `messagesTruncated: true`
carries the Turn's messages at ordinals `messagesFrom` .. `messageCount - 1` (0-based, in
presentation order; a contiguous run ending at the Turn's last message), every other field
whole. This is the truncated form clients already handle (its "latest messages that fit" are
exactly such a run), with `messagesFrom` now said explicitly. A Turn's first event, its
settling event, and any event after it settled carry the whole Turn (no `messagesTruncated`),
capped at `MAX_EVENT_BYTES` like before; so a client that lost an event heals at settlement,
and a client that only looks at the settled event sees what it always saw.

The daemon's single publishing thread owns a `TurnDeltas`: per active Turn, the (id, version)
of every message the last event described. It is dropped when the Turn settles and bounded in
number, so forgetting a Turn only makes its next event whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

MAX_TRACKED_TURNS = 4096
"""Active Turns whose last-published messages are remembered (far above the runtimes a
daemon runs at once); the least recently published beyond it gets a whole event next."""

_Key = tuple[str, str, str]
_Seen = tuple[tuple[str, int], ...]


def _size(value: Any) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def bounded_turn(turn: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """`turn` as one event carries it: a Turn (or a run of its messages) whose encoding fits
    `max_bytes` unchanged; a bigger one keeps every field but only its latest messages that
    fit, with `messagesTruncated: true`, `messageCount` and `messagesFrom`."""
    out = dict(turn)
    if _size(out) <= max_bytes:
        return out
    messages = list(out.get("messages") or [])
    count = int(out.get("messageCount", len(messages)))
    start = int(out.get("messagesFrom", count - len(messages)))
    kept: list[Any] = []
    budget = max_bytes // 2  # room for the other fields and interactions
    for message in reversed(messages):
        size = _size(message)
        if size > budget:
            break
        budget -= size
        kept.append(message)
    kept.reverse()
    return {
        **out,
        "messages": kept,
        "messagesTruncated": True,
        "messageCount": count,
        "messagesFrom": start + len(messages) - len(kept),
    }


class TurnDeltas:
    """Turns each projected Turn into what its `turn.updated` carries; one thread only."""

    def __init__(self, max_turns: int = MAX_TRACKED_TURNS) -> None:
        self._seen: OrderedDict[_Key, _Seen] = OrderedDict()
        self._max_turns = max_turns

    def __len__(self) -> int:
        return len(self._seen)

    def event_turn(self, key: _Key, turn: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
        """The `turn` of this Turn's next `turn.updated` (`turn` is its whole projection)."""
        messages: Sequence[Mapping[str, Any]] = list(turn.get("messages") or [])
        now: _Seen = tuple((str(m.get("messageId")), int(m.get("version") or 0)) for m in messages)
        before = self._seen.pop(key, None)
        if turn.get("phase") != "active":
            return bounded_turn(turn, max_bytes)  # settled: whole, and forgotten
        self._seen[key] = now
        if len(self._seen) > self._max_turns:
            self._seen.popitem(last=False)
        if before is None:
            return bounded_turn(turn, max_bytes)
        start = _first_change(before, now)
        return bounded_turn(
            {
                **turn,
                "messages": list(messages[start:]),
                "messagesTruncated": True,
                "messageCount": len(messages),
                "messagesFrom": start,
            },
            max_bytes,
        )


def _first_change(before: _Seen, now: _Seen) -> int:
    """The ordinal of the first message added or changed (or `len(now)`: none)."""
    for index, (old, new) in enumerate(zip(before, now, strict=False)):
        if old != new:
            return index
    return min(len(before), len(now))
