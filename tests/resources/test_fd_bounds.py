"""File descriptors, through the real daemon: under `RLIMIT_NOFILE=1024`, 700 Sessions written to
through their actors must not exhaust file descriptors. Session actors share a bounded thread
pool and the store a bounded connection pool, so threads and connections do not grow with the
number of live Sessions; turns still run and complete afterwards.

On the per-Session-thread design every live actor held a thread and its own SQLite connection
(three descriptors: database, WAL, shared memory), and ~500 Sessions hit the limit.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(300)

SESSIONS = 700
FD_LIMIT = 1024


def _limit_fds() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, min(hard, FD_LIMIT)))


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_700_sessions_written_to_under_1024_fds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Actors stay live for the whole test: nothing is bounded by idling them out.
    (home / "agenthost.toml").write_text(
        "[daemon]\nidle_actor_seconds = 600\nactor_threads = 16\nstore_connections = 8\n"
    )
    d = DaemonProcess(home, preexec_fn=_limit_fds).start()
    try:
        c = d.client(timeout=60)
        assert d.proc is not None
        limits = Path(f"/proc/{d.proc.pid}/limits").read_text()
        assert any(
            line.startswith("Max open files") and " 1024 " in line for line in limits.splitlines()
        ), limits
        sids = [create_session(c)["agentSessionId"] for _ in range(SESSIONS)]
        for i, sid in enumerate(sids):
            # session.pin is applied by the Session's own actor: 700 live actors (a rename
            # would go straight to the store).
            c.call("session.pin", {"workspaceId": WS, "agentSessionId": sid, "pinned": i % 2 == 0})
        status = c.call("host.status")
        assert status["sessionActors"] == SESSIONS
        assert status["storeConnections"] <= 8, status
        assert status["threads"] < 100, status
        assert _open_fds(d.proc.pid) < FD_LIMIT // 2
        # The provider path still works: workers spawn, turns settle.
        for sid in sids[:3]:
            assert run_turn(c, sid, "after 700")["outcome"] == "completed"
        for i in (0, SESSIONS - 1):
            got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sids[i]})["session"]
            assert got["pinned"] is (i % 2 == 0)
        workers = c.call("host.status")["workers"]
        assert all(w["state"] == "ready" and w["restarts"] == 0 for w in workers), workers
    finally:
        d.stop()
