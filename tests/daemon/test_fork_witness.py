"""The fence's witness through a real daemon: a source's boundary changed by raw SQL behind the
daemon's back between prepare and commit — here while the daemon is down, killed just before
its commit — is counted by the store's triggers, and the restart's commit fails closed: no
child, the operation not committed (law 2; docs/design/store.md, "The fence's witness")."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import apsw
import pytest

from tests.daemon.test_fork_saga import three_turn_source
from tests.reliability.reliability_harness import fork_params
from tests.support.daemon import WS, DaemonProcess
from transport.client import ApiError

pytestmark = pytest.mark.timeout(180)


def test_a_boundary_changed_while_the_daemon_was_down_fails_its_commit_closed(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client(timeout=10)
    sid, turns = three_turn_source(c)
    through = turns[1]["turnId"]
    c.call("debug.failpoints", {"points": {"host.fork.before_commit": "once:kill"}})
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    c.submit("fork.create", fork_params(sid, through, request_id=rid, target=target))
    assert d.wait_exit(30) == -signal.SIGKILL
    d.kill()
    # Behind the daemon's back: one boundary Message rewritten in the store file.
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        conn.execute(
            "UPDATE messages SET text = text || ' (tampered)' WHERE workspace_id = ?"
            " AND session_id = ? AND turn_id = ?",
            (WS, sid, through),
        )
        assert conn.changes() > 0
        (changes,) = conn.execute(
            "SELECT f.changes FROM history_fences f JOIN session_keys k USING (session_key)"
            " WHERE k.workspace_id = ? AND k.session_id = ?",
            (WS, sid),
        ).fetchone()
        assert changes > 0  # the witness counted it
    finally:
        conn.close()
    d2 = DaemonProcess(home).start()
    try:
        c2 = d2.client(timeout=10)
        op_id = next(o["operation_id"] for o in _operations(home) if o["request_id"] == rid)
        # Start-up recovery tried the commit; a `fork.get` of the leftover tries it again, and
        # is refused as recovery was: the boundary is not what prepare froze.
        with pytest.raises(ApiError) as refused:
            c2.call("fork.get", {"workspaceId": WS, "operationId": op_id})
        assert refused.value.reason == "agent_session_fork_snapshot_corrupt", refused.value
        assert "changed since prepare" in str(refused.value)
        with pytest.raises(ApiError) as missing:
            c2.call("session.get", {"workspaceId": WS, "agentSessionId": target})
        assert missing.value.status == 404
        statuses = {o["request_id"]: o["status"] for o in _operations(home)}
        assert statuses[rid] == "provider_accepted"
    finally:
        d2.stop()


def _operations(home: Path) -> list[dict[str, str]]:
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [
            {"operation_id": r[0], "request_id": r[1], "status": r[2]}
            for r in conn.execute("SELECT operation_id, request_id, status FROM fork_operations")
        ]
    finally:
        conn.close()
