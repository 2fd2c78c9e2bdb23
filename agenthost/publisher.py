"""The daemon's event publisher: store changes (and streamed deltas) projected onto PUB events in
commit order, on one thread of its own, off the writers' threads.

It works in batches — everything queued when it wakes, up to `BATCH`, handed to the transport
loop in order, in hand-overs of up to `HANDOVER` events read back from the store; a streamed
delta goes (with what was built before it) ahead of the next change read back, so no delta
waits for a read — drops a change that repeats the one right before it, and a Session's or a
fork operation's change that repeats one anywhere earlier in the batch (each event reads the
state after every change of its batch was committed, so the repeat would say the same), and
builds no event for a workspace no connected subscriber wants (`ApiServer.wants`): no store
read, no projection, no encoding. A Turn skipped that way is forgotten by `TurnDeltas`, so its
next event, when someone listens, carries it whole. A Session or fork operation change nobody
wants is dropped before it is even queued (`offer`), so it does not wake the thread at all.

A streamed delta crosses no thread of its own when it need not (`offer_delta`): every producer
counts what it puts on the queue (`_held`, under `_order`) and the thread uncounts a batch once
its events are handed to the transport loop, so a delta that finds nothing queued or in hand
is encoded and handed to the transport right away, on its producer's thread (the worker
supervisor's loop), which sends it on the XPUB itself when the loop's outbox holds no event
(`ApiServer.publish_now`), and one that finds anything there is queued behind it. The count and the
hand-over are one step under `_order`, as every producer's count and put are, so a delta leaves
after every event whose change was offered before it and ahead of every one offered after it,
whichever way it goes (docs/design/internals.md, "A delta's way to the transport").
A Turn's claim or settlement (and its Session's touch) that needs no read takes the same way
(`offer_many`, `_publish_direct`): with nothing queued or in hand it is projected under `_order`
on its writer's thread, the publishing thread idle and owning nothing meanwhile
(docs/design/internals.md, "A Turn's claim and settlement on the writer's thread").

A Session change that carries the row its write left (`SessionChanged.row`) is projected from
it, without a read, when nothing newer of that Session can have been shown (`Shown`): the
store's writes are numbered in commit order (`Tx.seq`), but their events reach this thread in
the order their writers' threads deliver them, so an older row may come after a newer state
was published; that one, and any change of the batch without a row, is read back as before
(docs/design/store.md, "Change events that carry their row"). A Turn change that carries its
Turn (a submit's claim, the Session actor's settlement) is projected from its own row under the
same rule, per Turn (`shown_turns`), and not after its Session's removal was published
(`removed`). A Session change that carries only what its write's `touch` changed (a Turn's claim
and settlement: `SessionChanged.touch`) is built from the newest row this thread knows of that
Session (`Known`) when that row is at exactly the version before the touch's, and then published
under the same rule; else read back (docs/design/store.md, "A Turn's Session events carried").
A fork operation change that carries its row (the saga's steps', the commit's; the ACK emits
none) is projected from it under the same rule, per operation (`shown_ops`), when every change
of that operation in the batch carries one; else read back (docs/design/store.md, "A fork
operation's changes carry their operation"). A fork's child is projected once for its reply and
events (`projection.Children`).
A batch's changes of a Session whose versions are all at or below that of a row already
published (`Published`) are covered: no event, no read (docs/design/store.md, "A Session
change already heard").
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgpack

from actors.ports import ProviderCatalog
from agenthost import projection
from agenthost.turn_events import TurnDeltas, updated_turn
from domain.errors import HostError
from domain.turn_events import PROGRESS
from protocol.envelope import encode_event
from protocol.events import (
    FORK_OPERATION,
    MESSAGE_DELTA,
    SESSION_REMOVED,
    SESSION_UPSERTED,
    TURN_UPDATED,
    Event,
    MessageDelta,
)
from protocol.objects import Operation as WireOperation
from protocol.objects import Session as WireSession
from storage.models import (
    ForkOperation,
    ForkOperationChanged,
    Session,
    SessionChanged,
    TurnChanged,
)
from storage.sqlite import TRANSIENT_ERRORS
from storage.store import Store
from transport.server import MAX_EVENT_BYTES

log = logging.getLogger("agenthost.daemon")

_READ_BACK = (SessionChanged, TurnChanged, ForkOperationChanged)
"""The changes whose event is read from the store (a `StreamDelta` carries its own). The
change types are final (slotted dataclasses, never subclassed): the publishing thread tells
them apart by `type(change) is …` (no `isinstance` call per change and check)."""

_READ_BACK_TYPES = frozenset(_READ_BACK)
_ENTITY_TYPES = frozenset((SessionChanged, ForkOperationChanged))
"""The changes whose event shows an entity's row (a Session's, an operation's)."""

