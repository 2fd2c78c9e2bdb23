"""A streamed delta's way through the events publisher: handed to the transport on its
producer's thread when nothing is queued or in hand, queued behind anything that is — so it
leaves after every event whose change was offered before it and ahead of every one offered
after it, none lost (docs/design/internals.md, "A delta's way to the transport")."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from actors.context import runtime_key
from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher, StreamDelta, delta_event
from storage.models import TurnChanged
from tests.support.carried import Sink, hear_settled, run_publisher, stop_publisher
from tests.support.daemon import wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

WS = "ws-delta-path"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _delta(sid: str, turn_id: str, text: str) -> StreamDelta:
    return StreamDelta(
        WS,
        sid,
        {"type": "message.delta", "turnId": turn_id, "itemId": "item", "delta": text},
    )


def _marked(publisher: EventPublisher) -> None:
    """Read nothing back: a Turn change's event names the change (its turn id), so the test
    sees which change each published event is."""

    def project(change: Any) -> Any:
        if isinstance(change, TurnChanged):
            return {
                "type": "turn.updated",
                "agentSessionId": change.session_id,
                "turn": {"turnId": change.turn_id},
            }
        return delta_event(change)

    publisher.project = project  # type: ignore[method-assign]


def _publisher(daemon: Daemon, sink: Sink) -> EventPublisher:
    assert daemon.store is not None
    publisher = EventPublisher(daemon.store, daemon.catalog, queue.SimpleQueue(), sink=sink)
    _marked(publisher)
    return publisher


def test_a_delta_with_nothing_queued_is_handed_over_on_its_own_thread(
    running: tuple[Daemon, Client],
) -> None:
    daemon, _ = running
    sink = Sink()
    publisher = _publisher(daemon, sink)
    thread = run_publisher(publisher)
    try:
        publisher.offer_delta(_delta("s1", "t1", "hel"))
        publisher.offer_delta(_delta("s1", "t1", "lo"))
    finally:
        stop_publisher(publisher, thread)
    # Encoded once, on the caller's thread, and never through the publishing thread.
    assert publisher.direct == 2 and publisher.batches == 1  # the stop marker's
    assert sink.threads == [threading.get_ident()] * 2
    assert sink.events == [
        {
            "type": "message.delta",
            "agentSessionId": "s1",
            "turnId": "t1",
            "itemId": "item",
            "kind": "assistant",
            "delta": "hel",
        },
        {
            "type": "message.delta",
            "agentSessionId": "s1",
            "turnId": "t1",
            "itemId": "item",
            "kind": "assistant",
            "delta": "lo",
        },
    ]


def test_a_delta_waits_behind_a_change_queued_or_in_hand_then_goes_direct_again(
    running: tuple[Daemon, Client],
) -> None:
    """A change offered before the delta and still on the queue, or taken off it but not yet
    handed over (its batch in hand), keeps the delta behind it; once the batch is handed
    over the next delta goes straight to the sink again."""
    daemon, _ = running
    sink = Sink()
    publisher = _publisher(daemon, sink)
    # Queued, the thread not running yet.
    publisher.offer(TurnChanged(WS, "s1", "a"))
    publisher.offer_delta(_delta("s1", "a", "1"))
    assert publisher.direct == 0
    # In hand: the thread has taken the batch and is handing it over (held by the sink).
    sink.hold = threading.Event()
    thread = run_publisher(publisher)
    try:
        assert sink.holding.wait(10)
        publisher.offer_delta(_delta("s1", "a", "2"))
        publisher.offer(TurnChanged(WS, "s1", "b"))
        publisher.offer_delta(_delta("s1", "b", "3"))
        assert publisher.direct == 0
        sink.hold.set()
        wait_for(lambda: len(sink.events) == 5)
        sink.hold = None
        publisher.offer_delta(_delta("s1", "b", "4"))
        assert publisher.direct == 1
    finally:
        sink.hold = None
        stop_publisher(publisher, thread)
    said = [e.get("delta") or e["turn"]["turnId"] for e in sink.events]
    assert said == ["a", "1", "2", "b", "3", "4"]
    assert sink.threads[-1] == threading.get_ident()


def test_deltas_from_many_threads_keep_their_order_against_every_change_and_none_is_lost(
    running: tuple[Daemon, Client],
) -> None:
    """Producers each alternate a Turn change and a delta (change n, delta n, change n+1, …)
    while another streams deltas alone: every producer's events leave in the order it offered
    them, whether each delta went through the queue or straight to the sink, and all of them
    leave."""
    daemon, _ = running
    sink = Sink()
    publisher = _publisher(daemon, sink)
    thread = run_publisher(publisher)
    rounds, mixers = 400, 3
    start = threading.Barrier(mixers + 1)

    def mixer(k: int) -> None:
        start.wait()
        for n in range(rounds):
            publisher.offer(TurnChanged(WS, f"m{k}", f"m{k}-{n}"))
            publisher.offer_delta(_delta(f"m{k}", f"m{k}-{n}", f"m{k}-{n}"))

    def streamer() -> None:
        start.wait()
        for n in range(rounds * 2):
            publisher.offer_delta(_delta("s", "s", f"s-{n}"))

    workers = [threading.Thread(target=mixer, args=(k,)) for k in range(mixers)]
    workers.append(threading.Thread(target=streamer))
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        wait_for(lambda: len(sink.events) == rounds * 2 * mixers + rounds * 2, 30)
    finally:
        stop_publisher(publisher, thread)
    by_source: dict[str, list[str]] = {}
    for event in sink.events:
        sid = str(event["agentSessionId"])
        if event["type"] == "message.delta":
            by_source.setdefault(sid, []).append(f"d:{event['delta']}")
        else:
            by_source.setdefault(sid, []).append(f"c:{event['turn']['turnId']}")
    for k in range(mixers):
        expected = [x for n in range(rounds) for x in (f"c:m{k}-{n}", f"d:m{k}-{n}")]
        assert by_source[f"m{k}"] == expected
    assert by_source["s"] == [f"d:s-{n}" for n in range(rounds * 2)]
    # Both ways were taken (else the test proved one of them only).
    assert 0 < publisher.direct < rounds * (mixers + 2)
    assert publisher._held == 0


def test_a_turns_deltas_reach_a_subscriber_whole_and_before_its_settlement(
    running: tuple[Daemon, Client],
) -> None:
    """Through the whole daemon: every delta of a streamed Turn reaches a subscriber after
    the Turn's first `turn.updated` and before the one that settles it, and they make up its
    reply (`check_turn_events`)."""
    from tests.support.daemon import create_session, run_turn
    from tests.support.invariants import check_turn_events
    from transport.client import EventSubscriber

    daemon, client = running
    server = daemon.server
    assert server is not None and daemon.publisher is not None
    sid = create_session(client, WS)["agentSessionId"]
    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(5)]
        ids = {t["turnId"] for t in turns}
        hear_settled(sub, ids, heard)
    deltas = [e for e in heard if e["type"] == "message.delta"]
    assert deltas, "the fake model streamed no delta"
    assert daemon.publisher.direct > 0
    # Sent on the XPUB by the thread that read them from the worker (`publish_now`).
    assert server.events_now > 0
    assert check_turn_events(heard, ids) == []
    # The check is not vacuous: a delta moved past its Turn's settlement, or one lost, fails it.
    last = max(i for i, e in enumerate(heard) if e["type"] == "message.delta")
    without = heard[:last] + heard[last + 1 :]
    assert check_turn_events([*without, heard[last]], ids)
    assert check_turn_events(without, ids)


def test_a_sessions_runtime_key_is_parsed_once_for_its_deltas(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker events' sink runs per streamed delta on the supervisor's thread: the runtime
    # key's (workspace, Session) is parsed at its first event, then looked up.
    import agenthost.daemon as daemon_module

    daemon, _ = running
    parsed: list[str] = []
    real = daemon_module.parse_runtime_key

    def counting(key: str) -> tuple[str, str]:
        parsed.append(key)
        return real(key)

    offered: list[StreamDelta] = []
    monkeypatch.setattr(daemon_module, "parse_runtime_key", counting)
    assert daemon.publisher is not None
    monkeypatch.setattr(daemon.publisher, "offer_delta", offered.append)
    keys = [runtime_key(WS, "s1"), runtime_key(WS, "s2")]
    for n in range(5):
        for key in keys:
            event = {"type": "message.delta", "turnId": f"t-{key[-2:]}", "delta": str(n)}
            daemon._on_worker_event("tutti-agent", key, event)
    assert sorted(parsed) == sorted(keys)
    assert [(d.workspace_id, d.session_id, d.event["delta"]) for d in offered] == [
        (WS, sid, str(n)) for n in range(5) for sid in ("s1", "s2")
    ]
    daemon._on_worker_event("tutti-agent", "no key", {"type": "message.delta"})
    assert len(offered) == 10  # an unreadable key is still refused


def test_a_direct_deltas_body_is_packed_once_from_its_event(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delta handed over on its producer's thread is packed from `delta_event`'s map as it is
    # by the thread's own Packer (not `encode_event`: its copy of the map and `msgpack.packb`,
    # a Packer built per call); the body is the same.
    daemon, _ = running
    sink = Sink()
    publisher = _publisher(daemon, sink)

    def refused(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("msgpack.packb on a direct delta")

    monkeypatch.setattr(msgpack, "packb", refused)
    for text in ("hel", "lo"):
        delta = _delta("s1", "t1", text)
        publisher.offer_delta(delta)
        assert sink.events[-1] == dict(delta_event(delta))
    assert publisher.direct == 2
