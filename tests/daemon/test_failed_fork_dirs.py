"""A fork that ends with no provider child leaves no directory of its target behind: the
worker makes the child's directories while the provider forks (so the bind writes only the
file), and a fork the provider refused, or one abandoned with nothing to quarantine, has no
Session to own them. Through the real daemon, worker and tutti-agent app-server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    wait_for,
)
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.timeout(120)


def _session_dirs(home: Path) -> set[str]:
    return {p.name for p in (home / "runtimes" / WS).iterdir()}


def test_forks_the_provider_refused_leave_no_target_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # The app-server's thread/fork answers an error: each fork ends `failed`.
    d = DaemonProcess(
        home, failpoints="", env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=error"}
    ).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        for _ in range(3):
            op = c.call("fork.create", fork_params(WS, sid, boundary["turnId"]), timeout=60)
            assert op["operation"]["status"] == "failed", op
        assert _session_dirs(home) == {sid}
        run_turn(c, sid, "still here")  # the source is untouched
    finally:
        d.stop()
    assert_invariants(home)


def test_an_abandoned_fork_with_no_child_leaves_no_target_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # The worker's limit fires on a slow thread/fork: `unknown`; its app-server is killed
    # before the child is written, so the abandon finds none.
    (home / "agenthost.toml").write_text("[daemon]\nfork_provider_call_seconds = 2\n")
    d = DaemonProcess(
        home, failpoints="", env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=sleep:4000"}
    ).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        op_id = c.call("fork.create", fork_params(WS, sid, boundary["turnId"]), timeout=60)[
            "operation"
        ]["operationId"]

        def ended() -> dict[str, Any] | None:
            got = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            return None if got["status"] == "accepted" else dict(got)

        assert wait_for(ended, 60, interval=0.2)["status"] == "unknown"
        answer = c.call(
            "fork.resolve",
            {
                "workspaceId": WS,
                "operationId": op_id,
                "requestId": str(uuid.uuid4()),
                "action": "abandon",
            },
            timeout=60,
        )
        assert answer["operation"]["status"] == "abandoned", answer
        assert answer["evidence"]["children"] == [], answer
        assert _session_dirs(home) == {sid}
    finally:
        d.stop()
    assert_invariants(home)


def test_start_up_removes_a_failed_forks_folder_a_kill_left(tmp_path: Path) -> None:
    # A kill between a failed fork's record and its folder's removal leaves the folder the
    # worker made ahead (empty directories). The next start removes it; a folder holding a
    # file is kept (a quarantined child is never removed), and a live Session's too.
    home = tmp_path / "home"
    home.mkdir()
    env = {"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=error"}
    d = DaemonProcess(home, failpoints="", env=env).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        op = c.call("fork.create", fork_params(WS, sid, boundary["turnId"]), timeout=60)
        assert op["operation"]["status"] == "failed", op
        target = op["operation"]["targetAgentSessionId"]
    finally:
        d.kill()
    runtimes = home / "runtimes" / WS
    # What the kill would have left: the target's directories, made ahead, empty.
    (runtimes / target / "tutti-agent" / "sessions" / "2026").mkdir(parents=True)
    kept = str(uuid.uuid4())
    (runtimes / kept / "tutti-agent" / "quarantine").mkdir(parents=True)
    (runtimes / kept / "tutti-agent" / "quarantine" / "child.jsonl").write_text("{}\n")
    d = DaemonProcess(home, failpoints="", env=env).start()
    try:
        assert _session_dirs(home) == {sid, kept}
        run_turn(d.client(), sid, "still here")
    finally:
        d.stop()
