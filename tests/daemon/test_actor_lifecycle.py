"""Session actors start on demand and stop when idle: many stored Sessions do not mean many
threads; and fork.get advances only operations no live saga owns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.config import Config
from agenthost.daemon import Daemon
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from transport.client import Client

pytestmark = pytest.mark.timeout(180)


def test_idle_session_actors_stop_and_threads_return(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nidle_actor_seconds = 0.5\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sids = [create_session(c)["agentSessionId"] for _ in range(30)]
        for sid in sids:
            run_turn(c, sid, "hi")
        status = c.call("host.status")
        assert status["sessionActors"] >= 1
        settled = wait_for(lambda: (s := c.call("host.status"))["sessionActors"] == 0 and s, 20)
        # 30 sessions, no actor threads left for them, nor their store connections.
        assert settled["threads"] < 30
        assert settled["storeConnections"] < 12
        # And they come back on demand.
        assert run_turn(c, sids[0], "again")["outcome"] == "completed"
    finally:
        d.stop()


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    daemon = Daemon(Config(home=tmp_path / "home"))
    daemon.start()
    client = Client(daemon.api_endpoint, timeout=30)
    try:
        yield daemon, client
    finally:
        client.close()
        daemon.close()


def _leftover(daemon: Daemon, client: Client) -> tuple[str, str]:
    """An operation prepared behind the daemon's back: no saga of this process owns it."""
    sid = create_session(client)["agentSessionId"]
    turn = run_turn(client, sid, "one")
    session = client.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert daemon.store is not None
    op, created = daemon.store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id="leftover",
            target_session_id="6d1f2a9e-0000-4000-8000-000000000001",
            turn_id=turn["turnId"],
            driver_kind="tutti-agent",
            driver_version="0.1.0",
            binding_mode="host_copy",
            runtime_identity={"cwd": session["cwd"], "settings": {}, "runtime_context": {}},
        ),
    )
    assert created
    return op.operation_id, turn["rootProviderTurnId"]


def _get(client: Client, op_id: str) -> dict:
    return dict(client.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"])


def test_fork_get_fails_a_leftover_prepared_operation(inproc: tuple[Daemon, Client]) -> None:
    daemon, client = inproc
    op_id, _ = _leftover(daemon, client)
    op = _get(client, op_id)
    assert op["status"] == "failed"


def test_fork_get_marks_a_leftover_dispatching_operation_unknown(
    inproc: tuple[Daemon, Client],
) -> None:
    daemon, client = inproc
    op_id, _ = _leftover(daemon, client)
    assert daemon.store is not None
    daemon.store.fork_transitions.mark_fork_dispatching(WS, op_id)
    assert _get(client, op_id)["status"] == "unknown"
    assert _get(client, op_id)["status"] == "unknown"


def test_fork_get_commits_a_provider_accepted_operation(inproc: tuple[Daemon, Client]) -> None:
    daemon, client = inproc
    op_id, provider_turn = _leftover(daemon, client)
    assert daemon.store is not None
    daemon.store.fork_transitions.mark_fork_dispatching(WS, op_id)
    daemon.store.fork_transitions.mark_fork_provider_accepted(
        WS,
        op_id,
        ProviderForkEvidence(
            child_provider_session_id="019a0000-0000-7000-8000-00000000c41d",
            provider_turn_ids=(provider_turn,),
            binding_mode="host_copy",
            receipt={"files": ["test"]},
        ),
    )
    op = _get(client, op_id)
    assert op["status"] == "committed"
    assert op["session"]["agentSessionId"] == "6d1f2a9e-0000-4000-8000-000000000001"
