"""A fork's Session events at its commit: the child's change carries the row the commit's
INSERT left (version 0, its lineage), so the events thread announces the child without reading
it back; the source's row is written by neither the prepare nor the commit, so no change of it
is emitted and nothing of it is read back (docs/design/store.md, "Change events that carry their
row"; "A fork operation's changes carry their operation"; "A fork announces no change of its
source")."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost import projection
from agenthost import publisher as publisher_module
from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher
from storage.models import ChangeEvent, ForkOperationChanged, SessionChanged
from tests.support.carried import Heard, Sink, read_counting_publisher, session_read
from tests.support.daemon import WS, create_session, fork_params, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _publisher(daemon: Daemon, sink: Sink) -> tuple[EventPublisher, list[str]]:
    """A publisher of its own on the daemon's store, noting each Session it reads back."""
    return read_counting_publisher(daemon, sink, session_read)


def _fork(daemon: Daemon, c: Client, *, warm: bool) -> tuple[str, str, list[ChangeEvent]]:
    """A fork (`warm`: a second fork of its source, a lazy prepare): its source's and child's
    ids, and the changes delivered from its prepare up to and with its commit."""
    store = daemon.store
    assert store is not None
    sid = create_session(c, title="carried fork sessions")["agentSessionId"]
    turn_id = run_turn(c, sid, "one")["turnId"]
    heard = Heard(store)
    try:
        last = run_turn(c, sid, "two")["turnId"]
        # A read sees the settlement once it is committed, a subscriber a moment later (the
        # store delivers after the COMMIT): wait for its delivery, so none of the source's
        # Turn writes is taken for the fork's.
        wait_for(
            lambda: any(
                isinstance(s, SessionChanged) and s.touch is not None and s.touch.settled == last
                for s in heard.changes
            ),
            10,
        )
        if warm:
            first = c.call("fork.create", fork_params(WS, sid, turn_id))["operation"]
            c.call("fork.acknowledge", {"workspaceId": WS, "operationId": first["operationId"]})
            # The first fork's answer leaves once its commit is durable, its changes reach a
            # subscriber a moment later: wait for them, so none is taken for the second's.
            wait_for(lambda: _committed_at(heard.changes, first["operationId"]) is not None, 10)
        heard.take()
        body = c.call("fork.create", fork_params(WS, sid, turn_id))
        assert body["operation"]["status"] == "committed", body
        child = str(body["operation"]["targetAgentSessionId"])
        op_id = str(body["operation"]["operationId"])
        wait_for(lambda: _committed_at(heard.changes, op_id) is not None, 10)
        changes = heard.take()
    finally:
        heard.close()
    return sid, child, changes


def _committed_at(changes: list[ChangeEvent], op_id: str) -> int | None:
    """The index of operation `op_id`'s commit among `changes` (None: not heard yet)."""
    return next(
        (
            i
            for i, o in enumerate(changes)
            if isinstance(o, ForkOperationChanged)
            and o.operation_id == op_id
            and o.row is not None
            and o.row.status == "committed"
        ),
        None,
    )


@pytest.mark.parametrize("warm", [False, True], ids=["durable-prepare", "lazy-prepare"])
def test_the_commit_carries_the_child_row_a_read_gives(
    running: tuple[Daemon, Client], warm: bool
) -> None:
    """The child's change carries exactly the row a read gives after the commit, `version`,
    lineage and active Turn included, at the commit's seq; the source has none."""
    daemon, c = running
    store = daemon.store
    assert store is not None
    source, child, changes = _fork(daemon, c, warm=warm)
    commit = next(
        o
        for o in changes
        if isinstance(o, ForkOperationChanged) and o.row is not None and o.row.status == "committed"
    )
    (child_change,) = [
        s for s in changes if isinstance(s, SessionChanged) and s.session_id == child
    ]
    assert child_change.row is not None
    read = store.sessions.get_session(WS, child)
    assert child_change.row == read and child_change.row.version == read.version == 0
    assert child_change.row.lineage is not None and child_change.row.active_turn_id is None
    assert child_change.seq == commit.seq
    assert not [s for s in changes if isinstance(s, SessionChanged) and s.session_id == source]


@pytest.mark.parametrize("warm", [False, True], ids=["durable-prepare", "lazy-prepare"])
def test_a_forks_child_is_announced_without_a_read(
    running: tuple[Daemon, Client], warm: bool
) -> None:
    """The burst (the saga's steps, the commit) published as one batch, or the commit's changes
    alone: the child's `session.upserted` is the store's child, built with no read of it; the
    source, whose row no step of the fork writes, is neither announced nor read back."""
    daemon, c = running
    store = daemon.store
    assert store is not None
    source, child, changes = _fork(daemon, c, warm=warm)
    want = projection.session(store.sessions.get_session(WS, child), daemon.catalog)
    at = next(
        i
        for i, o in enumerate(changes)
        if isinstance(o, ForkOperationChanged) and o.row is not None and o.row.status == "committed"
    )
    # The commit's two changes: its operation's and the child's.
    assert [type(o) for o in changes[at:]] == [ForkOperationChanged, SessionChanged]
    for batch in (changes, changes[at:]):
        sink = Sink()
        publisher, reads = _publisher(daemon, sink)
        publisher._publish(list(batch))
        announced = [
            e["session"]
            for e in sink.events
            if e["type"] == "session.upserted" and e["session"]["agentSessionId"] == child
        ]
        assert announced == [want]
        assert reads == [], reads
        assert publisher.carried == 1
        assert not [
            e
            for e in sink.events
            if e["type"] == "session.upserted" and e["session"]["agentSessionId"] == source
        ]


def test_the_events_thread_tells_a_changes_type_without_isinstance(
    running: tuple[Daemon, Client],
) -> None:
    """The change types are final: the publishing thread tells them apart by their `type`, so a
    fork's burst costs no `isinstance` call in the publisher's own code (it reads nothing back);
    it cost ~7 a change before."""
    daemon, c = running
    _, _, changes = _fork(daemon, c, warm=False)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    mine = publisher_module.__file__
    calls: list[str] = []

    def profiled(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and arg is isinstance and frame.f_code.co_filename == mine:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profiled)
    try:
        publisher._publish(list(changes))
    finally:
        sys.setprofile(None)
    assert len(reads) == 0 and len(changes) >= 4
    assert calls == [], calls
