"""Daemon logs, through the real `agenthost serve`: an ordinary 4xx (busy,
not found, fenced, bad argument) is not an ERROR with a traceback; `serve -v` logs exactly one
line per request, one per Turn transition and one per fork transition, with the Session,
Turn and operation ids."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, create_session, settle, submit
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


class Counting:
    """A client that counts the requests it sends (each must be one `-v` line)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.count = 0

    def call(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        self.count += 1
        return self.client.call(method, params, **kw)

    def call_raw(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        self.count += 1
        return self.client.call_raw(method, params, **kw)


def provoke_4xx(c: Any, sid: str, busy_sid: str) -> list[int]:
    """A 404, a 409 busy, a 409 fenced, a 400 and a 404 from the routing check."""
    statuses = []
    calls = [
        ("session.get", {"agentSessionId": str(uuid.uuid4())}),
        (
            "turn.submit",
            {
                "agentSessionId": busy_sid,
                "requestId": "r2",
                "input": [{"type": "text", "text": "x"}],
            },
        ),
        ("session.delete", {"agentSessionId": sid}),  # fenced: a fork of it is in flight
        ("session.updateTitle", {"agentSessionId": sid, "title": 5}),
        ("goal.set", {"agentSessionId": str(uuid.uuid4()), "goal": "g"}),
    ]
    for method, params in calls:
        with pytest.raises(ApiError) as err:
            c.call(method, {"workspaceId": WS, **params})
        statuses.append(err.value.status)
    return statuses


def test_ordinary_4xx_are_not_errors_with_tracebacks(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        busy = create_session(c)["agentSessionId"]
        slow = submit(c, busy, "/slow 3000 busy")
        c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:3000"}})
        _, op = fork(c, sid, turns[1]["turnId"])
        assert provoke_4xx(c, sid, busy) == [404, 409, 409, 400, 404]
        assert until_terminal(c, op)["status"] == "committed"
        settle(c, busy, slow["turnId"])
    finally:
        d.stop()
    log = d.tail_log(10**7)
    assert " ERROR " not in log and "Traceback" not in log, log
    assert "agenthost.activity" not in log  # quiet without -v


def test_serve_v_logs_one_line_per_request_turn_and_fork_transition(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home", args=("-v",)).start()
    try:
        c = Counting(d.client())
        sid, turns = three_turn_source(c)  # type: ignore[arg-type]
        _, op = fork(c, sid, turns[1]["turnId"])  # type: ignore[arg-type]
        op = until_terminal(c, op)  # type: ignore[arg-type]
        missing = str(uuid.uuid4())
        with pytest.raises(ApiError):
            c.call("session.get", {"workspaceId": WS, "agentSessionId": missing})
        sent = c.count
    finally:
        d.stop()
    lines = d.tail_log(10**7).splitlines()
    activity = [
        line.split("agenthost.activity: ", 1)[1] for line in lines if "agenthost.activity: " in line
    ]
    requests = [a for a in activity if a.startswith("request ")]
    assert len(requests) == sent
    # Each request line names the method, its ids and the outcome.
    for turn in turns:
        tid = turn["turnId"]
        submits = [
            r for r in requests if r.startswith("request turn.submit ") and f"turn={tid}" in r
        ]
        assert len(submits) == 1 and f"session={sid}" in submits[0] and "-> 202" in submits[0]
        transitions = [a for a in activity if a.startswith("turn ") and f"turn={tid}" in a]
        assert [t.split(" session=")[0] for t in transitions] == [
            "turn active",
            "turn settled completed",
        ]
        assert all(f"session={sid}" in t for t in transitions)
    creates = [r for r in requests if r.startswith("request fork.create ")]
    assert len(creates) == 1 and f"op={op['operationId']}" in creates[0]
    assert re.search(rf"request session.get .*session={missing} -> 404 \S+", "\n".join(requests))
    forks = [a for a in activity if a.startswith("fork ") and f"op={op['operationId']}" in a]
    states = [f.split(" op=")[0] for f in forks]
    assert states[0] == "fork accepted/frozen" and states[-1] == "fork committed/committed"
    assert len(states) == len(set(states))  # one line per transition, never repeated
    assert all(f"session={sid}" in f and f"target={op['targetAgentSessionId']}" in f for f in forks)