BATCH = 256
"""Changes taken off the queue per wake-up, at most."""

EVENT_SETTINGS_BYTES = MAX_EVENT_BYTES // 2
"""The most bytes of `settings` an event's Session carries: past it they are omitted
(`settingsOmitted`), so a Session's event stays under `MAX_EVENT_BYTES` (its other fields
are bounded far below the other half)."""


def event_session(session: WireSession) -> WireSession:
    """`session` as an event carries it: settings over `EVENT_SETTINGS_BYTES` are sent as
    `{}` with `settingsOmitted: true` (a new map; a projection may be shared). Empty settings
    cost nothing; others one msgpack encoding of them."""
    settings = session["settings"]
    if not settings or len(msgpack.packb(settings, use_bin_type=True)) <= EVENT_SETTINGS_BYTES:
        return session
    capped = session.copy()
    capped["settings"] = {}
    capped["settingsOmitted"] = True
    return capped


def event_operation(operation: WireOperation) -> WireOperation:
    """`operation` as an event carries it: its child Session through `event_session`."""
    child = operation["session"]
    if child is None:
        return operation
    capped = event_session(child)
    if capped is child:
        return operation
    operation = operation.copy()
    operation["session"] = capped
    return operation


SHOWN_REMEMBERED = 4096
"""Sessions whose newest shown write `Shown` keeps; past it the oldest are forgotten, and a
forgotten one is taken to have shown the newest write any forgotten one had."""

HANDOVER = 16
"""Events read back from the store that wait for one another before they are handed to the
transport loop together (one outbox entry): a fork's five to seven events of a batch go as
one, and the first of a long batch waits for at most this many reads."""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A streamed `message.delta` from a worker: published, never stored."""

    workspace_id: str
    session_id: str
    event: Mapping[str, object]
    """The worker's `message.delta` event, as the host↔worker link carried it."""


_K = TypeVar("_K")
_V = TypeVar("_V")


