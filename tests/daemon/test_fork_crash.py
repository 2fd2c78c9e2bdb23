"""Crash tests with failpoints: SIGKILL the daemon at each `host.fork.*` point and a
worker at each `worker.*` point; after restart the operation ends as the contract says, with at
most one provider child (counted in the provider home) and a child Session iff committed."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.reliability.reliability_harness import fork_params
from tests.support.daemon import WS, DaemonProcess, run_turn, timeline
from tests.support.homes import child_rollouts, runtime_home
from transport.client import ApiError

pytestmark = pytest.mark.timeout(180)

# point → (operation status after recovery, provider children in the source home)
HOST_POINTS = {
    "host.fork.after_prepare": ("failed", 0),
    "host.fork.after_dispatching": ("unknown", 0),
    "host.fork.after_provider_result": ("unknown", 1),
    "host.fork.before_commit": ("committed", 1),
    "host.fork.after_commit": ("committed", 1),
}
WORKER_POINTS = {
    "worker.fork.before_provider_call": ("unknown", 0),
    "worker.fork.after_provider_call": ("unknown", 1),
    "worker.bind.before_copy": ("unknown", 1),
    "worker.bind.after_copy": ("unknown", 1),
}


def _check_end_state(
    d: DaemonProcess, sid: str, turn_id: str, rid: str, target: str, status: str, children: int
) -> None:
    c = d.client()
    # The same identity replays to the durable operation (the Engine's retry).
    _, op = fork(c, sid, turn_id, request_id=rid, target=target)
    op = until_terminal(c, op)
    assert op["status"] == status, op
    assert len(child_rollouts(runtime_home(d.home, WS, sid))) == children
    exists = True
    try:
        c.call("session.get", {"workspaceId": WS, "agentSessionId": target})
    except ApiError as err:
        assert err.status == 404
        exists = False
    assert exists == (status == "committed")
    if status == "committed":
        assert len(timeline(c, target)) == 2
        assert op["lineage"]["sourceTurnId"] == turn_id
    # The fence is released: the source takes a turn again.
    assert run_turn(c, sid, "after the crash")["outcome"] == "completed"
    if status == "unknown":
        # Never redispatched: a new identity on the boundary gets the unknown operation back.
        _, again = fork(c, sid, turn_id)
        assert again["operationId"] == op["operationId"]
        assert len(child_rollouts(runtime_home(d.home, WS, sid))) == children


@pytest.mark.parametrize("point", sorted(HOST_POINTS))
def test_daemon_killed_at_host_failpoint_recovers_per_contract(tmp_path: Path, point: str) -> None:
    status, children = HOST_POINTS[point]
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client(timeout=10)
    sid, turns = three_turn_source(c)
    c.call("debug.failpoints", {"points": {point: "once:kill"}})
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    # The reply never comes: the failpoint SIGKILLs the daemon.
    c.submit("fork.create", fork_params(sid, turns[1]["turnId"], request_id=rid, target=target))
    assert d.wait_exit(30) == -signal.SIGKILL
    d.kill()
    d2 = DaemonProcess(home).start()
    try:
        _check_end_state(d2, sid, turns[1]["turnId"], rid, target, status, children)
    finally:
        d2.stop()


@pytest.mark.parametrize("point", sorted(WORKER_POINTS))
def test_worker_killed_at_worker_failpoint_ends_unknown_never_redispatched(
    tmp_path: Path, point: str
) -> None:
    status, children = WORKER_POINTS[point]
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        before = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
        c.call("debug.failpoints", {"points": {point: "once:kill"}})
        rid, target = str(uuid.uuid4()), str(uuid.uuid4())
        _, op = fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)
        op = until_terminal(c, op)
        assert op["status"] == status, op
        after = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
        assert after["pid"] != before["pid"] or after["restarts"] > before["restarts"]
        _check_end_state(d, sid, turns[1]["turnId"], rid, target, status, children)
    finally:
        d.stop()
