"""Full-Session fork: `point: {type: "latestSettled"}` through a real daemon and
tutti-agent — resolved to the newest settled Turn at prepare, frozen on the operation, and a
replay of the same request after new Turns returns the original boundary."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.daemon.test_fork_saga import three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline
from tests.support.homes import child_rollouts, runtime_home
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(180)


def fork_latest(
    c: Client, sid: str, *, request_id: str | None = None, target: str | None = None
) -> dict[str, Any]:
    status, body = c.call_raw(
        "fork.create",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": request_id or str(uuid.uuid4()),
            "targetAgentSessionId": target or str(uuid.uuid4()),
            "point": {"type": "latestSettled"},
        },
    )
    if status >= 400:
        raise ApiError.from_reply(status, body)
    return until_terminal(c, body["operation"])


def assert_full_session_fork(c: Client, sid: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Fork the whole Session, check the child and the frozen boundary, then prove a replay
    after a new source Turn returns the same original boundary."""
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert session["lifecycleCapabilities"]["forkFullSession"] is True
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    op = fork_latest(c, sid, request_id=rid, target=target)
    assert op["status"] == "committed", op
    assert op["point"] == {"type": "latestSettled", "turnId": turns[-1]["turnId"]}
    assert op["lineage"]["sourceTurnId"] == turns[-1]["turnId"]
    child = timeline(c, target)
    assert len(child) == len(turns)
    assert op["lineage"]["targetTurnId"] == child[-1]["turnId"]
    # New Turns on the source, then the same request again: the original boundary.
    newer = run_turn(c, sid, "after the full fork")
    assert newer["outcome"] == "completed"
    again = fork_latest(c, sid, request_id=rid, target=target)
    assert again["operationId"] == op["operationId"]
    assert again["point"]["turnId"] == turns[-1]["turnId"]
    assert len(timeline(c, target)) == len(turns)
    # A new request forks the Session as it stands now (its own boundary).
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    later = fork_latest(c, sid)
    assert later["status"] == "committed", later
    assert later["point"]["turnId"] == newer["turnId"]
    assert len(timeline(c, later["targetAgentSessionId"])) == len(turns) + 1
    return op


def test_latest_settled_fork_commits_and_replays_original_boundary(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = assert_full_session_fork(c, sid, turns)
    assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == 2
    # The child runs a turn of its own.
    assert run_turn(c, op["targetAgentSessionId"], "child turn")["outcome"] == "completed"


def test_latest_settled_without_turns_and_bad_points_are_typed(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    with pytest.raises(ApiError) as err:
        fork_latest(c, sid)
    assert err.value.status == 409
    assert err.value.params["forkBoundaryReason"] == "turn_not_found"
    for point in ({"type": "latestSettled", "turnId": "x"}, {"type": "sideways"}):
        with pytest.raises(ApiError) as err:
            c.call(
                "fork.create",
                {
                    "workspaceId": WS,
                    "agentSessionId": sid,
                    "requestId": str(uuid.uuid4()),
                    "targetAgentSessionId": str(uuid.uuid4()),
                    "point": point,
                },
            )
        assert err.value.status == 400