def _keep(entries: dict[_K, _V], key: _K, value: _V, remembered: int) -> tuple[_V, ...]:
    """`entries[key] = value`, re-inserted last so the oldest entries are forgotten first: past
    `remembered` entries the oldest half are dropped, and their values returned (`Shown`,
    `Known` and `Published` bound themselves so)."""
    entries.pop(key, None)
    entries[key] = value
    if len(entries) <= remembered:
        return ()
    return tuple(entries.pop(old) for old in list(entries)[: len(entries) // 2])


class Shown:
    """Per Session (or per Turn), a bound on the newest write any event of it published may
    have shown: the carried row's `seq` for an event built from it; for one read back (or a
    removal), the store's `write_seq` read after the read — every write the read could see has
    a seq at most that. A carried row is published only past its entity's bound; else it is
    read back (the current state, never older than what was shown). Owned by the publishing
    thread."""

    def __init__(self, remembered: int = SHOWN_REMEMBERED) -> None:
        self._latest: dict[tuple[str, ...], int] = {}
        self._remembered = remembered
        self._forgotten = 0
        """The largest bound of a Session forgotten (each one forgotten is taken to be at it)."""

    def bound(self, key: tuple[str, ...]) -> int:
        return self._latest.get(key, self._forgotten)

    def showed(self, key: tuple[str, ...], seq: int) -> None:
        for old in _keep(self._latest, key, max(seq, self._forgotten), self._remembered):
            self._forgotten = max(self._forgotten, old)


class Known:
    """Per Session, the newest row (by its `version`) this thread has: read back, carried by a
    write, or built from a touch. Each is a committed state of its row, exact at its version
    (every change of the row moves the version), whether or not its event was published — the
    base a `SessionTouch` is applied to. Owned by the publishing thread; bounded like `Shown`
    (a Session forgotten is read back at its next touch)."""

    def __init__(self, remembered: int = SHOWN_REMEMBERED) -> None:
        self._rows: dict[tuple[str, str], Session] = {}
        self._remembered = remembered

    def get(self, key: tuple[str, str]) -> Session | None:
        return self._rows.get(key)

    def learn(self, key: tuple[str, str], row: Session) -> None:
        held = self._rows.get(key)
        newest = row if held is None or row.version >= held.version else held
        _keep(self._rows, key, newest, self._remembered)

    def forget(self, key: tuple[str, str]) -> None:
        self._rows.pop(key, None)


class Published:
    """Per Session, the `version` of the newest row an event of it published (carried, built
    from a touch, or read back): a change whose write is at or below it is covered — every
    subscriber connected when that event was sent heard a state at least as new, and one that
    connects later reads the Session after it connects. Owned by the publishing thread;
    bounded like `Known` (a Session forgotten is published again at its next change)."""

    def __init__(self, remembered: int = SHOWN_REMEMBERED) -> None:
        self._versions: dict[tuple[str, str], int] = {}
        self._remembered = remembered

    def get(self, key: tuple[str, str]) -> int | None:
        return self._versions.get(key)

    def showed(self, key: tuple[str, str], version: int) -> None:
        _keep(self._versions, key, max(version, self._versions.get(key, -1)), self._remembered)

    def forget(self, key: tuple[str, str]) -> None:
        self._versions.pop(key, None)


def _entries(item: Any) -> list[Any]:
    """A queue entry's changes: one change, or a delivery's list of them (`offer_many`)."""
    return item if type(item) is list else [item]


def _carries_turn(changes: list[Any]) -> bool:
    """Whether a delivery is a Turn's claim or settlement that needs no store read: a Turn
    change that carries its row, with only changes that carry their row or touch (its
    Session's touch) beside it. Such a delivery may be published on its writer's thread
    (`EventPublisher.offer_many`)."""
    turn = False
    for change in changes:
        kind = type(change)
        if kind is TurnChanged:
            if change.row is None:
                return False
            turn = True
        elif kind is not SessionChanged or change.removed or _reads(change):
            return False
    return turn


def _reads(change: Any) -> bool:
    """Whether `change`'s event is read from the store (a Session or Turn change that carries
    its row is not, unless an older row than one shown: then it is read alone)."""
    kind = type(change)
    if kind is SessionChanged:
        return change.row is None and change.touch is None and not change.removed
    if kind is TurnChanged or kind is ForkOperationChanged:
        return change.row is None
    return False  # a streamed delta, the stop marker


def _newest_ops(
    batch: list[Any],
) -> dict[tuple[str, str], tuple[int, ForkOperation] | None]:
    """Per fork operation changed in `batch`: the row of its change of the largest `seq` (with
    that seq) if every one of its changes there carries a row, else None (read back: a change
    without a row may be the newer write)."""
    ops: dict[tuple[str, str], tuple[int, ForkOperation] | None] = {}
    for change in batch:
        if type(change) is not ForkOperationChanged:
            continue
        key = (change.workspace_id, change.operation_id)
        row = change.row
        if row is None:
            ops[key] = None
        elif key not in ops:
            ops[key] = (change.seq, row)
        else:
            held = ops[key]
            if held is not None and held[0] < change.seq:
                ops[key] = (change.seq, row)
    return ops


def _newest_rows(
    batch: list[Any], known: Known, versions: dict[tuple[str, str], int | None]
) -> dict[tuple[str, str], tuple[int, Session] | None]:
    """Per Session changed in `batch`: the row of its change of the largest `seq` (with that
    seq) if every one of its changes there carries a row or a touch `known` resolves, else None
    (a removal, a write that carries neither, or a touch whose base row is not held). Every row
    met is learnt (`known`), so a touch after its base in the batch resolves too. Into
    `versions`, per Session: the highest row version its changes there carry (a row's, or a
    touch's whether or not it resolves), None if any carries neither or is a removal."""
    rows: dict[tuple[str, str], tuple[int, Session] | None] = {}
    for change in batch:
        if type(change) is not SessionChanged:
            continue
        key = (change.workspace_id, change.session_id)
        row = change.row
        carried = (
            None
            if change.removed
            else row.version
            if row is not None
            else None
            if change.touch is None
            else change.touch.version
        )
        if key not in versions:
            versions[key] = carried
        else:
            held_version = versions[key]
            versions[key] = (
                None if held_version is None or carried is None else max(held_version, carried)
            )
        if change.removed:
            known.forget(key)
        elif row is not None:
            known.learn(key, row)
        elif change.touch is not None:
            base = known.get(key)
            row = None if base is None else change.touch.apply(base)
            if row is not None:
                known.learn(key, row)
        if row is None or change.removed:
            rows[key] = None
            continue
        if key in rows:
            held = rows[key]
            if held is not None and held[0] < change.seq:
                rows[key] = (change.seq, row)
        else:
            rows[key] = (change.seq, row)
    return rows


DELTA_PIECE_CHARS = MAX_EVENT_BYTES // 8
"""The most characters of text one `message.delta` event carries (at most 4 UTF-8 bytes each:
half the cap, the other half far more than its ids and keys take). A longer streamed delta is
published as several events of the same item, in order, each of at most this many characters
(`delta_pieces`): joined they are the delta, and each event stays under `MAX_EVENT_BYTES`."""


def delta_pieces(delta: StreamDelta) -> list[StreamDelta]:
    """`delta` as events carry it: itself when its text fits one event (the common case: one
    `len`), else its text cut into runs of `DELTA_PIECE_CHARS`, in order. A `progress` delta
    is one line for a person that a client shows in place of the one before, so it is cut to
    its first run (ending in `…`) instead of split."""
    event = delta.event
    text = event.get("delta")
    if not isinstance(text, str) or len(text) <= DELTA_PIECE_CHARS:
        return [delta]
    if event.get("kind") == PROGRESS:
        cut = {**event, "delta": text[: DELTA_PIECE_CHARS - 1] + "\u2026"}
        return [StreamDelta(delta.workspace_id, delta.session_id, cut)]
    return [
        StreamDelta(
            delta.workspace_id,
            delta.session_id,
            {**event, "delta": text[at : at + DELTA_PIECE_CHARS]},
        )
        for at in range(0, len(text), DELTA_PIECE_CHARS)
    ]


def delta_event(change: StreamDelta) -> MessageDelta:
    """The `message.delta` event of a worker's streamed delta."""
    event = change.event
    return {
        "type": MESSAGE_DELTA,
        "agentSessionId": change.session_id,
        "turnId": str(event.get("turnId") or ""),
        "itemId": str(event.get("itemId") or ""),
        "kind": str(event.get("kind") or "assistant"),
        "delta": str(event.get("delta") or ""),
    }


class _Packers(threading.local):
    """One msgpack `Packer` per thread for a streamed delta's body (`encode_event`'s bytes,
    without its copy of the map and `msgpack.packb`'s Packer built per call)."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True)


_packers = _Packers()


class EventSink(Protocol):
    """Where events go (`transport.server.ApiServer`)."""

    def wants(self, topic: str) -> bool: ...

    def publish_many(self, events: list[tuple[str, Event]]) -> bool: ...

    def publish_now(self, frames: list[tuple[bytes, bytes]]) -> bool: ...


class EventPublisher:
    """Runs `run()` on one thread; `offer`, `offer_many` and `offer_delta` from any thread
    (counted entries of `changes`); `changes.put(None)` stops it."""

    def __init__(
        self,
        store: Store,
        catalog: ProviderCatalog,
        changes: queue.SimpleQueue[Any],
        sink: EventSink | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.sink = sink
        """Where the events go; None (nothing wanted) until the composition root hands over
        its API server, which is built after the publisher."""
        self.queue = changes
        # Owned by the publishing thread: what each active Turn's last event carried.
        self.turn_deltas = TurnDeltas()
        self.shown = Shown()
        self.shown_turns = Shown()
        """`Shown` per Turn (a Turn's carried row against what its events showed)."""
        self.known = Known()
        """The newest row of each Session this thread has, the base of a carried touch."""
        self.published = Published()
        """The version of each Session's newest row published (what a later change may be
        covered by)."""
        self.covered = 0
        """Session changes whose write an event already published showed (no event, no read:
        docs/design/store.md, "A Session change already heard"); tests pin it."""
        self.carried = 0
        """Session events built from the row their change carried, or its touch built on a
        known row (no read); tests pin it."""
        self.touched = 0
        """Of `carried`, the events of a change that carried only a touch (a Turn's claim or
        settlement): built on a known row."""
        self.carried_turns = 0
        """Turn events built from the row their change carried (no read); tests pin it."""
        self.shown_ops = Shown()
        """`Shown` per fork operation (a carried operation row against what its events
        showed)."""
        self.carried_ops = 0
        """Fork operation events built from the row their change carried (no read); tests pin
        it."""
        self.removed = Shown()
        """Per Session removed, `write_seq` after its removal was published: no Turn row
        carried by a write at or before it is published (its read-back is refused)."""
        self.skipped = 0
        """Changes no subscriber wanted (no event built); tests pin the skip on it."""
        self.projected = 0
        self.repeats = 0
        """Session and operation changes dropped as repeats within their batch."""
        self.batches = 0
        """Times the publishing thread woke up with work (tests pin the `offer` filter)."""
        self._count_lock = threading.Lock()
        self._order = threading.Lock()
        """Held by a producer while it counts and queues an entry, by a delta handed to the
        sink directly, and by the thread while it uncounts a batch it has handed over."""
        self._held = 0
        """Queue entries put and not yet handed over to the sink (under `_order`)."""
        self.direct = 0
        """Deltas handed straight to the sink on their producer's thread (under `_order`)."""
        self.direct_changes = 0
        """Changes of claims and settlements projected and handed to the sink on their
        writer's thread (`_publish_direct`, under `_order`); tests pin it."""
        self._unseen: dict[str, int] = {}
        """Per workspace, `write_seq` when a Session change of it last went unpublished (the
        newest last; past `unseen_remembered` the oldest half are forgotten, each then taken
        to be at `_unseen_floor`: workspaces are made by naming them, so any client can add
        one)."""
        self.unseen_remembered = SHOWN_REMEMBERED
        self._unseen_floor = 0
        """The largest `write_seq` of a workspace `_unseen` forgot (raised before it forgets)."""

    def offer(self, change: Any) -> None:
        """The store's subscriber (any writer's thread, after its COMMIT): queue `change`.
        A Session or fork operation change of a workspace no connected subscriber wants is
        dropped here (the fork fast path): a fork's four transitions and its commit would
        otherwise wake this thread five times only to skip each. A Turn change always goes
        to the thread, which owns `TurnDeltas` and must forget the Turn it skips."""
        if type(change) in _ENTITY_TYPES:
            sink = self.sink
            if sink is None or not sink.wants(change.workspace_id):
                with self._count_lock:
                    self.skipped += 1
                    self._unseen_in(change)
                return
        self._put(change)

    def offer_many(self, changes: list[Any]) -> None:
        """`offer` for one delivery of the store's (`Database.subscribe_batches`): what is
        wanted goes on the queue as one entry, so the thread takes a fork's burst in one
        batch (one read-back per entity) instead of waking at its first change."""
        sink = self.sink
        kept: list[Any] = []
        skipped: list[Any] = []
        for change in changes:
            if type(change) in _ENTITY_TYPES and (
                sink is None or not sink.wants(change.workspace_id)
            ):
                skipped.append(change)
            else:
                kept.append(change)
        if skipped:
            with self._count_lock:
                self.skipped += len(skipped)
                for change in skipped:
                    self._unseen_in(change)
        if not kept:
            return
        if self._held == 0 and sink is not None and _carries_turn(kept):  # decided under `_order`
            with self._order:
                if self._held == 0:
                    self._publish_direct(kept, sink)
                    return
                self._held += 1
                self.queue.put(kept[0] if len(kept) == 1 else kept)
            return
        self._put(kept[0] if len(kept) == 1 else kept)

    def _publish_direct(self, changes: list[Any], sink: EventSink) -> None:
        """A Turn's claim or settlement (and its Session's touch) projected and handed to the
        sink on the writer's thread, right after its COMMIT: called under `_order` with nothing
        queued or in hand, so the publishing thread is idle and touches none of the state it
        owns (`TurnDeltas`, `Shown`, `Known`, `Published`) until the next entry is counted,
        which waits for `_order`; every rule of `_project_all` holds as on the thread
        (design/internals.md, "A Turn's claim and settlement on the writer's thread")."""
        out: list[tuple[str, Event]] = []
        try:
            self._project_all(changes, sink, out)
            frames = [(topic.encode("utf-8"), encode_event(event)) for topic, event in out]
        except Exception:  # noqa: BLE001 - a listener must never break a durable write
            log.exception("events: could not publish %d changes directly", len(changes))
            return
        self.direct_changes += len(changes)
        if frames:
            sink.publish_now(frames)

    def _put(self, item: Any) -> None:
        """Queue `item`, counted: no delta goes past it until its batch is handed over."""
        with self._order:
            self._held += 1
            self.queue.put(item)

    def offer_delta(self, delta: StreamDelta) -> None:
        """A streamed delta (the worker supervisor's thread, in arrival order): handed to the
        sink now, encoded once here, when nothing is queued or in hand; else queued behind
        what is. Never held to wait for another delta (design/internals.md, "A delta's way
        to the transport"). A delta too big for one event goes as several (`delta_pieces`),
        one after another from this thread, so in order."""
        text = delta.event.get("delta")
        if isinstance(text, str) and len(text) > DELTA_PIECE_CHARS:
            for piece in delta_pieces(delta):
                self.offer_delta(piece)
            return
        sink = self.sink
        if self._held == 0 and sink is not None:  # a first look; decided under `_order`
            if not sink.wants(delta.workspace_id):
                with self._count_lock:
                    self.skipped += 1
                return
            body: bytes = _packers.packer.pack(delta_event(delta))  # the one encoding
            frames = [(delta.workspace_id.encode("utf-8"), body)]
            with self._order:
                if self._held == 0:
                    sink.publish_now(frames)
                    self.direct += 1
                    return
                self._held += 1
                self.queue.put(delta)
            return
        self._put(delta)

    def _unseen_in(self, change: Any) -> None:
        """A Session or Turn change of `change`'s workspace goes unpublished (nobody wants it):
        a subscriber that connects later must not hear an older carried row of that workspace
        as the newest, so none at or below the store's `write_seq` now (≥ the change's own:
        it is committed) is trusted there (`_session_event`, `_turn_event`). Under
        `_count_lock`."""
        if isinstance(change, (SessionChanged, TurnChanged, ForkOperationChanged)):
            unseen = self._unseen
            unseen.pop(change.workspace_id, None)
            unseen[change.workspace_id] = self.store.db.write_seq
            if len(unseen) > self.unseen_remembered:
                # The floor is raised before any is forgotten (the publishing thread reads
                # `_unseen` unlocked).
                old = list(unseen)[: len(unseen) // 2]
                self._unseen_floor = max(self._unseen_floor, *(unseen[w] for w in old))
                for workspace_id in old:
                    del unseen[workspace_id]

    def _unseen_at(self, workspace_id: str) -> int:
        """`_unseen`'s bound for `workspace_id` (the floor for one forgotten): a carried row
        at or below it is read back instead (read before the floor, which rises first)."""
        at = self._unseen.get(workspace_id)
        return self._unseen_floor if at is None else at

    def run(self) -> None:
        while True:
            item = self.queue.get()
            taken = 0 if item is None else 1  # the stop marker is not counted
            batch = _entries(item)
            self.batches += 1
            while len(batch) < BATCH:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                taken += 0 if item is None else 1
                batch.extend(_entries(item))
            try:
                stop = self._publish(batch)
            finally:
                # Handed over (or dropped): a delta may go past them now.
                with self._order:
                    self._held -= taken
            if stop:
                return

    def _publish(self, batch: list[Any]) -> bool:
        sink = self.sink
        out: list[tuple[str, Event]] = []
        # The streamed deltas queued ahead of the batch's first store read leave first: a
        # delta never waits for a read-back queued after it (nor for the snapshot's BEGIN).
        lead = next((i for i, c in enumerate(batch) if type(c) in _READ_BACK_TYPES), len(batch))
        if 0 < lead < len(batch):
            if self._project_all(batch[:lead], sink, out):
                if out and sink is not None:
                    sink.publish_many(out)
                return True
            batch = batch[lead:]
        # The batch's reads in one read transaction (`Store.read_snapshot`): each change was
        # committed before it was queued, so the snapshot is the current state for all of
        # them, and their pages are loaded once instead of once per event.
        # Each projection's own failure is handled in `_project_all`; a snapshot
        # that cannot be begun or ended (SQLite busy in a WAL recovery) costs only itself.
        reads = sum(1 for change in batch if _reads(change)) > 1
        snapshot = contextlib.ExitStack()
        if reads:
            try:
                snapshot.enter_context(self.store.db.read_snapshot())
            except TRANSIENT_ERRORS as exc:
                log.warning("events: no read snapshot for a batch (%s)", exc)
        try:
            stop = self._project_all(batch, sink, out)
        finally:
            try:
                snapshot.close()
            except TRANSIENT_ERRORS as exc:
                log.warning("events: ending a batch's read snapshot failed (%s)", exc)
        if out and sink is not None:
            sink.publish_many(out)
        return stop

    def _project_all(
        self, batch: list[Any], sink: EventSink | None, out: list[tuple[str, Event]]
    ) -> bool:
        """Project `batch` into `out`; True when it held the stop marker."""
        previous: Any = None
        stop = False
        # A Session's or an operation's change already met in this batch: its event reads the
        # state after every change of the batch was committed (each was, before it was
        # queued), so a second event would say the same thing again.
        entities: set[SessionChanged | ForkOperationChanged] = set()
        # The Turn changes of this batch read back (or not wanted): a repeat right after one
        # would read the same state. A carried row is its own write's state, not the batch's
        # newest, so a change right after one is not a repeat (and a delta of the Turn between
        # its claim and its settlement in one batch still leaves between their events).
        turns_read: set[TurnChanged] = set()
        # Per Session of the batch, the carried row its event is built from: the newest one if
        # every change of that Session in the batch carries one (then it is at least as new as
        # any of them), else None (one without: read back).
        versions: dict[tuple[str, str], int | None] = {}
        rows = _newest_rows(batch, self.known, versions)
        # The same per fork operation (its commit's and its ACK's changes carry their row).
        ops = _newest_ops(batch) if any(type(c) is ForkOperationChanged for c in batch) else {}
        # Whether `out` holds a streamed delta: then it is handed over before the next read;
        # events read back from the store go together, `HANDOVER` at most (a fork's events
        # in a batch were one hand-over to the loop each). What `out` holds on entry are
        # the batch's leading deltas.
        delta_out = bool(out)
        for change in batch:
            if change is None:
                stop = True
                break
            kind = type(change)
            if change == previous and (
                change in turns_read if kind is TurnChanged else kind is not StreamDelta
            ):
                continue  # the same change again: its event would read the same state
            previous = change
            if kind in _ENTITY_TYPES:
                if change in entities:
                    with self._count_lock:
                        self.repeats += 1
                    continue
                entities.add(change)
            if (delta_out or len(out) >= HANDOVER) and sink is not None and _reads(change):
                # What is built so far (a delta among it, or `HANDOVER` events) leaves
                # before this change's read.
                sink.publish_many(out)
                out.clear()
                delta_out = False
            if sink is None or not sink.wants(change.workspace_id):
                with self._count_lock:
                    self.skipped += 1
                    self._unseen_in(change)
                if kind is TurnChanged:
                    turns_read.add(change)
                    self.turn_deltas.forget(
                        (change.workspace_id, change.session_id, change.turn_id)
                    )
                continue
            try:
                if kind is SessionChanged:
                    event = self._session_event(change, rows, versions)
                elif kind is TurnChanged:
                    event = self._turn_event(change, turns_read)
                elif kind is ForkOperationChanged:
                    event = self._operation_event(change, ops)
                else:
                    event = self.project(change)
            except HostError:
                continue  # e.g. the entity vanished before we read it back
            except Exception:  # noqa: BLE001
                log.exception("could not project %r", change)
                continue
            if event is not None:
                self.projected += 1
                out.append((change.workspace_id, event))
                delta_out = delta_out or kind is StreamDelta
        return stop

    def _session_event(
        self,
        change: SessionChanged,
        rows: dict[tuple[str, str], tuple[int, Session] | None],
        versions: dict[tuple[str, str], int | None],
    ) -> Event | None:
        """`project(change)`, from the batch's newest carried (or touched) row of its Session
        when nothing newer of it can have been shown; the bound moved past what this event
        shows. None (no event, no read) when every change of the Session in the batch carries
        a version at or below that of a row already published (`Published`)."""
        key = (change.workspace_id, change.session_id)
        version = versions.get(key)
        if version is not None:
            heard = self.published.get(key)
            if heard is not None and version <= heard:
                self.covered += 1
                return None
        newest = rows.get(key)
        if (
            newest is not None
            and newest[0] > self.shown.bound(key)
            and newest[0] > self._unseen_at(change.workspace_id)
        ):
            seq, row = newest
            self.shown.showed(key, seq)
            self.published.showed(key, row.version)
            self.carried += 1
            if change.row is None:
                self.touched += 1
            return {
                "type": SESSION_UPSERTED,
                "session": event_session(projection.child_or_session(row, self.catalog)),
            }
        try:
            return self.project(change)
        finally:
            # Read after the read (or the removal): no write it could show is past it.
            seq = self.store.db.write_seq
            self.shown.showed(key, seq)
            if change.removed:
                self.removed.showed(key, seq)
                self.published.forget(key)

    def _operation_event(
        self,
        change: ForkOperationChanged,
        ops: dict[tuple[str, str], tuple[int, ForkOperation] | None],
    ) -> Event | None:
        """`project(change)`, from the batch's newest carried row of its operation when nothing
        newer of it can have been shown (the ordering rule of design/store.md, "Change events
        that carry their row", per operation; operations are never removed; a row at seq 0, a
        lazy prepare's, is never past any bound); else read back.
        The operation's bound moved past what this event shows."""
        key = (change.workspace_id, change.operation_id)
        newest = ops.get(key)
        if (
            newest is not None
            and newest[0] > self.shown_ops.bound(key)
            and newest[0] > self._unseen_at(change.workspace_id)
        ):
            seq, op = newest
            self.shown_ops.showed(key, seq)
            self.carried_ops += 1
            return {
                "type": FORK_OPERATION,
                "operation": event_operation(projection.operation(op, self.catalog)),
            }
        try:
            return self.project(change)
        finally:
            self.shown_ops.showed(key, self.store.db.write_seq)

    def _turn_event(self, change: TurnChanged, turns_read: set[TurnChanged]) -> Event | None:
        """`project(change)`, from the row it carries when nothing newer of that Turn can have
        been shown and its Session's removal was not published after the row's write (the
        ordering rule of design/store.md, "Change events that carry their row", per Turn);
        else read back (and noted in `turns_read`). The Turn's bound moved past what the
        event shows."""
        key = (change.workspace_id, change.session_id, change.turn_id)
        row = change.row
        if (
            row is not None
            and change.seq > self.shown_turns.bound(key)
            and change.seq > self._unseen_at(change.workspace_id)
            and change.seq > self.removed.bound(key[:2])
        ):
            self.shown_turns.showed(key, change.seq)
            self.carried_turns += 1
            provider = self.store.sessions.provider_of(change.workspace_id, change.session_id)
            return {
                "type": TURN_UPDATED,
                "agentSessionId": change.session_id,
                "turn": self.turn_deltas.event_tail(
                    key,
                    projection.turn(row, provider, self.catalog),
                    messages_from=0,
                    positions=[m.position for m in row.messages],
                    max_bytes=MAX_EVENT_BYTES,
                ),
            }
        turns_read.add(change)
        try:
            return self.project(change)
        finally:
            self.shown_turns.showed(key, self.store.db.write_seq)

    def project(self, change: Any) -> Event | None:
        store = self.store
        if isinstance(change, SessionChanged):
            if change.removed:
                return {"type": SESSION_REMOVED, "agentSessionId": change.session_id}
            session = store.sessions.get_session(change.workspace_id, change.session_id)
            # A committed state, exact at its version: the base of the Session's next touch,
            # and (published) what a later change at or below its version is covered by.
            key = (change.workspace_id, change.session_id)
            self.known.learn(key, session)
            self.published.showed(key, session.version)
            return {
                "type": SESSION_UPSERTED,
                "session": event_session(projection.session(session, self.catalog)),
            }
        if isinstance(change, TurnChanged):
            # The provider only (fixed at create), from the store's memory after the first
            # read (every write of a Turn publishes one event, and each would read the
            # Session for this one field). A deleted Session is refused by `turn_since`.
            provider = store.sessions.provider_of(change.workspace_id, change.session_id)
            # Read from the first message changed since this Turn's last event, not whole.
            return {
                "type": TURN_UPDATED,
                "agentSessionId": change.session_id,
                "turn": updated_turn(
                    store,
                    self.turn_deltas,
                    (change.workspace_id, change.session_id, change.turn_id),
                    lambda turn: projection.turn(turn, provider, self.catalog),
                    MAX_EVENT_BYTES,
                ),
            }
        if isinstance(change, StreamDelta):
            return delta_event(change)
        if isinstance(change, ForkOperationChanged):
            op = store.fork_queries.get_fork_operation(change.workspace_id, change.operation_id)
            return {
                "type": FORK_OPERATION,
                "operation": event_operation(projection.operation(op, self.catalog)),
            }
        return None
