"""Every state the store writes to a worktree fork's tree (`storage/fork_workspace.py`) is a
word of the wire's `WorktreeState`, and the projection answers each one: a fork operation read
while its child's delete is removing the tree (`removing`) was a 500 `internal_error`."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest

from agenthost import projection
from protocol import objects as wire
from storage import fork_workspace
from storage.models import ForkOperation

STORE_STATES = (
    fork_workspace.PLANNED,
    fork_workspace.MADE,
    fork_workspace.REMOVING,
    fork_workspace.REMOVED,
)


def test_the_wire_names_every_state_the_store_writes() -> None:
    assert set(STORE_STATES) == set(get_args(wire.WorktreeState))


@pytest.mark.parametrize("state", STORE_STATES)
def test_a_worktree_fork_in_each_state_projects(state: str) -> None:
    fields = {f: None for f in ForkOperation.__dataclass_fields__}
    op = ForkOperation.__new__(ForkOperation)
    for name, value in fields.items():
        object.__setattr__(op, name, value)
    op = replace(
        op,
        workspace_mode="worktree",
        worktree={"path": "/tmp/t", "childCwd": "/tmp/t/sub", "branch": "b"},
        worktree_state=state,
    )
    assert projection.operation_workspace(op) == {
        "mode": "worktree",
        "path": "/tmp/t",
        "cwd": "/tmp/t/sub",
        "branch": "b",
        "state": state,
    }
