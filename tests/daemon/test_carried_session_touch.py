"""A Turn's Session events carried: the claim's and the settlement's change carry only what
their `touch` changed of the Session's row (its version, `updated_at_ms`, the active Turn), and
the events thread builds their `session.upserted` on the row it holds at the version before,
without reading the Session back — and reads it back whenever the row it holds is not the one
the touch changed (docs/design/store.md, "A Turn's Session events carried")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agenthost import projection
from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher
from storage.models import ChangeEvent, Session, SessionChanged, SessionTouch
from storage.store import Store
from tests.support.carried import (
    Heard,
    Sink,
    a_turn,
    hear_settled,
    new_session,
    read_counting_publisher,
    session_read,
)
from tests.support.in_process import in_process_daemon
from tests.support.invariants import check_session_events
from transport.client import Client

pytestmark = pytest.mark.timeout(60)

WS = "ws-session-touch"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _publisher(daemon: Daemon, sink: Sink) -> tuple[EventPublisher, list[str]]:
    """A publisher of its own on the daemon's store, counting its Session read-backs."""
    return read_counting_publisher(daemon, sink, session_read)


def _a_turn(store: Store, sid: str) -> tuple[list[ChangeEvent], list[ChangeEvent], str]:
    return a_turn(store, WS, sid)


def _touch(changes: list[ChangeEvent]) -> SessionTouch:
    (change,) = [c for c in changes if isinstance(c, SessionChanged)]
    assert change.row is None and change.touch is not None
    return change.touch


def _sessions(sink: Sink) -> list[dict[str, Any]]:
    return [e["session"] for e in sink.events if e["type"] == "session.upserted"]


def test_a_claim_and_a_settlement_carry_what_their_touch_changed(
    running: tuple[Daemon, Client],
) -> None:
    """Applied in turn to the row before the claim, the two touches give the row the store
    holds after the settlement; each moved the row's version by one."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = new_session(client, WS)
    before = store.sessions.get_session(WS, sid)
    claim, settlement, turn_id = _a_turn(store, sid)
    after = store.sessions.get_session(WS, sid)
    claimed, settled = _touch(claim), _touch(settlement)
    assert (claimed.claimed, claimed.settled) == (turn_id, None)
    assert (settled.claimed, settled.settled) == (None, turn_id)
    assert (claimed.version, settled.version) == (before.version + 1, before.version + 2)
    active = claimed.apply(before)
    assert active is not None and active.active_turn_id == turn_id
    assert settled.apply(active) == after
    # Only on the row it changed: not the row before it, not one already settled.
    assert settled.apply(before) is None and claimed.apply(after) is None


def test_a_turns_session_events_are_built_without_a_read(
    running: tuple[Daemon, Client],
) -> None:
    """Once the events thread holds the Session's row, the claim's and the settlement's events
    are built on it, each the row the store held after its write."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = new_session(client, WS)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([SessionChanged(WS, sid)])  # read back: the row the claim will change
    claim, settlement, turn_id = _a_turn(store, sid)
    publisher._publish(claim)
    publisher._publish(settlement)
    assert reads == [sid] and publisher.touched == 2
    _, active, settled = _sessions(sink)
    assert (
        active["activeTurnId"] == turn_id
        and active["updatedAtUnixMs"] == _touch(claim).updated_at_ms
    )
    assert settled == projection.session(store.sessions.get_session(WS, sid), daemon.catalog)

    # Both in one batch: the settlement's touch is built on the claim's.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([SessionChanged(WS, sid)])
    claim, settlement, _ = _a_turn(store, sid)
    publisher._publish(claim + settlement)
    assert reads == [sid] and publisher.touched == 1  # one event for the batch, the newest
    assert _sessions(sink)[-1] == projection.session(
        store.sessions.get_session(WS, sid), daemon.catalog
    )


