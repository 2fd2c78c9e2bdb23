"""Session changes that carry the row their write left: the events thread projects it without
reading the Session back, and never publishes it when something newer of that Session may
already have been shown — an older write's event delivered after a newer one's (writers'
threads deliver in any order), after a removal, or after a read-back — nor a row of a write
that was rolled back (docs/design/store.md, "Change events that carry their row")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher, Shown
from domain.errors import InvalidArgument
from storage.models import SessionChanged
from tests.support.carried import Heard, Sink, new_session, read_counting_publisher, session_read
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(60)

WS = "ws-carried"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _session(client: Client) -> str:
    return new_session(client, WS)


def _titles(sink: Sink) -> list[str]:
    return [
        str(e["session"]["title"]) if e["type"] == "session.upserted" else e["type"]
        for e in sink.events
    ]


def _publisher(daemon: Daemon, sink: Sink) -> tuple[EventPublisher, list[str]]:
    """A publisher of its own on the daemon's store, counting its Session read-backs."""
    return read_counting_publisher(daemon, sink, session_read)


def test_a_rename_carries_its_row_in_commit_order(running: tuple[Daemon, Client]) -> None:
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        first = store.sessions.update_title(WS, sid, "one")
        second = store.sessions.set_pinned(WS, sid, True)
        changes = heard.take()
    finally:
        heard.close()
    carried = [c for c in changes if isinstance(c, SessionChanged)]
    assert [c.row for c in carried] == [first, second]
    assert carried[0].seq < carried[1].seq <= store.db.write_seq
    # Not part of the change's identity: the change is the same change, whatever it carries.
    assert carried[0] == SessionChanged(WS, sid) and hash(carried[0]) == hash(
        SessionChanged(WS, sid)
    )


