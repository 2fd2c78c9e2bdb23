"""A Turn's end heard by a Session actor that did not start it (no `TurnState` for it: the
actor that ran it is gone), through the in-process daemon and its real store: the actor
rebuilds the Turn's state from the store. The Turn sends events, so the provider has it: its
settlement never marks it host-only, even while the store holds no provider turn id for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import agenthost.daemon as daemon_module
from actors.messages import DriverEvent
from agenthost.daemon import Daemon
from domain.turn_events import TurnCompleted
from tests.support.daemon import WS, create_session, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def test_a_turn_ended_by_the_provider_to_an_actor_that_did_not_start_it_is_not_host_only(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    store = daemon.store
    assert store is not None
    sid = create_session(c, title="rebuilt")["agentSessionId"]
    # An active, unbound Turn nothing in this process tracks (its claim written, its actor
    # gone before the provider named the turn).
    turn, created = store.turns.claim_submit(WS, sid, "req-rebuilt", "hello")
    assert created and turn.phase == "active" and turn.root_provider_turn_id is None
    # Its end, naming no provider turn (what the actor learns is only that the provider ran it).
    daemon_module.route(
        daemon.routes,
        daemon.host,
        WS,
        sid,
        DriverEvent(TurnCompleted(turn.turn_id, "", "failed", "the provider gave up")),
    )

    def settled() -> bool:
        return store.turns.get_turn(WS, sid, turn.turn_id).phase == "settled"

    wait_for(settled, 30)
    stored = store.turns.get_turn(WS, sid, turn.turn_id)
    assert stored.outcome == "failed", stored
    assert not stored.host_only, stored
