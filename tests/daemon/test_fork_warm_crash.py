"""The crash laws on a *warm* fork (the fork fast path): a fork of a Session whose runtime
its previous fork attested skips `session.start`, the replay read and `runtime.attest`, and its
target directories are made durable during the provider call — and still ends exactly as the
contract table says when the daemon is SIGKILLed at a `host.fork.*` point or the worker at a
`worker.*` point, and a copy damaged after the bind is refused before `provider_accepted`.

The probe that the fork under test took the warm path: `worker.binder.available` is armed
`error` with the point, so a fork that sent `runtime.attest` would end `failed` ("binder
unavailable") instead of the contract's status."""

from __future__ import annotations

import signal
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.reliability.reliability_harness import fork_params
from tests.support.daemon import WS, DaemonProcess, run_turn
from tests.support.homes import child_rollouts, runtime_home
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(180)

BINDER_OFF = {"worker.binder.available": "error"}
# point → (operation status after recovery, new provider children in the source home)
POINTS = {
    # A warm fork's prepare is its dispatching marker (one fsync'd transaction): killed
    # after it, recovery sees `dispatching` and, never re-sending, says `unknown`; no child.
    "host.fork.after_prepare": ("unknown", 0),
    "host.fork.after_dispatching": ("unknown", 0),
    "host.fork.after_provider_result": ("unknown", 1),
    "host.fork.before_commit": ("committed", 1),
    "host.fork.after_commit": ("committed", 1),
    "worker.fork.before_provider_call": ("unknown", 0),
    "worker.fork.after_provider_call": ("unknown", 1),
    "worker.bind.before_copy": ("unknown", 1),
    "worker.bind.after_copy": ("unknown", 1),
}


def _warm_source(c: Client) -> tuple[str, list[dict[str, Any]]]:
    """A source whose runtime one committed (and ACKed) fork has attested."""
    sid, turns = three_turn_source(c)
    _, op = fork(c, sid, turns[0]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    return sid, turns


@pytest.mark.parametrize("point", sorted(POINTS))
def test_a_warm_fork_killed_at_a_failpoint_ends_as_the_contract_says(
    tmp_path: Path, point: str
) -> None:
    status, children = POINTS[point]
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=30)
        sid, turns = _warm_source(c)
        source_home = runtime_home(d.home, WS, sid)
        before = len(child_rollouts(source_home))
        c.call("debug.failpoints", {"points": {**BINDER_OFF, point: "once:kill"}})
        rid, target = str(uuid.uuid4()), str(uuid.uuid4())
        params = fork_params(sid, turns[1]["turnId"], request_id=rid, target=target)
        if point.startswith("host."):
            c.submit("fork.create", params)  # the reply never comes: the daemon dies
            assert d.wait_exit(60) == -signal.SIGKILL
            d.kill()
            d = DaemonProcess(home).start()
            c = d.client(timeout=30)
        else:
            c.call_raw("fork.create", params)
        c.call("debug.failpoints", {"points": {"worker.binder.available": "off"}})
        # The Engine's retry: the same identity returns the durable, recovered operation.
        op = until_terminal(c, c.call("fork.create", params)["operation"])
        assert op["status"] == status, op
        assert len(child_rollouts(source_home)) - before == children
        exists = True
        try:
            c.call("session.get", {"workspaceId": WS, "agentSessionId": target})
        except ApiError as err:
            assert err.status == 404
            exists = False
        assert exists == (status == "committed")
        # The fence is released: the source takes a turn again.
        assert run_turn(c, sid, "after the crash")["outcome"] == "completed"
        if status == "unknown":
            # Never redispatched: a new identity on the boundary gets the same operation.
            _, again = fork(c, sid, turns[1]["turnId"])
            assert again["operationId"] == op["operationId"]
            assert len(child_rollouts(source_home)) - before == children
    finally:
        d.stop()


def test_a_warm_forks_damaged_copy_is_refused_before_provider_accepted(tmp_path: Path) -> None:
    """The readability proof still runs on the warm path, after the directories made ahead:
    a copy cut after the binder made it durable is `unknown`, never accepted or committed."""
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client(timeout=30)
        sid, turns = _warm_source(c)
        c.call("debug.failpoints", {"points": {**BINDER_OFF, "worker.bind.after_copy": "tamper"}})
        op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert op["status"] == "unknown", op
        assert "not readable" in op["error"], op
        assert op["session"] is None and op["lineage"] is None
        conn = sqlite3.connect(f"file:{d.home / 'store.sqlite3'}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute(
                "SELECT accepted_at_ms, target_provider_session_id FROM fork_operations"
                " WHERE operation_id = ?",
                (op["operationId"],),
            ).fetchone()
        finally:
            conn.close()
        assert row == (None, None)  # never provider_accepted
    finally:
        d.stop()