def test_the_events_thread_projects_a_carried_row_without_a_read(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        store.sessions.update_title(WS, sid, "one")
        one = heard.take()
        store.sessions.update_title(WS, sid, "two")
        two = heard.take()
    finally:
        heard.close()
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(one)
    publisher._publish(two)
    # Each event is its write's state (the store already holds "two" when "one" is built).
    assert _titles(sink) == ["one", "two"]
    assert reads == [] and publisher.carried == 2


def test_an_older_row_delivered_after_a_newer_one_is_read_back(
    running: tuple[Daemon, Client],
) -> None:
    """Two writers' events reach the thread in the order their threads deliver them: the older
    rename's, delivered last, must not put its title back on the subscribers' screens."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        store.sessions.update_title(WS, sid, "older")
        older = heard.take()
        store.sessions.update_title(WS, sid, "newer")
        newer = heard.take()
    finally:
        heard.close()

    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(newer)
    # Delivered late: its version is below the one "newer"'s event published, so it is
    # covered (no event, no read; design/store.md, "A Session change already heard").
    publisher._publish(older)
    assert _titles(sink) == ["newer"] and reads == [] and publisher.covered == 1
    # With that version forgotten (`Published` is bounded), the bound alone keeps it: read
    # back, the current state.
    publisher.published.forget((WS, sid))
    publisher._publish(older)
    assert _titles(sink) == ["newer", "newer"] and len(reads) == 1

    # Both in one batch, the older first: one event, the newer row, no read.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(older + newer)
    assert _titles(sink) == ["newer"] and reads == []

    # On main's rule (an event is its change read back) the late one would say "newer" too;
    # with the row taken whatever was shown, it would say "older": the bound is what keeps it.
    newest = newer[0]
    assert isinstance(newest, SessionChanged)
    assert publisher.shown.bound((WS, sid)) >= newest.seq


def test_a_row_after_a_read_back_or_a_removal_is_not_published_stale(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        store.sessions.update_title(WS, sid, "renamed")
        renamed = heard.take()
        store.sessions.update_title(WS, sid, "after")
        heard.take()
    finally:
        heard.close()

    # A change without a row (read back: "after") shown first: the older row is covered by
    # it (its version is below the one read); with that version forgotten, read back too.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([SessionChanged(WS, sid)])
    publisher._publish(renamed)
    assert _titles(sink) == ["after"] and len(reads) == 1 and publisher.covered == 1
    publisher.published.forget((WS, sid))
    publisher._publish(renamed)
    assert _titles(sink) == ["after", "after"] and len(reads) == 2

    # A removal delivered before the rename it followed: no upsert after the removal.
    heard = Heard(store)
    try:
        store.sessions.delete_session(WS, sid)
        removed = heard.take()
    finally:
        heard.close()
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(removed)
    publisher._publish(renamed)
    assert _titles(sink) == ["session.removed"]
    # The same two in one batch, the removal last.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(renamed + removed)
    assert _titles(sink) == ["session.removed"]


def test_a_row_older_than_a_change_nobody_wanted_is_read_back(
    running: tuple[Daemon, Client],
) -> None:
    """The newer rename went unpublished (no subscriber then); one connects, and the older
    rename's event arrives late: it must not show the older title as the newest."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        store.sessions.update_title(WS, sid, "older")
        older = heard.take()
        store.sessions.update_title(WS, sid, "newer")
        newer = heard.take()
    finally:
        heard.close()
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    sink.wanted = False
    publisher.offer_many(newer)
    assert publisher.skipped == 1 and publisher.queue.empty()
    sink.wanted = True
    publisher._publish(older)
    assert _titles(sink) == ["newer"] and len(reads) == 1


def test_a_rolled_back_write_leaves_no_row_in_any_event(running: tuple[Daemon, Client]) -> None:
    """A batch's second rename is rolled back alone: the event carries the first one's row,
    the state committed; a write whose whole transaction fails emits nothing."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        with store.db.write_batch():
            store.sessions.update_title(WS, sid, "kept")
            with pytest.raises(InvalidArgument), store.db.write(WS) as tx:
                tx.execute(
                    "UPDATE sessions SET title = 'gone' WHERE workspace_id = ? AND session_id = ?",
                    (WS, sid),
                )
                raise InvalidArgument("title", "refused after the UPDATE")
        batch = heard.take()
        with pytest.raises(InvalidArgument), store.db.write(WS) as tx:
            tx.execute(
                "UPDATE sessions SET title = 'never' WHERE workspace_id = ? AND session_id = ?",
                (WS, sid),
            )
            tx.emit(SessionChanged(WS, sid, row=store.sessions.get_session(WS, sid)))
            raise InvalidArgument("title", "refused")
        nothing = heard.take()
    finally:
        heard.close()
    assert nothing == []
    carried = [c for c in batch if isinstance(c, SessionChanged)]
    assert len(carried) == 1 and carried[0].row is not None and carried[0].row.title == "kept"
    sink = Sink()
    publisher, _ = _publisher(daemon, sink)
    publisher._publish(batch)
    assert _titles(sink) == ["kept"]
    assert store.sessions.get_session(WS, sid).title == "kept"


def test_a_later_change_without_a_row_in_the_same_write_drops_the_carried_one(
    running: tuple[Daemon, Client],
) -> None:
    """One write that carries a row and then changes the Session again (emitting the change
    without a row): its one event carries none, so the events thread reads it back."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        with store.db.write_batch():
            store.sessions.update_title(WS, sid, "first")
            with store.db.write(WS) as tx:
                tx.execute(
                    "UPDATE sessions SET title = 'second' WHERE workspace_id = ?"
                    " AND session_id = ?",
                    (WS, sid),
                )
                tx.emit(SessionChanged(WS, sid))
        changes = heard.take()
    finally:
        heard.close()
    assert changes == [SessionChanged(WS, sid)]
    assert isinstance(changes[0], SessionChanged) and changes[0].row is None
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(changes)
    assert _titles(sink) == ["second"] and len(reads) == 1


def test_forgotten_sessions_take_the_largest_bound_forgotten() -> None:
    shown = Shown(remembered=2)
    shown.showed(("w", "a"), 5)
    shown.showed(("w", "b"), 3)
    assert shown.bound(("w", "c")) == 0
    shown.showed(("w", "c"), 1)  # past the bound: the oldest half forgotten ("a": 5)
    assert shown.bound(("w", "a")) == 5  # forgotten: the largest forgotten bound
    assert shown.bound(("w", "z")) == 5
    assert (shown.bound(("w", "b")), shown.bound(("w", "c"))) == (3, 1)  # still remembered
    shown.showed(("w", "d"), 2)  # written after a forgetting: at least the forgotten bound
    assert shown.bound(("w", "d")) == 5
