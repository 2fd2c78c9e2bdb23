"""Which start failures make a Turn host-only (schema v24), in an in-process daemon (real store
file, real worker and tutti-agent app-server): the worker link's answer to one Turn's
`turn.start` is replaced by the port's own typed failure. "Never left the host"
(`NotDelivered`, what the supervisor's `WorkerUnavailable … not sent` becomes) marks the
failed Turn host-only at its settlement; "sent, no answer" (`DeliveryUnknown`) leaves the fate
unknown: not marked then. The later fork through a completed Turn commits either way, leaving
it out of the provider prefix: the Session's first fork starts its runtime, whose re-bind asks
the worker that ran the Session's other Turns, all ended (so its history is final), and finds
no provider turn for the unknown one: it is marked host-only then."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import apsw
import pytest

from actors.ports import DeliveryUnknown, NotDelivered
from agenthost.daemon import Daemon
from agenthost.workers import SupervisorPort
from domain.worker_messages import TurnStart
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.daemon.test_turn_never_sent import host_only_marks
from tests.support.daemon import create_session, run_turn, timeline
from tests.support.in_process import in_process_daemon
from tests.support.invariants import STORE_LAWS, check_invariants
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _frozen_prefix(home: Path, operation_id: str) -> list[str]:
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        ((ids,),) = conn.execute(
            "SELECT source_provider_turn_ids FROM fork_operations WHERE operation_id = ?",
            (operation_id,),
        ).fetchall()
        return list(json.loads(ids))
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("failure", "host_only"),
    [(NotDelivered("turn.start not sent: worker not ready"), 1), (DeliveryUnknown("lost"), 0)],
    ids=["not-sent", "fate-unknown"],
)
def test_only_a_start_that_never_left_the_host_makes_the_turnhost_only_marks(
    running: tuple[Daemon, Client],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    failure: Exception,
    host_only: int,
) -> None:
    _, c = running
    home = tmp_path / "home"
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "first")
    real_start = SupervisorPort.start_turn

    def failing(self: SupervisorPort, provider: str, request: TurnStart, timeout: float) -> Any:
        monkeypatch.setattr(SupervisorPort, "start_turn", real_start)  # this Turn's only
        out: Future[Any] = Future()
        out.set_exception(failure)
        return out

    monkeypatch.setattr(SupervisorPort, "start_turn", failing)
    lost = run_turn(c, sid, "second")
    assert lost["outcome"] == "failed" and lost["rootProviderTurnId"] is None, lost
    done = run_turn(c, sid, "third")
    assert done["outcome"] == "completed", done
    assert host_only_marks(home, sid) == [0, host_only, 0]  # at its settlement
    _, op = fork(c, sid, done["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    assert host_only_marks(home, sid) == [0, 1, 0]
    bound = [t["rootProviderTurnId"] for t in timeline(c, sid)]
    assert _frozen_prefix(home, op["operationId"]) == [bound[0], bound[2]]
    child = op["targetAgentSessionId"]
    assert host_only_marks(home, child) == [0, 1, 0]
    assert run_turn(c, child, "the child's own")["outcome"] == "completed"
    broken = [v for v in check_invariants(home).violations if v.law in STORE_LAWS]
    assert not broken, broken
