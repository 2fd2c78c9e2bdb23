"""`workspace.restore` and `session.workspaceDiff` in the soaks' chaos (docs/design/workspace.md,
"The workspace methods", "Laws"): the request a client sends — a restore of a Session's folder
to an earlier Turn's `before` or `after`, or the undo of its last restore, `force` at times; a
diff of a Turn's, or from another Turn's `after` — and the refusals a law allows under the
soaks' faults (counted, not failures). Each soak sends them and keeps the answers for
`check_workspace_answers` its own way (a kill loses a reply in the crash soak, never in the
contention soak's)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from tests.support.daemon import WS

WORKSPACE_REFUSALS = {
    "workspace.restore": (
        "agent_session_busy",  # a Turn of the Session is active
        "workspace_shared",  # another live Session works in the folder (no `force`)
        "workspace_checkpoint_missing",  # the Turn not settled, copied by a fork, or unavailable
        "workspace_unavailable",  # git stalled past its bound, or could not be used now
        "workspace_agent_session_not_found",  # deleted meanwhile
        "store_busy",  # the write lock held by a fault
    ),
    "session.workspaceDiff": (
        "workspace_checkpoint_missing",
        "workspace_unavailable",
        "workspace_agent_session_not_found",
        "turn_not_found",
        "store_busy",
    ),
}
"""The refusals a law allows `workspace.restore` and `session.workspaceDiff` in the soaks
(counted in the summary); any other error answer is a failure."""


def workspace_request(
    rng: random.Random, sid: str, turns: Sequence[str], undo: str | None, how: str
) -> tuple[str, dict[str, Any], str | None] | None:
    """The method, params and asked tree (a restore of an undo, else None) of a `how`
    (`restore` or a diff) of Session `sid`, whose settled Turns so far are `turns` and whose
    last restore answered `undo`; None when a restore has nothing to go back to."""
    params: dict[str, Any] = {"workspaceId": WS, "agentSessionId": sid}
    if how != "restore":
        if turns and rng.random() < 0.7:
            params["turnId"] = rng.choice(turns)
            if rng.random() < 0.3:
                params["fromTurnId"] = rng.choice(turns)
        return "session.workspaceDiff", params, None
    asked: str | None = None
    if undo is not None and (not turns or rng.random() < 0.25):
        params["tree"] = asked = undo
    elif turns:
        params |= {"turnId": rng.choice(turns), "which": rng.choice(["before", "after"])}
    else:
        return None
    if rng.random() < 0.5:
        params["force"] = True
    return "workspace.restore", params, asked


def refusal(method: str, status: int, body: dict[str, Any]) -> tuple[str, bool]:
    """An error answer's count key (`<method> <status> <reason>[/<workspaceReason>]`) and
    whether a law allows it (`WORKSPACE_REFUSALS`)."""
    reason = str(body.get("reason"))
    why = (body.get("params") or {}).get("workspaceReason")
    key = f"{method} {status} {reason}" + (f"/{why}" if why else "")
    return key, reason in WORKSPACE_REFUSALS[method]
