"""The Engine after `fork.resolve`: a mutation whose durable operation was
abandoned is a confirmed failure (the boundary is free), and the next click forks anew."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from client.engine.lifecycle import Engine
from client.engine.values import MutationStatus
from tests.client.conftest import source
from tests.client.fakeclock import FakeClock
from tests.client.test_client_engine import settle
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


def test_abandoned_operation_settles_the_mutation_failed_and_a_new_click_forks(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    engine.fork(sid, turns[0])
    unknown = settle(engine, clock, sid, turns[0])
    assert unknown.status is MutationStatus.UNKNOWN and unknown.operation_id
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    result = client.call(
        "fork.resolve",
        {
            "workspaceId": ws,
            "operationId": unknown.operation_id,
            "requestId": str(uuid.uuid4()),
            "action": "abandon",
        },
    )
    assert result["operation"]["status"] == "abandoned"
    engine.fork(sid, turns[0])  # the retry reuses the identity and reads `abandoned`
    failed = settle(engine, clock, sid, turns[0])
    assert failed.status is MutationStatus.FAILED, failed
    assert failed.operation_id == unknown.operation_id
    engine.fork(sid, turns[0])  # after a confirmed failure: new identities, a real fork
    done = settle(engine, clock, sid, turns[0])
    assert done.status is MutationStatus.SUCCEEDED, done
    assert done.operation_id != unknown.operation_id
