"""The Engine's client-observed ACK on a fake clock (seed 000 §8.3): 10 s deadline, retries after
1, 2, 5, 10, 30, 30 s with the same operation id, stop on success or close, never a re-fork;
removal of the child changes nothing; pruning keeps every unresolved record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import pytest

from client.engine.lifecycle import Engine
from client.engine.values import ACK_BACKOFF_S, ACK_DEADLINE_S, AckState, MutationStatus
from protocol.methods import Method
from tests.client.conftest import events_live, source
from tests.client.fakeclock import FakeClock
from tests.client.relay import Relay, wait_until
from tests.support.daemon import create_session, run_turn
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


class Recording:
    """The real client, with the fake time of every request it sends (a spy, not a fake)."""

    def __init__(self, client: Client, clock: FakeClock) -> None:
        self.client = client
        self.clock = clock
        self.sent: list[tuple[float, str, dict[str, Any]]] = []

    def submit(self, method: Method[Any, Any], params: Mapping[str, Any]) -> Future[Any]:
        self.sent.append((self.clock.now(), method.name, dict(params or {})))
        return self.client.submit(method, params)

    def times(self, method: str) -> list[float]:
        return [t for t, m, _ in self.sent if m == method]


@pytest.fixture
def recorded(relay: Relay, clock: FakeClock, ws: str) -> Any:
    made: list[tuple[Engine, Client]] = []

    def make(**kwargs: Any) -> tuple[Engine, Recording]:
        c = Client(relay.frontend, timeout=30)
        api = Recording(c, clock)
        engine = Engine(api, ws, scheduler=clock, **kwargs)
        made.append((engine, c))
        return engine, api

    yield make
    for engine, c in made:
        engine.close()
        c.close()


def committed(engine: Engine, sid: str, turn: str, clock: FakeClock) -> Any:
    def done() -> Any:
        record = engine.mutation(sid, turn)
        if record.status is MutationStatus.IN_FLIGHT and record.operation_id is not None:
            # Poll with a step that cannot reach any ACK timer (the ACK is not sent yet).
            clock.advance(engine.poll_interval)
        return record.status is MutationStatus.SUCCEEDED and record

    return wait_until(done)


def test_default_deadline_and_backoff_are_the_seed_values() -> None:
    assert ACK_DEADLINE_S == 10.0
    assert ACK_BACKOFF_S == (1.0, 2.0, 5.0, 10.0, 30.0)


def test_unanswered_ack_is_retried_on_the_capped_backoff_with_the_same_operation(
    recorded: Callable[..., tuple[Engine, Recording]],
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine, api = recorded()
    sid, turns = source(client, ws, turns=1)
    relay.drop_requests("fork.acknowledge")  # never answered: only the deadline ends each try
    engine.fork(sid, turns[0])
    record = committed(engine, sid, turns[0], clock)
    assert record.ack is AckState.PENDING
    t0 = api.times("fork.acknowledge")[0]
    clock.advance(9.999)
    assert engine.mutation(sid, turns[0]).ack_attempts == 1  # deadline not reached
    clock.advance(200 - 9.999)
    times = [round(t - t0, 3) for t in api.times("fork.acknowledge")]
    # Each try waits its 10 s deadline, then 1, 2, 5, 10, 30, 30 s before the next one.
    assert times == [0, 11, 23, 38, 58, 98, 138, 178]
    record = engine.mutation(sid, turns[0])
    assert record.status is MutationStatus.SUCCEEDED and record.ack is AckState.PENDING
    assert record.ack_attempts == 8
    ops = {p["operationId"] for _, m, p in api.sent if m == "fork.acknowledge"}
    assert ops == {record.operation_id}
    wait_until(lambda: len(relay.requests("fork.acknowledge")) == 8)
    assert len(relay.requests("fork.create")) == 1  # never a re-fork
    # Success stops the retries for good.
    relay.clear("fork.acknowledge")
    clock.advance(clock.pending()[0] - clock.now())  # the next scheduled retry
    engine.wait_for(lambda: engine.mutation(sid, turns[0]).ack is AckState.OBSERVED, 10)
    sent = len(api.times("fork.acknowledge"))
    clock.advance(1000)
    assert len(api.times("fork.acknowledge")) == sent == 9
    assert clock.pending() == []


def test_error_reply_retries_after_one_second_and_its_deadline_adds_no_retry(
    recorded: Callable[..., tuple[Engine, Recording]],
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine, api = recorded()
    sid, turns = source(client, ws, turns=1)
    relay.answer(
        "fork.acknowledge",
        503,
        {"code": "unavailable", "reason": "overloaded", "message": "busy", "retryable": True},
    )
    engine.fork(sid, turns[0])
    committed(engine, sid, turns[0], clock)
    engine.wait_for(lambda: (engine.mutation(sid, turns[0]).error or "").startswith("ack failed"))
    t0 = api.times("fork.acknowledge")[0]
    assert [round(d - clock.now(), 3) for d in clock.pending()] == [1.0]
    relay.clear("fork.acknowledge")
    clock.advance(1.0)
    engine.wait_for(lambda: engine.mutation(sid, turns[0]).ack is AckState.OBSERVED, 10)
    clock.advance(60)  # the first try's deadline is gone: no third ACK
    assert [round(t - t0, 3) for t in api.times("fork.acknowledge")] == [0, 1.0]


def test_close_stops_pending_ack_retries(
    recorded: Callable[..., tuple[Engine, Recording]],
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine, api = recorded()
    sid, turns = source(client, ws, turns=1)
    relay.drop_requests("fork.acknowledge")
    engine.fork(sid, turns[0])
    committed(engine, sid, turns[0], clock)
    clock.advance(11)
    assert len(api.times("fork.acknowledge")) == 2
    engine.close()
    clock.advance(1000)
    assert len(api.times("fork.acknowledge")) == 2


def test_child_removal_keeps_the_observation_and_the_pending_ack(
    make_engine: Callable[..., Engine],
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine = make_engine(events=True)
    events_live(engine, client, ws)
    sid, turns = source(client, ws)
    # 1) observed, then the child is deleted: still succeeded and observed.
    engine.fork(sid, turns[0])
    observed = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[0])).ack is AckState.OBSERVED and r, 20
    )
    client.call("session.delete", {"workspaceId": ws, "agentSessionId": observed.child_session_id})
    engine.wait_for(lambda: engine.session(observed.child_session_id) is None, 10)
    assert engine.mutation(sid, turns[0]) == observed
    # 2) ACK pending, then the child is deleted: the ACK keeps being retried and lands.
    relay.drop_requests("fork.acknowledge")
    engine.fork(sid, turns[1])
    pending = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[1])).status is MutationStatus.SUCCEEDED and r, 20
    )
    client.call("session.delete", {"workspaceId": ws, "agentSessionId": pending.child_session_id})
    engine.wait_for(lambda: engine.session(pending.child_session_id) is None, 10)
    relay.clear("fork.acknowledge")
    clock.advance(ACK_DEADLINE_S + 1)
    done = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[1])).ack is AckState.OBSERVED and r, 10
    )
    assert done.status is MutationStatus.SUCCEEDED and done.ack_attempts == 2
    acks = relay.requests("fork.acknowledge")
    assert [a.params["operationId"] for a in acks][-2:] == [pending.operation_id] * 2


def test_pruning_keeps_128_settled_records_and_every_unresolved_one(
    make_engine: Callable[..., Engine],
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws, turns=2)
    # An ACK-pending record...
    relay.drop_requests("fork.acknowledge")
    engine.fork(sid, turns[0])
    wait_until(lambda: engine.mutation(sid, turns[0]).status is MutationStatus.SUCCEEDED)
    # ...an unknown one (its request is lost; the deadline makes it unknown)...
    relay.drop_requests("fork.create", 1)
    engine.fork(sid, turns[1])
    wait_until(lambda: relay.requests("fork.create", "dropped"))
    clock.advance(engine.create_deadline)
    assert engine.mutation(sid, turns[1]).status is MutationStatus.UNKNOWN
    # ...then 130 confirmed failures on boundaries the daemon rejects.
    # Replies may come back in any order, so the two oldest settle before the rest are sent.
    bogus = [f"missing-turn-{i:03d}" for i in range(130)]
    for batch in (bogus[:2], bogus[2:]):
        for turn in batch:
            engine.fork(sid, turn)
        wait_until(
            lambda batch=batch: all(
                (r := engine.mutation(sid, t)) is None or r.status is MutationStatus.FAILED
                for t in batch
            )
        )
    records = engine.mutations()
    settled = [r for r in records if r.settled]
    assert len(settled) == 128
    # The two oldest failures went; the unresolved records stay whatever their age.
    assert {r.turn_id for r in settled} == set(bogus[2:])
    assert engine.mutation(sid, turns[0]).ack is AckState.PENDING
    assert engine.mutation(sid, turns[1]).status is MutationStatus.UNKNOWN
    assert len(records) == 130


def test_unknown_mutation_still_completes_from_a_later_event(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, clock: FakeClock, ws: str
) -> None:
    engine = make_engine(events=True)
    events_live(engine, client, ws)
    sid = create_session(client, ws, title="s")["agentSessionId"]
    turn = run_turn(client, sid, "hello", ws)["turnId"]
    relay.hold_replies("fork.create")
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:1500"}})
    engine.fork(sid, turn)
    wait_until(lambda: relay.requests("fork.create"))
    clock.advance(engine.create_deadline)  # no reply in time: delivery unknown
    assert engine.mutation(sid, turn).status is MutationStatus.UNKNOWN
    done = engine.wait_for(
        lambda: (r := engine.mutation(sid, turn)).status is MutationStatus.SUCCEEDED and r, 20
    )
    assert engine.session(done.child_session_id) is not None
