"""Worktree forks against a real daemon: the `fork.create` params that ask for a worktree, and
the trees a fork left beside the repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.daemon import WS


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
