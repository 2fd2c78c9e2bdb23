"""The event publisher: it builds no event for a workspace nobody subscribed to (no
store read, no projection), and once a subscriber is connected it gets the events as before;
streamed deltas queued ahead of a change it reads back leave before that read."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from agenthost.publisher import HANDOVER, EventPublisher, StreamDelta
from storage.models import SessionChanged, TurnChanged
from tests.support.daemon import create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client, EventSubscriber

pytestmark = pytest.mark.timeout(60)

WS = "ws-publisher"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def test_no_event_is_built_for_a_workspace_nobody_listens_to(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    publisher, server = daemon.publisher, daemon.server
    assert publisher is not None and server is not None
    sid = str(uuid.uuid4())
    status, _ = client.call_raw(
        "session.create", {"workspaceId": WS, "agentSessionId": sid, "provider": "tutti-agent"}
    )
    assert status == 200
    for i in range(5):
        status, _ = client.call_raw(
            "session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": f"t{i}"}
        )
        assert status == 200
    wait_for(lambda: publisher.skipped >= 6)
    assert publisher.projected == 0 and not server.wants(WS)

    # A subscriber of another workspace (a prefix of ours on the exact socket) changes nothing.
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        assert not server.wants("ws-other")
        status, _ = client.call_raw(
            "session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": "heard"}
        )
        assert status == 200
        while True:
            event = sub.next(10)
            assert event is not None, "no event for a subscribed workspace"
            if event["type"] == "session.upserted" and event["session"]["title"] == "heard":
                break
        assert publisher.projected >= 1
    # The subscriber left: its workspace is no longer wanted.
    wait_for(lambda: not server.wants(WS))


def test_a_session_changed_twice_in_one_batch_is_published_once(
    running: tuple[Daemon, Client],
) -> None:
    """The batch's events read one snapshot: a Session's second change in the same batch, even
    with another Session's change between the two, would repeat its first event word for word."""
    daemon, client = running
    server, store = daemon.server, daemon.store
    assert server is not None and store is not None
    sids = [str(uuid.uuid4()) for _ in range(3)]
    for sid in sids:
        status, _ = client.call_raw(
            "session.create",
            {"workspaceId": WS, "agentSessionId": sid, "provider": "tutti-agent", "title": sid},
        )
        assert status == 200
    a, b, c = sids
    # A publisher of its own on the daemon's store and server, fed batches by hand.
    mine = EventPublisher(store, daemon.catalog, queue.SimpleQueue(), sink=server)
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        mine._publish([SessionChanged(WS, a), SessionChanged(WS, b), SessionChanged(WS, a)])
        mine._publish([SessionChanged(WS, c)])  # the end marker of the batch above
        heard: list[str] = []
        while True:
            event = sub.next(10)
            assert event is not None, "the batches' events never came"
            if event["type"] != "session.upserted":
                continue
            sid = event["session"]["agentSessionId"]
            if sid == c:
                break
            if sid in (a, b):
                heard.append(sid)
    assert heard == [a, b]
    assert (mine.projected, mine.repeats) == (3, 1)


class RecordingSink:
    """An `EventSink` that wants every workspace and records each hand-over to the loop, and,
    for each, how many store reads the publisher had begun by then."""

    def __init__(self, reads: list[int]) -> None:
        self.reads = reads
        self.handovers: list[tuple[list[str], int]] = []

    def wants(self, topic: str) -> bool:
        return True

    def publish_many(self, events: list[tuple[str, Any]]) -> bool:
        self.handovers.append(([e["type"] for _, e in events], len(self.reads)))
        return True


def test_deltas_queued_before_a_turn_change_leave_before_its_store_read(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    assert daemon.store is not None
    sid = create_session(client, WS)["agentSessionId"]
    turn = run_turn(client, sid, "hello", WS)
    reads: list[int] = []
    sink = RecordingSink(reads)
    publisher = EventPublisher(daemon.store, daemon.catalog, queue.SimpleQueue(), sink=sink)
    project = publisher.project

    def counted(change: Any) -> Any:
        if isinstance(change, TurnChanged):
            reads.append(1)
        return project(change)

    publisher.project = counted  # type: ignore[method-assign]
    delta = {"type": "message.delta", "turnId": turn["turnId"], "itemId": "i", "delta": "x"}
    changed = TurnChanged(WS, sid, turn["turnId"])
    publisher._publish(
        [
            StreamDelta(WS, sid, delta),
            StreamDelta(WS, sid, delta),
            changed,
            StreamDelta(WS, sid, delta),
            changed,
            StreamDelta(WS, sid, delta),
        ]
    )
    # In order; each delta handed over before any read queued after it began.
    assert sink.handovers == [
        (["message.delta", "message.delta"], 0),
        (["turn.updated", "message.delta"], 1),
        (["turn.updated", "message.delta"], 2),
    ]


def test_events_read_back_go_to_the_loop_together_up_to_a_bound(
    running: tuple[Daemon, Client],
) -> None:
    """A batch's events read back from the store are one hand-over to the transport loop (one
    pipe message), not one each; past `HANDOVER` of them the next read waits for none."""
    daemon, client = running
    assert daemon.store is not None
    sids = [create_session(client, WS)["agentSessionId"] for _ in range(HANDOVER + 2)]
    sink = RecordingSink([])
    publisher = EventPublisher(daemon.store, daemon.catalog, queue.SimpleQueue(), sink=sink)
    publisher._publish([SessionChanged(WS, sid) for sid in sids[:3]])
    assert sink.handovers == [(["session.upserted"] * 3, 0)]
    sink.handovers.clear()
    publisher._publish([SessionChanged(WS, sid) for sid in sids])
    assert [len(types) for types, _ in sink.handovers] == [HANDOVER, 2]


def test_one_store_delivery_is_one_batch_however_the_thread_wakes(
    running: tuple[Daemon, Client],
) -> None:
    """The store hands its subscriber a delivery's changes together (`subscribe_batches`): a
    fork's burst is one queue entry, so the thread, waiting already, takes it whole — one
    read-back per entity — instead of waking at the first change and reading the rest again
    in a second batch. What nobody wants is dropped from the entry before it is queued."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sids = [str(uuid.uuid4()) for _ in range(2)]
    for sid in sids:
        status, _ = client.call_raw(
            "session.create", {"workspaceId": WS, "agentSessionId": sid, "provider": "tutti-agent"}
        )
        assert status == 200
    a, b = sids
    sink = RecordingSink([])
    changes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    publisher = EventPublisher(store, daemon.catalog, changes, sink=sink)
    thread = threading.Thread(target=publisher.run, daemon=True)
    thread.start()
    try:
        unsubscribe = store.db.subscribe_batches(publisher.offer_many)
        try:
            with store.db.events_after():  # one delivery: both writes' events together
                for sid in (a, b, a):
                    store.sessions.update_title(WS, sid, f"title of {sid}")
        finally:
            unsubscribe()
        wait_for(lambda: publisher.projected >= 2)
        changes.put(None)
        thread.join(10)
    finally:
        changes.put(None)
    assert publisher.batches == 2  # the delivery, then the stop marker
    assert (publisher.projected, publisher.repeats) == (2, 1)
    assert [types for types, _ in sink.handovers] == [["session.upserted"] * 2]

    # Nobody listening: the unwanted changes never reach the queue.
    deaf = EventPublisher(store, daemon.catalog, queue.SimpleQueue(), sink=None)
    deaf.offer_many([SessionChanged(WS, a), SessionChanged(WS, b)])
    assert deaf.skipped == 2 and deaf.queue.empty()
