"""Fork operation changes that carry the row their write left (the saga's steps', the
commit's): the events thread projects it without reading the operation back, and never
publishes it when something newer of that operation may already have been shown — an older
write's event delivered after a newer one's, after a read-back, or after a change nobody wanted
— nor in a batch where a change of the operation carries no row (docs/design/store.md, "Change
events that carry their row"; the fork operation's paragraph). The ACK changes nothing the
operation's projection shows and emits no change at all ("The ACK announces nothing"); it is
still the newer write a read-back shows here (`acked`, noted on the sink's events)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost import projection
from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher
from storage.models import ChangeEvent, ForkOperation, ForkOperationChanged, SessionChanged
from tests.support.carried import Heard, Sink, read_counting_publisher
from tests.support.daemon import WS, create_session, fork_params, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(90)

_PROJECTED = projection.operation
"""The operation's projection as the daemon builds it (the fixture below notes the ACK)."""


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _publisher(daemon: Daemon, sink: Sink) -> tuple[EventPublisher, list[str]]:
    """A publisher of its own on the daemon's store, counting its operation read-backs; the
    sink's events note whether the operation each shows was ACKed (not on the wire)."""
    return read_counting_publisher(
        daemon,
        sink,
        lambda change: change.operation_id if isinstance(change, ForkOperationChanged) else None,
    )


@pytest.fixture(autouse=True)
def _acked_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    """`projection.operation` as the publisher calls it, with `acked` added to its map."""
    real = projection.operation

    def noted(value: ForkOperation, catalog: Any) -> Any:
        return {**real(value, catalog), "acked": value.client_observed_at_ms is not None}

    monkeypatch.setattr(projection, "operation", noted)


def _ops(changes: list[ChangeEvent]) -> list[ForkOperationChanged]:
    return [c for c in changes if isinstance(c, ForkOperationChanged)]


def _statuses(sink: Sink) -> list[tuple[str, bool]]:
    """Each operation event's status and whether it shows the ACK."""
    return [
        (str(e["operation"]["status"]), bool(e["operation"]["acked"]))
        for e in sink.events
        if e["type"] == "fork.operation"
    ]


def _fork(
    daemon: Daemon, c: Client, *, warm: bool = False
) -> tuple[str, list[ChangeEvent], list[ChangeEvent]]:
    """A fork, committed then ACKed (`warm`: a second fork of its source, on the runtime the
    first left: a prepare written at `dispatching`): its operation id, the changes delivered
    from its prepare up to and with its commit, and those delivered from the ACK up to a
    rename of the source written after it (the rename's alone: the ACK emits none)."""
    store = daemon.store
    assert store is not None
    sid = create_session(c, title="carried ops")["agentSessionId"]
    turn_id = run_turn(c, sid, "one")["turnId"]
    if warm:
        first = c.call("fork.create", fork_params(WS, sid, turn_id))["operation"]
        c.call("fork.acknowledge", {"workspaceId": WS, "operationId": first["operationId"]})
    heard = Heard(store)
    try:
        body = c.call("fork.create", fork_params(WS, sid, turn_id))
        op_id = str(body["operation"]["operationId"])
        assert body["operation"]["status"] == "committed", body
        wait_for(lambda: _committed(heard.changes))
        committed = heard.take()
        c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op_id})
        store.sessions.update_title(WS, sid, "after")
        wait_for(lambda: any(isinstance(x, SessionChanged) for x in heard.changes))
        acked = heard.take()
    finally:
        heard.close()
    return op_id, committed, acked


