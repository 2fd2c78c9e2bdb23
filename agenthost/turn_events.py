"""What a `turn.updated` event carries: the Turn's fields plus only the messages
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
and the store position of every message the last event described. It is dropped when the Turn
settles and bounded in number, so forgetting a Turn only makes its next event whole.

Reading, not only sending, is bounded by what changed (`updated_turn`): the publisher hands
the store those positions with running version totals (`HistoryStore.turn_since`), which
finds the first changed message with one-row aggregate statements and fetches only the
messages from it on; the Turn row and its interactions are read whole. So a Turn of N
messages does not cost O(N) decoded rows and projected messages per change (O(N²) over its
life), and the event is the one a whole read and a comparison would give.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from protocol.events import EventTurn, InteractionsTruncatedTurn
from protocol.objects import Interaction, Message, Turn
from storage.models import Turn as StoredTurn
from storage.models import TurnTail

MAX_TRACKED_TURNS = 4096
"""Active Turns whose last-published messages are remembered (far above the runtimes a
daemon runs at once); the least recently published beyond it gets a whole event next."""

_Key = tuple[str, str, str]


@dataclass(slots=True)
class _Seen:
    """What a Turn's last event described: (messageId, version) per message, and, when it was
    read from the store, (position, running version total) per message for `turn_since`."""

    keys: list[tuple[str, int]]
    marks: list[tuple[int, int]] | None


class TurnTails(Protocol):
    """`store.history`'s read of a Turn from its first changed message."""

    def turn_since(
        self, ws: str, sid: str, turn_id: str, seen: Sequence[tuple[int, int]] | None
    ) -> TurnTail: ...


class TurnReader(Protocol):
    """The store read `updated_turn` needs (`storage.Store` has it)."""

    @property
    def history(self) -> TurnTails: ...


def _size(value: Any) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def bounded_turn(
    turn: Turn, max_bytes: int, run: tuple[int, int] | None = None
) -> Turn | EventTurn:
    """`turn` as one event carries it: a Turn whose encoding fits `max_bytes` unchanged; a
    bigger one keeps every field but only its latest messages that fit, with
    `messagesTruncated: true`, `messageCount` and `messagesFrom`. `run` = (messageCount,
    messagesFrom) when `turn`'s messages are only a run of the Turn's: it is said so even if
    it fits."""
    event: Turn | EventTurn = turn
    if run is not None:
        event = {
            **turn,
            "messagesTruncated": True,
            "messageCount": run[0],
            "messagesFrom": run[1],
        }
    if _size(event) <= max_bytes:
        return event
    messages = list(turn["messages"])
    count, start = run if run is not None else (len(messages), 0)
    kept: list[Message] = []
    budget = max_bytes // 2  # room for the other fields and interactions
    for message in reversed(messages):
        size = _size(message)
        if size > budget:
            break
        budget -= size
        kept.append(message)
    kept.reverse()
    bounded: EventTurn = {
        **turn,
        "messages": kept,
        "messagesTruncated": True,
        "messageCount": count,
        "messagesFrom": start + len(messages) - len(kept),
    }
    if not turn["interactions"] or _size(bounded) <= max_bytes:
        return bounded
    return _bounded_interactions(bounded, max_bytes)


def _bounded_interactions(turn: EventTurn, max_bytes: int) -> InteractionsTruncatedTurn:
    """`turn` with the Interactions that do not fit what `max_bytes` leaves of it carried
    without their `input` and `output` (`{}`; `output` stays null while unanswered) and
    `omitted: true`, the Turn with `interactionsTruncated: true`: a question, an answer or a
    plan may take most of a request each, and every event of their Turn carried them whole.
    Kept in order, the earliest first while they fit."""
    interactions = turn["interactions"]
    budget = max_bytes - _size({**turn, "interactions": []}) - 64
    carried: list[Interaction] = []
    for interaction in interactions:
        size = _size(interaction)
        if size <= budget:
            budget -= size
            carried.append(interaction)
            continue
        output = interaction["output"]
        stub: Interaction = {
            **interaction,
            "input": {},
            "output": None if output is None else {},
            "omitted": True,
        }
        budget -= _size(stub)
        carried.append(stub)
    return {**turn, "interactions": carried, "interactionsTruncated": True}


