"""PROTOCOL.md "Failpoints": `AGENTHOST_FAILPOINTS` arms points at start by itself; only the
run-time `debug.failpoints` method needs the daemon to run with AGENTHOST_ENABLE_FAILPOINTS=1."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.reliability.reliability_harness import fork_params
from tests.support.daemon import DaemonProcess, create_session, run_turn
from transport.client import ApiError

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "spec", ["host.fork.after_prepare=once:kill", "once:host.fork.after_prepare=kill"]
)
def test_env_failpoints_fire_without_the_debug_method_enabled(tmp_path: Path, spec: str) -> None:
    """`once:` before the name is the same as before the action: either spelling arms it."""
    d = DaemonProcess(
        tmp_path / "home", env={"AGENTHOST_ENABLE_FAILPOINTS": "0"}, failpoints=spec
    ).start()
    try:
        c = d.client()
        with pytest.raises(ApiError) as err:
            c.call("debug.failpoints", {"points": {"host.fork.after_commit": "kill"}})
        assert (err.value.status, err.value.reason) == (400, "unknown_method")
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, "one")
        c.submit("fork.create", fork_params(sid, turn["turnId"]))  # the daemon dies: no reply
        assert d.wait_exit(30) == -signal.SIGKILL
    finally:
        d.stop()