def test_the_commit_carries_the_operation_it_wrote_and_the_ack_announces_nothing(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    store = daemon.store
    assert store is not None
    op_id, committed, acked = _fork(daemon, c)
    commit = _committed(committed)
    assert len(commit) == 1 and commit[0].row is not None
    assert commit[0].row.status == "committed" and commit[0].row.client_observed_at_ms is None
    # The ACK's write (the time, the barrier released) is no change of what a subscriber
    # hears: it emits none, and the operation as the store holds it now projects exactly as
    # the commit's carried row, which is that row with the time set.
    assert _ops(acked) == [], acked
    now = store.fork_queries.get_fork_operation(WS, op_id)
    assert now.client_observed_at_ms is not None
    assert commit[0].row == type(now)(**{**_fields(now), "client_observed_at_ms": None})
    assert _PROJECTED(now, daemon.catalog) == _PROJECTED(commit[0].row, daemon.catalog)
    assert commit[0].seq <= store.db.write_seq
    # Not part of the change's identity.
    assert commit[0] == ForkOperationChanged(WS, op_id)
    assert hash(commit[0]) == hash(ForkOperationChanged(WS, op_id))


def _committed(changes: list[ChangeEvent]) -> list[ForkOperationChanged]:
    """The commit's change (the one whose row is `committed`)."""
    return [o for o in _ops(changes) if o.row is not None and o.row.status == "committed"]


def _fields(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def _accepted(changes: list[ChangeEvent]) -> list[ForkOperationChanged]:
    """`provider_accepted`'s change: the write right before the commit's, its row older."""
    return [o for o in _ops(changes) if o.row is not None and o.row.status == "provider_accepted"]


def test_the_events_thread_projects_a_carried_operation_without_a_read(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    _, committed, _ = _fork(daemon, c)
    accepted, commit = _accepted(committed), _committed(committed)
    assert len(accepted) == 1 and len(commit) == 1
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(list(accepted))
    publisher._publish(list(commit))
    # Each event is its write's state (the store already holds the ACK when both are built),
    # neither read back.
    assert _statuses(sink) == [("accepted", False), ("committed", False)]
    assert reads == [] and publisher.carried_ops == 2


def test_an_older_operation_row_delivered_after_a_newer_one_is_read_back(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    _, committed, _ = _fork(daemon, c)
    accepted, commit = _accepted(committed), _committed(committed)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(list(commit))
    publisher._publish(list(accepted))  # delivered late: read back, the current state
    assert _statuses(sink) == [("committed", False), ("committed", True)] and len(reads) == 1

    # Both in one batch, the older first: one event, the newer row, no read.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(list(accepted) + list(commit))
    assert _statuses(sink) == [("committed", False)] and reads == []


def test_an_operation_row_after_a_read_back_or_a_change_nobody_wanted_is_read_back(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    op_id, committed, _ = _fork(daemon, c)
    accepted, commit = _accepted(committed), _committed(committed)
    # A change of the operation without a row in the batch: read back (it may be the newer).
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([ForkOperationChanged(WS, op_id), *commit])
    assert _statuses(sink) == [("committed", True)] and len(reads) == 1
    # After that read-back (which saw the ACK), the commit's row is older than what was shown.
    publisher._publish(list(commit))
    assert _statuses(sink)[-1] == ("committed", True) and len(reads) == 2

    # The commit went unpublished (nobody listened); then the older accepted row arrives.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    sink.wanted = False
    publisher.offer_many(list(commit))
    assert publisher.skipped == 1 and publisher.queue.empty()
    sink.wanted = True
    publisher._publish(list(accepted))
    assert _statuses(sink) == [("committed", True)] and len(reads) == 1


@pytest.mark.parametrize("warm", [False, True], ids=["durable-prepare", "lazy-prepare"])
def test_every_change_of_a_fork_carries_its_operation_so_none_is_read_back(
    running: tuple[Daemon, Client], warm: bool
) -> None:
    """The prepare's, dispatching's, `provider_accepted`'s and the commit's changes each carry
    a row (a warm fork's prepare is written at `dispatching`: one change for both), so the
    saga's burst — one batch when the events thread lags — is published from the newest, with
    no read; without a row on any one of them the whole batch is read back."""
    daemon, c = running
    store = daemon.store
    assert store is not None
    op_id, committed, _ = _fork(daemon, c, warm=warm)
    ops = _ops(committed)
    assert ops and all(o.row is not None for o in ops), ops
    rows = [o.row for o in ops if o.row is not None]
    statuses = ["prepared", "dispatching", "provider_accepted", "committed"]
    assert [r.status.value for r in rows] == (statuses[1:] if warm else statuses)
    # Each its own write's seq, in commit order.
    assert ops[0].seq > 0 and all(a.seq < b.seq for a, b in itertools.pairwise(ops))
    # dispatching's and accepted's rows as a read would have given them: each is the commit's
    # row with the columns the later writes set taken back.
    assert rows[-2].dispatched_at_ms == rows[-3].dispatched_at_ms == rows[-1].dispatched_at_ms
    assert rows[-2].target_provider_session_id == rows[-1].target_provider_session_id
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(committed)
    assert _statuses(sink) == [("committed", False)] and reads == []
    # A prepare's row alone, older than what the store holds, is read back.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(ops[-1:])
    publisher._publish([ops[0]])
    assert _statuses(sink) == [("committed", False), ("committed", True)] and len(reads) == 1