def test_a_touch_on_a_row_it_did_not_change_is_read_back(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename the events thread never saw (its event not delivered yet, or nobody wanted it)
    moved the row between the one held and the claim's: the claim's touch is read back, and
    shows the new title (the store already holds the settled row, so the settlement's change is
    covered by that read: no event, no second read). A touch applied whatever the row's version
    would publish the old title, and `check_session_events` names it."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = new_session(client, WS)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([SessionChanged(WS, sid)])
    store.sessions.update_title(WS, sid, "renamed")  # its event not delivered to this thread
    claim, settlement, _ = _a_turn(store, sid)
    publisher._publish(claim)
    publisher._publish(settlement)
    assert reads == [sid, sid] and publisher.touched == 0 and publisher.covered == 1
    assert [s["title"] for s in _sessions(sink)][1:] == ["renamed"]
    end = {sid: projection.session(store.sessions.get_session(WS, sid), daemon.catalog)}
    heard = list(sink.events)
    assert check_session_events(heard, end) == []

    original = SessionTouch.apply

    def blind(self: SessionTouch, base: Session) -> Session | None:
        # Trusts any row it is given: the version check gone.
        return original(replace(self, version=base.version + 1), base)

    monkeypatch.setattr(SessionTouch, "apply", blind)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([SessionChanged(WS, sid)])
    store.sessions.update_title(WS, sid, "renamed again")
    claim, settlement, _ = _a_turn(store, sid)
    publisher._publish(claim)
    publisher._publish(settlement)
    assert [s["title"] for s in _sessions(sink)][1:] == ["renamed", "renamed"]  # stale
    end = {sid: projection.session(store.sessions.get_session(WS, sid), daemon.catalog)}
    assert [v.detail for v in check_session_events(sink.events, end)] == [
        f"{sid}: last heard title 'renamed', ended 'renamed again'"
    ]


def test_a_session_change_already_heard_is_not_published_again(
    running: tuple[Daemon, Client],
) -> None:
    """A read-back that showed the settled row covers the Turn's claim and settlement delivered
    after it (their versions at or below the one read): no event, no read — what a subscriber
    heard still ends with the store's row. A batch where any change of the Session is newer
    than what was published is published whole, from its newest row; a removal forgets."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = new_session(client, WS)
    claim, settlement, _ = _a_turn(store, sid)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([SessionChanged(WS, sid)])  # read back: the settled row
    publisher._publish(claim)
    publisher._publish(settlement)
    assert reads == [sid] and publisher.covered == 2 and len(_sessions(sink)) == 1
    end = {sid: projection.session(store.sessions.get_session(WS, sid), daemon.catalog)}
    assert check_session_events(sink.events, end) == []

    # A covered touch first in a batch with a newer change of its Session: the newer is heard.
    heard_now = Heard(store)
    try:
        store.sessions.update_title(WS, sid, "newer")
        renamed = heard_now.take()
    finally:
        heard_now.close()
    # (Read back: the touches do not resolve on the newer row held, so the batch's row is read.)
    publisher._publish(claim + settlement + renamed)
    assert reads == [sid, sid] and publisher.covered == 2
    assert [s["title"] for s in _sessions(sink)] == [end[sid]["title"], "newer"]

    # A change with no version (read back) is never covered.
    publisher._publish([SessionChanged(WS, sid)])
    assert reads == [sid, sid, sid] and len(_sessions(sink)) == 3


def test_every_change_of_a_sessions_row_moves_its_version(
    running: tuple[Daemon, Client],
) -> None:
    """The trigger moves it for any UPDATE of the row — a store path or raw SQL behind the
    daemon's back — so no row the events thread holds is taken for one it is not."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = new_session(client, WS)
    start = store.sessions.get_session(WS, sid).version
    store.sessions.update_title(WS, sid, "one")
    store.sessions.set_pinned(WS, sid, True)
    assert store.sessions.get_session(WS, sid).version == start + 2
    with store.db.write(WS) as tx:
        tx.execute(
            "UPDATE sessions SET model = 'raw' WHERE workspace_id = ? AND session_id = ?",
            (WS, sid),
        )
    assert store.sessions.get_session(WS, sid).version == start + 3


def test_a_streamed_turns_session_events_are_carried_through_the_daemon(
    running: tuple[Daemon, Client],
) -> None:
    """Through the whole daemon: after a first Turn, each Turn's claim and settlement publish
    their Session's event built on the row the events thread holds, and what a subscriber
    heard ends with the Session as `session.get` answers it."""
    from tests.support.daemon import create_session, run_turn, wait_for
    from transport.client import EventSubscriber

    daemon, client = running
    server, publisher = daemon.server, daemon.publisher
    assert server is not None and publisher is not None
    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        sid = create_session(client, WS)["agentSessionId"]
        first = run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS)
        hear_settled(sub, [first["turnId"]], heard)
        touched = publisher.touched
        turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(4)]
        hear_settled(sub, [t["turnId"] for t in turns], heard)
        end = client.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]

        def ended() -> bool:
            while (event := sub.next(0.05)) is not None:
                if isinstance(event, dict):
                    heard.append(dict(event))
            return not check_session_events(heard, {sid: end})

        wait_for(ended, 10)
    # Each Turn's claim and settlement carry a touch; on a loaded machine the two can reach the
    # events thread in one batch, whose newest row is shown once, carried (the other change of
    # the Session is a repeat in the batch: no event, no read): at least one carried event per
    # Turn, at most two.
    assert len(turns) <= publisher.touched - touched <= 2 * len(turns)
    assert check_session_events(heard, {sid: end}) == []
