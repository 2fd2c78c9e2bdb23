"""A fork's child is projected once: the `fork.create` reply's operation, the commit's
`fork.operation` and the child's own `session.upserted`, and the ACK's reply each carry the
same wire map of it (`agenthost.projection.Children`: the child is one `Session` object from
the commit on, through the store's `ProjectionCache`), equal to a fresh projection of the
child as the store holds it (docs/design/store.md, "A fork's reply and events carry one
projection of its child")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost import projection
from agenthost.daemon import Daemon
from storage.models import ForkOperationChanged, Session
from tests.support.carried import Heard, Sink, read_counting_publisher
from tests.support.daemon import WS, create_session, fork_params, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_forks_child_is_projected_once_for_its_replies_and_events(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    daemon, c = running
    store = daemon.store
    assert store is not None
    sid = create_session(c, title="projected once")["agentSessionId"]
    turn_id = run_turn(c, sid, "one")["turnId"]
    if warm:
        first = c.call("fork.create", fork_params(WS, sid, turn_id))["operation"]
        c.call("fork.acknowledge", {"workspaceId": WS, "operationId": first["operationId"]})
    # Every projection of a Session, by id (the daemon's own publisher has no subscriber here,
    # so it projects nothing: the events are this test's publisher's).
    projected: list[str] = []
    real = projection.session

    def counted(value: Session, catalog: Any) -> Any:
        projected.append(value.session_id)
        return real(value, catalog)

    monkeypatch.setattr(projection, "session", counted)
    heard = Heard(store)
    try:
        created = c.call("fork.create", fork_params(WS, sid, turn_id))["operation"]
        assert created["status"] == "committed", created
        child = str(created["targetAgentSessionId"])

        def committed() -> bool:
            return any(
                isinstance(o, ForkOperationChanged)
                and o.row is not None
                and o.row.status == "committed"
                for o in heard.changes
            )

        wait_for(committed, 10)
        changes = heard.take()
    finally:
        heard.close()
    sink = Sink()
    publisher, reads = read_counting_publisher(daemon, sink, lambda change: None)
    publisher._publish(changes)
    acked = c.call("fork.acknowledge", {"workspaceId": WS, "operationId": created["operationId"]})[
        "operation"
    ]
    # The reply, the two events and the ACK's reply: one projection of the child.
    assert projected.count(child) == 1, projected
    events = {
        e["type"]: e
        for e in sink.events
        if e["type"] != "session.upserted" or e["session"]["agentSessionId"] == child
    }
    shown = [
        created["session"],
        events["fork.operation"]["operation"]["session"],
        events["session.upserted"]["session"],
        acked["session"],
    ]
    # Each the child as the store holds it, projected afresh.
    fresh = real(store.sessions.get_session(WS, child), daemon.catalog)
    assert all(s == fresh for s in shown), shown
    assert created == acked == events["fork.operation"]["operation"]
