"""A Turn's claim and settlement through the events publisher: when nothing is queued or in
hand, its change and its Session's touch are projected and handed to the transport on the writer's
thread, right after the COMMIT (no events-thread wake-up); behind anything queued or in hand
they are queued as before, and either way no event overtakes an earlier-offered change's
(docs/design/internals.md, "A Turn's claim and settlement on the writer's thread")."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher
from storage.models import ChangeEvent, NewMessage, Turn, TurnChanged
from storage.store import Store
from tests.support.carried import (
    Heard,
    Sink,
    hear_settled,
    new_session,
    read_counting_publisher,
    run_publisher,
    stop_publisher,
)
from tests.support.daemon import fork_params, run_turn, submit, wait_for
from tests.support.in_process import in_process_daemon
from tests.support.invariants import check_turn_events
from transport.client import Client, EventSubscriber

pytestmark = pytest.mark.timeout(120)

WS = "ws-settle-direct"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _claim(store: Store, sid: str) -> tuple[list[ChangeEvent], Turn]:
    """A Turn's claim as the Session actor writes it: its delivery, and the Turn."""
    heard = Heard(store)
    try:
        turn, created = store.turns.claim_submit(WS, sid, f"req-{uuid.uuid4()}", "hello")
        assert created
        return heard.take(), turn
    finally:
        heard.close()


def _settle(store: Store, turn: Turn) -> list[ChangeEvent]:
    """The Turn's settlement as the Session actor writes it (carrying the reply and the Turn
    it settles): its delivery."""
    heard = Heard(store)
    try:
        reply = NewMessage(f"m-{uuid.uuid4()}", "assistant", "the reply", {})
        assert store.turns.record_settlement(
            WS, turn.session_id, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, turn=turn, messages=(reply,),
        )  # fmt: skip
        return heard.take()
    finally:
        heard.close()


def _publisher(daemon: Daemon, sink: Sink) -> EventPublisher:
    assert daemon.store is not None
    return EventPublisher(daemon.store, daemon.catalog, queue.SimpleQueue(), sink=sink)


def _said(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (e["type"], e["turn"]["phase"] if e["type"] == "turn.updated" else "")
        for e in events
        if e["type"] != "message.delta"
    ]


def test_a_claim_and_a_settlement_with_nothing_queued_go_on_their_writers_thread(
    running: tuple[Daemon, Client],
) -> None:
    """A Turn's claim and its settlement, each finding the publisher idle, are projected from
    their carried rows and handed over on the thread that offered them: the publishing thread
    never wakes, and no Turn is read back."""
    daemon, client = running
    assert daemon.store is not None
    sink = Sink()
    publisher, read = read_counting_publisher(daemon, sink, lambda change: type(change).__name__)
    thread = run_publisher(publisher)
    try:
        claim, turn = _claim(daemon.store, new_session(client, WS))
        publisher.offer_many(claim)
        assert publisher.direct_changes == 2
        publisher.offer_many(_settle(daemon.store, turn))
        assert publisher.direct_changes == 4
        assert publisher.batches == 0
    finally:
        stop_publisher(publisher, thread)
    assert _said(sink.events) == [
        ("turn.updated", "active"),
        ("session.upserted", ""),
        ("turn.updated", "settled"),
        ("session.upserted", ""),
    ]
    assert sink.threads == [threading.get_ident()] * 4
    # Built from the rows the changes carried: the Session is read once (its first row this
    # publisher meets), the settlement's touch is applied to the claim's row.
    assert publisher.carried_turns == 2 and publisher.touched == 1
    assert TurnChanged.__name__ not in read
    assert sink.events[1]["session"]["activeTurnId"] == turn.turn_id
    assert sink.events[3]["session"]["activeTurnId"] is None
    assert sink.events[2]["turn"]["messages"][-1]["text"] == "the reply"


def test_a_turn_change_without_its_row_is_queued(
    running: tuple[Daemon, Client],
) -> None:
    """A Turn change that carries no row (its event is read back) goes to the publishing
    thread, idle or not: no store read on a writer's thread for it."""
    daemon, client = running
    assert daemon.store is not None
    _, turn = _claim(daemon.store, new_session(client, WS))
    sink = Sink()
    publisher = _publisher(daemon, sink)
    publisher.offer_many([TurnChanged(WS, turn.session_id, turn.turn_id)])
    assert publisher.direct_changes == 0 and sink.events == []
    thread = run_publisher(publisher)
    stop_publisher(publisher, thread)
    assert sink.threads == [thread.ident]


