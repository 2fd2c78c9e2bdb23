"""The Engine keys the fork barrier on the boundary (source + Turn), not on the point kind: a
Turn Fork on the Turn its live full-Session fork resolved to is that fork's click, and a
full-Session click the daemon answers with the Turn's operation follows that operation."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from client.engine.lifecycle import Engine
from client.engine.values import LATEST_SETTLED, MutationStatus
from tests.client.conftest import source
from tests.client.fakeclock import FakeClock
from tests.client.test_client_engine import settle
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


def test_turn_fork_on_the_boundary_of_an_unknown_full_session_fork_resends_its_identity(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws, turns=2)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    engine.fork_latest(sid)
    unknown = settle(engine, clock, sid, LATEST_SETTLED)
    assert unknown.status is MutationStatus.UNKNOWN and unknown.boundary == turns[-1]
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    click = engine.fork(sid, turns[-1])
    assert click.request_id == unknown.request_id and click.create_attempts == 2
    assert engine.mutation(sid, turns[-1]) is None  # no second record, no new identity
    again = settle(engine, clock, sid, LATEST_SETTLED)
    assert again.status is MutationStatus.UNKNOWN
    assert again.operation_id == unknown.operation_id


def test_full_session_click_answered_with_the_turns_operation_follows_it(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws, turns=2)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    engine.fork(sid, turns[-1])
    through = settle(engine, clock, sid, turns[-1])
    assert through.status is MutationStatus.UNKNOWN and through.operation_id
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    # The Engine cannot know the newest settled Turn; the daemon's barrier answers the new
    # identity with the original operation, and the record takes that operation's identity.
    engine.fork_latest(sid)
    full = settle(engine, clock, sid, LATEST_SETTLED)
    assert full.error != "mismatched_operation", full
    assert full.status is MutationStatus.UNKNOWN
    assert full.operation_id == through.operation_id
    assert full.request_id == through.request_id
    assert full.boundary == turns[-1]
