"""Fork deadlines, through the real daemon, worker and tutti-agent app-server: the host's fork
deadline is longer than the worker's whole budget, so a fork slowed (by `sleep:` failpoints in
the worker's fork and bind steps) past the worker's provider-call limit
still ends `committed`; a provider fork call that exceeds the worker's own limit ends
`unknown` with the worker's reason, exactly once, never redispatched."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, fork_params, run_turn, wait_for
from tests.support.invariants import assert_invariants
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def _daemon(tmp_path: Path, *, failpoints: str, env: dict[str, str] | None = None) -> DaemonProcess:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    # The worker's provider-call limit, which was also the host's whole fork deadline.
    (home / "agenthost.toml").write_text("[daemon]\nfork_provider_call_seconds = 2\n")
    return DaemonProcess(home, failpoints=failpoints, env=env).start()


def _fork(c: Client, sid: str, turn_id: str) -> dict[str, Any]:
    op = c.call(
        "fork.create",
        fork_params(WS, sid, turn_id),
        timeout=30,
    )["operation"]

    def poll() -> dict[str, Any] | None:
        got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
        return got["operation"] if got["operation"]["status"] != "accepted" else None

    return dict(op if op["status"] != "accepted" else wait_for(poll, 90, interval=0.2))


def test_fork_slowed_past_the_provider_call_limit_commits(tmp_path: Path) -> None:
    d = _daemon(
        tmp_path,
        failpoints="worker.fork.before_provider_call=sleep:2500;worker.bind.before_copy=sleep:2500",
    )
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        started = time.monotonic()
        op = _fork(c, sid, boundary["turnId"])
        assert time.monotonic() - started > 4  # really slower than the worker's provider-call limit
        assert op["status"] == "committed", op
    finally:
        d.stop()
    assert_invariants(d.home)


def test_provider_call_past_the_workers_limit_is_unknown_once(tmp_path: Path) -> None:
    # The app-server's own thread/fork is slow: the worker's limit (2 s) fires, after the call.
    d = _daemon(
        tmp_path,
        failpoints="",
        env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=sleep:4000"},
    )
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        op = _fork(c, sid, boundary["turnId"])
        assert op["status"] == "unknown", op
        assert "no answer in 2.0 s" in (op["error"] or ""), op
        time.sleep(3)  # the provider finishes its slow fork; nothing redispatches it
        again = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
        assert again["operation"]["status"] == "unknown"
    finally:
        d.stop()
    # One dispatched operation, at most one provider child: never redispatched.
    report = assert_invariants(d.home)
    assert report.operations == {"unknown": 1}
    assert report.provider_children <= 1


def test_a_fork_unknown_by_the_workers_limit_leaves_no_child_after_its_abandon(
    tmp_path: Path,
) -> None:
    # The app-server's own thread/fork is slow: the worker's limit (2 s) fires first. A person
    # abandons the `unknown` operation at once (no child on disk yet: quarantined nothing);
    # the provider's fork must not write its child afterwards, owned by no operation.
    d = _daemon(
        tmp_path,
        failpoints="",
        env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=sleep:4000"},
    )
    _abandon_at_once_then_go_on(d, resolve_timeout=60, slow_fork_s=4)
    # No provider child outside quarantine: the abandoned operation owns none.
    report = assert_invariants(d.home)
    assert report.operations == {"abandoned": 1}


def test_a_fork_unknown_by_the_hosts_deadline_leaves_no_child_after_its_abandon(
    tmp_path: Path,
) -> None:
    # The host gives up first (`host.fork.deadline`: 1 s) while the worker's limit (30 s) still
    # lets the app-server's slow thread/fork (4 s) go on. A person abandons the `unknown`
    # operation at once: the abandon must wait for the worker's fork, so the child it writes
    # is found and quarantined, never left owned by no operation.
    home = tmp_path / "home"
    home.mkdir(parents=True)
    (home / "agenthost.toml").write_text("[daemon]\nfork_provider_call_seconds = 30\n")
    d = DaemonProcess(
        home,
        failpoints="host.fork.deadline=error",
        env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=sleep:4000"},
    ).start()
    _abandon_at_once_then_go_on(d, resolve_timeout=90, slow_fork_s=5)
    report = assert_invariants(d.home)
    assert report.operations == {"abandoned": 1}


def _abandon_at_once_then_go_on(
    d: DaemonProcess, *, resolve_timeout: float, slow_fork_s: float
) -> None:
    """A fork of a new Session's first Turn ends `unknown`; a person abandons it at once
    (`abandoned`); past the provider's slow fork the Session runs a Turn; the daemon stops."""
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        op = _fork(c, sid, boundary["turnId"])
        assert op["status"] == "unknown", op
        answer = c.call(
            "fork.resolve",
            {
                "workspaceId": WS,
                "operationId": op["operationId"],
                "requestId": str(uuid.uuid4()),
                "action": "abandon",
            },
            timeout=resolve_timeout,
        )
        assert answer["operation"]["status"] == "abandoned", answer
        time.sleep(slow_fork_s)  # past the provider's slow fork
        run_turn(c, sid, "after the abandon")  # the Session goes on
    finally:
        d.stop()