class TurnDeltas:
    """Turns each projected Turn into what its `turn.updated` carries; one thread only."""

    def __init__(self, max_turns: int = MAX_TRACKED_TURNS) -> None:
        self._seen: OrderedDict[_Key, _Seen] = OrderedDict()
        self._max_turns = max_turns

    def __len__(self) -> int:
        return len(self._seen)

    def forget(self, key: _Key) -> None:
        """Drop what this Turn's last event carried: its next event is whole (an event of it
        was not published, e.g. nobody subscribed)."""
        self._seen.pop(key, None)

    def marks(self, key: _Key) -> Sequence[tuple[int, int]] | None:
        """What `turn_since` needs of this Turn's last event (None: read the Turn whole)."""
        seen = self._seen.get(key)
        return None if seen is None else seen.marks

    def event_turn(self, key: _Key, turn: Turn, max_bytes: int) -> Turn | EventTurn:
        """The `turn` of this Turn's next `turn.updated` (`turn` is its whole projection)."""
        return self.event_tail(key, turn, messages_from=0, positions=None, max_bytes=max_bytes)

    def event_tail(
        self,
        key: _Key,
        turn: Turn,
        *,
        messages_from: int,
        positions: Sequence[int] | None,
        max_bytes: int,
    ) -> Turn | EventTurn:
        """The `turn` of this Turn's next `turn.updated`, from a projection whose messages are
        the Turn's from ordinal `messages_from` on (0: the whole Turn) and their store
        `positions` (None: not read from the store)."""
        tail = list(turn["messages"])
        before = self._seen.pop(key, None)
        if turn["phase"] != "active":
            return bounded_turn(turn, max_bytes)  # settled: whole, and forgotten
        if messages_from and (before is None or before.marks is None):
            raise ValueError("a partial read needs the marks it was read against")
        # A partial read extends the last event's lists in place (O(messages read), not
        # O(Turn)); a whole read builds new ones and keeps the old keys to compare with.
        partial = before is not None and messages_from > 0
        keys = before.keys if partial and before is not None else []
        del keys[messages_from:]
        added = [(m["messageId"], m["version"]) for m in tail]
        keys.extend(added)
        marks: list[tuple[int, int]] | None = None
        if positions is not None and len(positions) == len(tail):
            marks = before.marks if partial and before is not None else None
            if marks is None:
                marks = []
            del marks[messages_from:]
            total = marks[-1][1] if marks else 0
            for position, (_, version) in zip(positions, added, strict=True):
                total += version
                marks.append((position, total))
        self._seen[key] = _Seen(keys, marks)
        if len(self._seen) > self._max_turns:
            self._seen.popitem(last=False)
        if before is None:
            return bounded_turn(turn, max_bytes)
        # A partial read starts at the first change already (the store found it); a read from
        # ordinal 0 is cut where it first differs from the last event, as a whole one is.
        start = messages_from or _first_change(before.keys, keys)
        return bounded_turn(
            {**turn, "messages": list(tail[start - messages_from :])},
            max_bytes,
            (len(keys), start),
        )


def updated_turn(
    store: TurnReader,
    deltas: TurnDeltas,
    key: _Key,
    project: Callable[[StoredTurn], Turn],
    max_bytes: int,
) -> Turn | EventTurn:
    """The `turn` of a `turn.updated` for a change of Turn `key` = (workspace, session, turn):
    read from the store only from the first message changed since this Turn's last event
    (whole for its first event and once settled), projected with `project`, then cut."""
    tail = store.history.turn_since(*key, deltas.marks(key))
    return deltas.event_tail(
        key,
        project(tail.turn),
        messages_from=tail.messages_from,
        positions=[m.position for m in tail.turn.messages],
        max_bytes=max_bytes,
    )


def _first_change(before: Sequence[tuple[str, int]], now: Sequence[tuple[str, int]]) -> int:
    """The ordinal of the first message added or changed (or `len(now)`: none)."""
    for index, (old, new) in enumerate(zip(before, now, strict=False)):
        if old != new:
            return index
    return min(len(before), len(now))
