"""A start with more `provider_accepted` leftovers than it commits before its ready line: the
daemon serves at once, commits the rest on a thread after ready, and a `fork.get` of one not
yet committed commits it there and then (the restart rule), so every leftover ends committed
with its child readable. The real `Daemon` in this process (to bound the commits before ready
and read its report), its real store and sockets, a real ZeroMQ client."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agenthost.config import load_config
from agenthost.daemon import Daemon
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store
from transport.client import Client

pytestmark = pytest.mark.timeout(60)

WS = "ws-deferred-recovery"


def _leftovers(home: Path, n: int) -> list[str]:
    """`n` Sessions, each with one settled Turn and a fork left at `provider_accepted`."""
    store = Store.open(home / "store.sqlite3")
    ops = []
    try:
        for i in range(n):
            sid = str(uuid.uuid4())
            store.sessions.create_session(
                WS,
                session_id=sid,
                provider="tutti-agent",
                title=f"source {i}",
                cwd=str(home),
                settings={},
                provider_session_id=f"thread-{i}",
                runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.1.0"},
            )
            turn, _ = store.turns.claim_submit(WS, sid, f"req-{i}", "hello")
            store.turns.bind_provider_turn(WS, sid, turn.turn_id, f"pturn-{i}")
            store.turns.settle_turn(WS, sid, turn.turn_id, outcome="completed")
            op, _ = store.fork_prepare.prepare_fork(
                WS,
                ForkPrepareRequest(
                    source_session_id=sid,
                    request_id=f"fork-{i}",
                    target_session_id=str(uuid.uuid4()),
                    turn_id=turn.turn_id,
                    driver_kind="tutti-agent",
                    driver_version="0.1.0",
                    binding_mode="host_copy",
                    runtime_identity={"cwd": str(home), "settings": {}, "runtime_context": {}},
                ),
            )
            store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
            store.fork_transitions.mark_fork_provider_accepted(
                WS,
                op.operation_id,
                ProviderForkEvidence(
                    child_provider_session_id=f"child-{i}",
                    provider_turn_ids=(f"pturn-{i}",),
                    binding_mode="host_copy",
                    receipt={"test": True},
                ),
            )
            ops.append(op.operation_id)
    finally:
        store.close()
    return ops


def test_leftover_commits_past_the_bound_are_made_after_ready(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    ops = _leftovers(home, 12)
    workdir = tmp_path / "work"
    workdir.mkdir()
    daemon = Daemon(load_config(home), default_cwd=workdir, commits_before_ready=3)
    try:
        daemon.start()
        assert daemon.recovery is not None
        assert daemon.recovery.committed == 3
        assert [op.operation_id for op in daemon.recovery.deferred] == ops[3:]
        client = Client(daemon.api_endpoint, timeout=30)
        try:
            # Asked for before the thread may have reached it: answered committed all the same.
            status, result = client.call_raw(
                "fork.get", {"workspaceId": WS, "operationId": ops[-1]}
            )
            assert status == 200 and result["operation"]["status"] == "committed", result
            assert daemon.deferred_commits is not None and daemon.deferred_commits.wait(30)
            for op_id in ops:
                status, result = client.call_raw(
                    "fork.get", {"workspaceId": WS, "operationId": op_id}
                )
                assert status == 200 and result["operation"]["status"] == "committed", result
                child = result["operation"]["session"]["agentSessionId"]
                status, got = client.call_raw(
                    "session.get", {"workspaceId": WS, "agentSessionId": child}
                )
                assert status == 200, got
        finally:
            client.close()
    finally:
        daemon.close()
