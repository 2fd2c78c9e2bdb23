"""Engine rules of seed 000 §8.3 and §9 against a real daemon: identity allocation and
reuse in every state, accepted stays in flight until a terminal read, adoption of the durable
identity, and the child upserted before its single ACK."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from client.engine.lifecycle import Engine
from client.engine.values import AckState, ChangeKind, EngineChange, MutationStatus
from tests.client.conftest import events_live, source
from tests.client.fakeclock import FakeClock
from tests.client.relay import Relay, wait_until
from tests.support.daemon import DaemonProcess, create_session, fork_params, wait_for
from tests.support.homes import child_rollouts, runtime_home
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


def plain_fork(c: Client, ws: str, sid: str, turn_id: str) -> dict[str, Any]:
    """A fork through a bare client that never ACKs (another app, or this one before a crash)."""
    status, body = c.call_raw(
        "fork.create",
        fork_params(ws, sid, turn_id),
    )
    assert status < 400, body
    op = body["operation"]
    return dict(
        wait_for(
            lambda: (
                (
                    o := c.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
                        "operation"
                    ]
                )["status"]
                != "accepted"
                and o
            )
        )
    )


def settle(engine: Engine, clock: FakeClock, sid: str, turn: str, timeout: float = 30) -> Any:
    """Wait for the record to leave inFlight, letting the fake clock run the GET polls."""

    def done() -> Any:
        record = engine.mutation(sid, turn)
        if record is not None and record.status is MutationStatus.IN_FLIGHT:
            if record.operation_id is not None:
                clock.advance(engine.poll_interval)
            return None
        return record

    return wait_until(done, timeout)


def provider_children(daemon: DaemonProcess, ws: str, sid: str) -> int:
    return len(child_rollouts(runtime_home(daemon.home, ws, sid)))


def test_first_click_allocates_identities_and_success_acks_once(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    record = engine.fork(sid, turns[0])
    assert record.status is MutationStatus.IN_FLIGHT
    uuid.UUID(record.request_id), uuid.UUID(record.target_session_id)
    done = settle(engine, clock, sid, turns[0])
    assert done.status is MutationStatus.SUCCEEDED, done
    assert done.child_session_id == record.target_session_id
    assert engine.session(record.target_session_id)["forkedFrom"]["sourceTurnId"] == turns[0]
    done = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[0])).ack is AckState.OBSERVED and r, 10
    )
    assert done.ack_attempts == 1
    acks = relay.requests("fork.acknowledge")
    assert [a.params["operationId"] for a in acks] == [done.operation_id]
    assert len(relay.requests("fork.create")) == 1


def test_duplicate_click_while_in_flight_sends_nothing(
    make_engine: Callable[..., Engine],
    daemon: DaemonProcess,
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:2500"}})
    first = engine.fork(sid, turns[1])
    second = engine.fork(sid, turns[1])
    assert second == first
    # Still in flight once the daemon has accepted it (202): a click sends nothing either.
    accepted = engine.wait_for(lambda: (r := engine.mutation(sid, turns[1])).operation_id and r, 10)
    assert accepted.status is MutationStatus.IN_FLIGHT and accepted.phase in (
        "frozen",
        "dispatching",
    )
    assert engine.is_fork_pending(sid, turns[1])
    assert not engine.is_fork_pending(sid, turns[0])  # other Turns stay usable
    assert engine.fork(sid, turns[1]).request_id == first.request_id
    assert len(relay.requests("fork.create")) == 1
    assert settle(engine, clock, sid, turns[1]).status is MutationStatus.SUCCEEDED
    assert len(relay.requests("fork.create")) == 1
    assert provider_children(daemon, ws, sid) == 1


def test_accepted_stays_in_flight_until_get_is_terminal(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()  # no events: only fork.get can finish it
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:2200"}})
    engine.fork(sid, turns[0])
    record = engine.wait_for(lambda: (r := engine.mutation(sid, turns[0])).operation_id and r, 10)
    # The daemon finishes the saga on its own...
    wait_for(
        lambda: (
            client.call("fork.get", {"workspaceId": ws, "operationId": record.operation_id})[
                "operation"
            ]["status"]
            == "committed"
        )
    )
    # ...but until the Engine reads a terminal operation, the mutation is in flight.
    assert engine.mutation(sid, turns[0]).status is MutationStatus.IN_FLIGHT
    assert engine.session(record.target_session_id) is None
    clock.advance(engine.poll_interval)
    done = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[0])).status is not MutationStatus.IN_FLIGHT and r,
        10,
    )
    assert done.status is MutationStatus.SUCCEEDED
    assert engine.session(record.target_session_id) is not None


def test_fork_operation_event_completes_an_accepted_mutation(
    make_engine: Callable[..., Engine], client: Client, ws: str
) -> None:
    engine = make_engine(events=True)
    events_live(engine, client, ws)
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:1500"}})
    engine.fork(sid, turns[0])
    # The fake clock never moves: no GET poll runs, the events alone settle the mutation.
    done = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[0])).ack is AckState.OBSERVED and r, 20
    )
    assert done.status is MutationStatus.SUCCEEDED
    assert engine.session(done.child_session_id) is not None


def test_new_attempt_after_confirmed_failure_gets_new_identities(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "error"}})
    failed = engine.fork(sid, turns[0])
    failed = settle(engine, clock, sid, turns[0])
    assert failed.status is MutationStatus.FAILED and failed.error
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "off"}})
    retry = engine.fork(sid, turns[0])
    assert retry.request_id != failed.request_id
    assert retry.target_session_id != failed.target_session_id
    assert settle(engine, clock, sid, turns[0]).status is MutationStatus.SUCCEEDED
    sent = relay.requests("fork.create")
    assert [s.params["requestId"] for s in sent] == [failed.request_id, retry.request_id]


def test_boundary_error_is_a_confirmed_failure_with_its_reason(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, _ = source(client, ws, turns=1)
    engine.fork(sid, "no-such-turn")
    record = settle(engine, clock, sid, "no-such-turn")
    assert record.status is MutationStatus.FAILED
    assert record.error in ("turn_not_found", "agent_session_fork_conflict")
    assert record.operation_id is None


def test_retry_after_durable_unknown_reuses_identity_and_never_reforks(
    make_engine: Callable[..., Engine],
    daemon: DaemonProcess,
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    engine.fork(sid, turns[0])
    unknown = settle(engine, clock, sid, turns[0])
    assert unknown.status is MutationStatus.UNKNOWN and unknown.operation_id
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    # The replayed create answers `unknown` at once; hold the click's own flush until that
    # answer has landed, so the click returns after it (the race a loaded CI run once lost).
    clicker = threading.current_thread()

    def answered(change: EngineChange) -> None:
        if threading.current_thread() is clicker:
            wait_until(
                lambda: engine.mutation(sid, turns[0]).status is not MutationStatus.IN_FLIGHT, 10
            )

    unsubscribe = engine.subscribe(answered)
    retry = engine.fork(sid, turns[0])
    unsubscribe()
    assert retry.status is MutationStatus.IN_FLIGHT  # the click's record, as it left it
    assert retry.create_attempts == 2
    again = settle(engine, clock, sid, turns[0])
    assert again.status is MutationStatus.UNKNOWN
    assert again.operation_id == unknown.operation_id
    sent = relay.requests("fork.create")
    assert len(sent) == 2
    assert {(s.params["requestId"], s.params["targetAgentSessionId"]) for s in sent} == {
        (unknown.request_id, unknown.target_session_id)
    }
    assert provider_children(daemon, ws, sid) == 1  # the one that may exist, never a second


def test_retry_after_lost_reply_reuses_identity_and_adopts_the_commit(
    make_engine: Callable[..., Engine],
    daemon: DaemonProcess,
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    engine = make_engine()  # no events: the lost reply is the only news
    sid, turns = source(client, ws)
    relay.hold_replies("fork.create")  # the daemon executes it; the reply never arrives
    first = engine.fork(sid, turns[1])
    wait_until(lambda: relay.requests("fork.create"))
    clock.advance(engine.create_deadline)
    lost = engine.mutation(sid, turns[1])
    assert lost.status is MutationStatus.UNKNOWN and lost.operation_id is None
    relay.clear("fork.create")
    retry = engine.fork(sid, turns[1])
    assert (retry.request_id, retry.target_session_id) == (
        first.request_id,
        first.target_session_id,
    )
    done = settle(engine, clock, sid, turns[1])
    assert done.status is MutationStatus.SUCCEEDED
    assert done.child_session_id == first.target_session_id
    assert provider_children(daemon, ws, sid) == 1


def test_click_while_ack_pending_sends_nothing(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    relay.drop_requests("fork.acknowledge")
    engine.fork(sid, turns[0])
    pending = settle(engine, clock, sid, turns[0])
    assert pending.status is MutationStatus.SUCCEEDED and pending.ack is AckState.PENDING
    assert engine.fork(sid, turns[0]) == pending
    assert len(relay.requests("fork.create")) == 1


def test_click_after_observed_success_creates_a_new_branch(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    engine.fork(sid, turns[0])
    settle(engine, clock, sid, turns[0])
    first = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[0])).ack is AckState.OBSERVED and r, 10
    )
    second = engine.fork(sid, turns[0])
    assert second.request_id != first.request_id
    done = settle(engine, clock, sid, turns[0])
    assert done.status is MutationStatus.SUCCEEDED
    assert done.child_session_id not in (None, first.child_session_id)
    assert engine.session(first.child_session_id) is not None  # the first branch stays cached


def test_adopts_the_durable_identity_of_a_committed_unacked_fork(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, clock: FakeClock, ws: str
) -> None:
    sid, turns = source(client, ws)
    # An earlier app run forked and crashed before its ACK: the barrier holds the boundary.
    original = plain_fork(client, ws, sid, turns[1])
    assert original["status"] == "committed"
    engine = make_engine()  # a fresh Engine with no memory of that identity
    sent = engine.fork(sid, turns[1])
    assert sent.target_session_id != original["targetAgentSessionId"]
    done = settle(engine, clock, sid, turns[1])
    assert done.status is MutationStatus.SUCCEEDED
    assert done.operation_id == original["operationId"]
    assert done.request_id == original["requestId"]
    assert done.target_session_id == original["targetAgentSessionId"]
    assert done.child_session_id == original["targetAgentSessionId"]
    assert engine.session(sent.target_session_id) is None  # never a fake "new" child
    engine.wait_for(lambda: engine.mutation(sid, turns[1]).ack is AckState.OBSERVED, 10)
    assert [a.params["operationId"] for a in relay.requests("fork.acknowledge")] == [
        original["operationId"]
    ]
    # The ACK released the barrier: the next explicit fork is a real new branch.
    assert plain_fork(client, ws, sid, turns[1])["operationId"] != original["operationId"]


def test_adopts_the_durable_identity_of_an_unknown_fork_and_retries_with_it(
    make_engine: Callable[..., Engine],
    daemon: DaemonProcess,
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    original = plain_fork(client, ws, sid, turns[0])
    assert original["status"] == "unknown"
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    engine = make_engine()
    engine.fork(sid, turns[0])
    record = settle(engine, clock, sid, turns[0])
    assert record.status is MutationStatus.UNKNOWN
    assert (record.operation_id, record.request_id, record.target_session_id) == (
        original["operationId"],
        original["requestId"],
        original["targetAgentSessionId"],
    )
    engine.fork(sid, turns[0])
    settle(engine, clock, sid, turns[0])
    assert relay.requests("fork.create")[-1].params["requestId"] == original["requestId"]
    assert provider_children(daemon, ws, sid) == 1


def test_child_event_before_the_reply_acks_exactly_once_after_the_upsert(
    make_engine: Callable[..., Engine], client: Client, relay: Relay, ws: str
) -> None:
    engine = make_engine(events=True)
    events_live(engine, client, ws)
    sid, turns = source(client, ws)
    cached_at_ack: list[bool] = []

    def on_request(method: str, params: dict[str, Any]) -> None:
        if method == "fork.acknowledge":
            record = engine.mutation(sid, turns[0])
            child = None if record is None else record.child_session_id
            cached_at_ack.append(child is not None and engine.session(child) is not None)

    relay.on_request = on_request
    relay.hold_replies("fork.create")
    engine.fork(sid, turns[0])
    # The reply is held; the daemon's events alone bring the committed child.
    record = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[0])).ack is AckState.OBSERVED and r, 20
    )
    assert record.status is MutationStatus.SUCCEEDED
    assert relay.release_held() == 1
    # A later request on the same socket is answered after the held reply was handled.
    wait_until(lambda: relay.requests("fork.create", "forwarded"))
    engine.request("host.status")
    engine.request("host.status")
    assert len(relay.requests("fork.acknowledge")) == 1
    assert engine.mutation(sid, turns[0]).ack_attempts == 1
    assert cached_at_ack == [True]


def test_listeners_see_mutation_and_session_changes(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    seen: list[EngineChange] = []
    engine.subscribe(seen.append)
    sid, turns = source(client, ws, turns=1)
    engine.fork(sid, turns[0])
    done = settle(engine, clock, sid, turns[0])
    # Listeners are called after the Engine's lock is released, so a change can reach them a
    # moment after the record reads settled: wait for it rather than race it.
    assert wait_until(
        lambda: any(c.kind is ChangeKind.MUTATION and c.key == (sid, turns[0]) for c in seen), 10
    )
    assert wait_until(
        lambda: any(
            c.kind is ChangeKind.SESSION and c.session_id == done.child_session_id for c in seen
        ),
        10,
    )


def test_replay_after_the_source_was_deleted_adopts_the_commit_and_acks(
    make_engine: Callable[..., Engine],
    client: Client,
    relay: Relay,
    clock: FakeClock,
    ws: str,
) -> None:
    """Seed 000 §8: a fork committed but was never ACKed (the app died with the reply), then
    the source was deleted. The restarted app's click (new identity, held barrier) gets the
    durable committed operation — not 404 — so the Engine adopts the original child and ACKs
    it instead of recording a committed fork as failed."""
    sid, turns = source(client, ws)
    committed = plain_fork(client, ws, sid, turns[1])
    assert committed["status"] == "committed"
    client.call("session.delete", {"workspaceId": ws, "agentSessionId": sid})
    engine = make_engine()
    engine.fork(sid, turns[1])
    done = settle(engine, clock, sid, turns[1])
    assert done.status is MutationStatus.SUCCEEDED, done
    assert done.operation_id == committed["operationId"]
    assert done.child_session_id == committed["targetAgentSessionId"]
    done = engine.wait_for(
        lambda: (r := engine.mutation(sid, turns[1])).ack is AckState.OBSERVED and r, 10
    )
    assert [a.params["operationId"] for a in relay.requests("fork.acknowledge")] == [
        committed["operationId"]
    ]


def test_a_session_event_with_its_settings_omitted_keeps_the_settings_held(
    make_engine: Callable[..., Engine], client: Client, ws: str
) -> None:
    # Settings past the event's bound come as {} with settingsOmitted: true; the cache keeps
    # the settings it read whole (session.list) instead of taking that {}.
    settings = {"big": "s" * (300 << 10)}
    sid = create_session(client, ws, title="big", settings=settings)["agentSessionId"]
    engine = make_engine(events=True)
    events_live(engine, client, ws)
    engine.load_sessions()
    assert (engine.session(sid) or {}).get("settings") == settings
    client.call(
        "session.updateTitle", {"workspaceId": ws, "agentSessionId": sid, "title": "renamed"}
    )
    assert engine.wait_for(lambda: (engine.session(sid) or {}).get("title") == "renamed", 10)
    held = engine.session(sid) or {}
    assert held.get("settings") == settings, str(held)[:200]
    assert not held.get("settingsOmitted")
