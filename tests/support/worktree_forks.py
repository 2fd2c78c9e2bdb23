"""Worktree forks against a real daemon: the `fork.create` params that ask for a worktree, the
trees a fork left beside the repository, and a failed fork's tree removed by a daemon killed
before its record."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from transport.client import Client


def worktree_fork_params(
    sid: str, turn_id: str, *, request_id: str, target: str, ws: str = WS
) -> dict[str, Any]:
    return {
        "workspaceId": ws,
        "agentSessionId": sid,
        "requestId": request_id,
        "targetAgentSessionId": target,
        "point": {"type": "throughTurn", "turnId": turn_id},
        "workspace": "worktree",
    }


def trees_beside(repo: Path) -> list[Path]:
    """The fork trees (and half-made ones) in the default place beside `repo`."""
    parent = repo.parent / (repo.name + ".agenthost")
    return sorted(parent.iterdir()) if parent.is_dir() else []


def source_in(c: Client, repo: Path) -> tuple[str, dict[str, Any]]:
    """A Session working in `repo` and its Turn that wrote a file (a checkpoint to fork
    through): the Session's id and the Turn."""
    sid = str(create_session(c, title="src", cwd=str(repo))["agentSessionId"])
    return sid, run_turn(c, sid, "/write src/app.py print('fork me')")


def kill_after_a_failed_forks_tree_removed(
    d: DaemonProcess, sid: str, turn: dict[str, Any]
) -> dict[str, Any]:
    """A `worktree` fork of `sid` through `turn` (`source_in`) that fails before dispatch
    (`host.workspace.after_record=once:error`), its tree removed, the daemon SIGKILLed at
    `host.workspace.after_remove` before the tree is recorded `removed` (the point's `once:`
    marker proves it fired). Returns the fork's params: their replay answers the original
    operation. The caller restarts the daemon."""
    c = d.client(timeout=60)
    point = "host.workspace.after_remove"
    c.call(
        "debug.failpoints",
        {"points": {"host.workspace.after_record": "once:error", point: "once:kill"}},
    )
    params = worktree_fork_params(
        sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
    )
    c.submit("fork.create", params)  # the reply never comes: the daemon dies
    assert d.wait_exit(60) == -signal.SIGKILL, d.tail_log()
    assert (d.home / "run" / "failpoints-host" / f"fired.{point}").exists()
    return params


def tree_state(d: DaemonProcess, child: str) -> str | None:
    """The `workspace_state` of the fork that made `child`, read beside the daemon (WAL)."""
    import apsw

    conn = apsw.Connection(str(d.home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute(
            "SELECT workspace_state FROM fork_operations WHERE target_session_id = ?", (child,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0])


def removal_counts(c: Client) -> tuple[int, int]:
    """`host.status` → `worktreeRemovals`' pending and removed counts. The store records a tree
    `removed` a moment before the live retries drop it from their list and count it, so a
    test that saw the record waits for these (`wait_for`), never reads them once."""
    removals = c.call("host.status")["worktreeRemovals"]
    return int(removals["pending"]), int(removals["removed"])