def test_a_turn_behind_a_change_queued_or_in_hand_is_queued_behind_it(
    running: tuple[Daemon, Client],
) -> None:
    """A change offered before a claim or a settlement and still queued, or taken off the
    queue but not yet handed over, keeps it behind, on the publishing thread; once that is
    handed over, the next claim and settlement go on their writer's thread again."""
    daemon, client = running
    assert daemon.store is not None
    store = daemon.store
    first, second, third = (new_session(client, WS) for _ in range(3))
    sink = Sink()
    publisher = _publisher(daemon, sink)
    # Queued: the thread is not running yet, a change read back is on the queue.
    claim, turn = _claim(store, first)
    publisher.offer_many([TurnChanged(WS, first, turn.turn_id)])
    publisher.offer_many(claim)
    publisher.offer_many(_settle(store, turn))
    assert publisher.direct_changes == 0 and sink.events == []
    # In hand: the thread took a batch and is handing it over (held by the sink).
    sink.hold = threading.Event()
    thread = run_publisher(publisher)
    try:
        assert sink.holding.wait(10)
        claim, turn = _claim(store, second)
        publisher.offer_many(claim)
        publisher.offer_many(_settle(store, turn))
        assert publisher.direct_changes == 0
        sink.hold.set()
        sink.hold = None
        wait_for(lambda: publisher._held == 0)
        queued = len(sink.events)
        claim, turn = _claim(store, third)
        publisher.offer_many(claim)
        publisher.offer_many(_settle(store, turn))
        assert publisher.direct_changes == 4
    finally:
        if sink.hold is not None:
            sink.hold.set()
        sink.hold = None
        stop_publisher(publisher, thread)
    owners = [
        e["agentSessionId"] if e["type"] == "turn.updated" else e["session"]["agentSessionId"]
        for e in sink.events
    ]
    # Each Session's events together, in the order their changes were offered, each Turn's
    # active before settled (the first Turn's read-back, after its settlement's COMMIT,
    # already shows it settled).
    assert owners == sorted(owners, key=[first, second, third].index)
    turns = [(o, p) for o, (_, p) in zip(owners, _said(sink.events), strict=True) if p]
    assert [t for i, t in enumerate(turns) if i == 0 or turns[i - 1] != t] == [
        (first, "settled"),
        *((sid, phase) for sid in (second, third) for phase in ("active", "settled")),
    ]
    assert sink.threads[:queued] == [thread.ident] * queued
    assert sink.threads[queued:] == [threading.get_ident()] * 4
    assert _said(sink.events[queued:]) == [
        ("turn.updated", "active"),
        ("session.upserted", ""),
        ("turn.updated", "settled"),
        ("session.upserted", ""),
    ]


def test_many_sessions_settling_beside_fork_bursts_keep_every_sessions_order(
    running: tuple[Daemon, Client],
) -> None:
    """Through the whole daemon: Sessions run streamed Turns at once while another client
    forks a settled Turn over and over (a fork's burst of changes queued on the publishing
    thread). A subscriber hears every Turn settle, each Turn's events in their law
    (`check_turn_events`), and each Session's own events in commit order: no Session heard
    with a Turn active again after an event that showed it ended, its last event the settled
    state; and some settlements went on their writer's thread."""
    daemon, client = running
    server, publisher = daemon.server, daemon.publisher
    assert server is not None and publisher is not None
    sessions = [new_session(client, WS) for _ in range(3)]
    source = new_session(client, WS)
    forked_turn = run_turn(client, source, "fork me", WS)["turnId"]
    direct = publisher.direct_changes
    turns: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def runner(sid: str) -> None:
        try:
            with Client(server.endpoints[0], timeout=30.0) as own:
                for _ in range(4):
                    turn = run_turn(own, sid, f"/stream say {uuid.uuid4().hex}", WS)
                    turns[turn["turnId"]] = turn
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def forker() -> None:
        try:
            with Client(server.endpoints[0], timeout=30.0) as own:
                while not done.is_set():
                    own.call("fork.create", fork_params(WS, source, forked_turn))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        threads = [threading.Thread(target=runner, args=(sid,)) for sid in sessions]
        fork_thread = threading.Thread(target=forker)
        fork_thread.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        done.set()
        fork_thread.join(30)
        assert errors == []
        hear_settled(sub, turns, heard)
    assert len(turns) == 12
    assert check_turn_events(heard, turns, turns) == []
    for sid in sessions:
        shown = [
            e["session"]
            for e in heard
            if e["type"] == "session.upserted" and e["session"]["agentSessionId"] == sid
        ]
        ended: set[str] = set()
        before: str | None = None
        for index, session in enumerate(shown):
            active = session["activeTurnId"]
            assert active is None or active not in ended, (sid, index, active)
            if before is not None and before != active:
                ended.add(before)
            before = active
        assert shown[-1]["activeTurnId"] is None
        times = [s["updatedAtUnixMs"] for s in shown]
        assert times == sorted(times)
    assert publisher.direct_changes > direct


def test_a_turn_through_the_daemon_is_published_on_the_actors_thread(
    running: tuple[Daemon, Client],
) -> None:
    """A Turn alone through the daemon: its claim and its settlement, each with its Session's
    touch (four changes), go on the Session actor's thread; the subscriber hears them."""
    daemon, client = running
    server, publisher = daemon.server, daemon.publisher
    assert server is not None and publisher is not None
    sid = new_session(client, WS)
    run_turn(client, sid, "warm", WS)
    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        wait_for(lambda: publisher._held == 0)
        direct = publisher.direct_changes
        turn_id = submit(client, sid, f"/stream say {uuid.uuid4().hex}", WS)["turnId"]
        hear_settled(sub, [turn_id], heard)
    assert publisher.direct_changes - direct == 4
    phases = [e["turn"]["phase"] for e in heard if e["type"] == "turn.updated"]
    assert phases[0] == "active" and phases[-1] == "settled"
