"""Session, Turn and fork-operation references as a person types them (a full id, a unique id
prefix, a Turn's sequence number) resolved to full ids, with the paged reads they need
(`list_sessions`, `timeline`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from protocol.methods import SESSION_LIST, SESSION_TIMELINE, SessionListParams, TimelineParams
from protocol.objects import Session, Turn
from transport.client import Client

Json = dict[str, Any]


class ReferenceError_(LookupError):
    """A session or turn reference that matches nothing, or more than one thing."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def list_sessions(client: Client, ws: str) -> list[Session]:
    sessions: list[Session] = []
    cursor: str | None = None
    while True:
        params = SessionListParams(workspaceId=ws, limit=200)
        if cursor:
            params["cursor"] = cursor
        page = client.call(SESSION_LIST, params)
        sessions.extend(page["sessions"])
        cursor = page.get("nextCursor")
        if not cursor:
            return sessions


def resolve_session(client: Client, ws: str, ref: str) -> str:
    """A full session id as given, or the one session whose id starts with `ref`."""
    if _is_uuid(ref):
        return ref
    found = [s for s in list_sessions(client, ws) if s["agentSessionId"].startswith(ref)]
    if len(found) == 1:
        return str(found[0]["agentSessionId"])
    if not found:
        raise ReferenceError_(
            "workspace_agent_session_not_found",
            f"no session matches {ref!r} in workspace {ws!r} (`agenthost sessions` lists them)",
        )
    shown = ", ".join(f"{s['agentSessionId'][:12]} {s['title']!r}" for s in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    raise ReferenceError_(
        "ambiguous_reference",
        f"{ref!r} matches {len(found)} sessions ({shown}{more}); type more of the id",
    )


def resolve_operation(client: Client, ws: str, ref: str) -> str:
    """A full operation id as given, or the one committed fork operation (named by a live
    child's lineage) whose id starts with `ref`. A failed operation needs its full id: no wire
    method lists operations."""
    if _is_uuid(ref):
        return ref
    matches = sorted(
        {
            str(lineage["operationId"])
            for s in list_sessions(client, ws)
            if isinstance(lineage := s.get("forkedFrom"), Mapping)
            and str(lineage.get("operationId", "")).startswith(ref)
        }
    )
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return ref  # the daemon's own 404 says it; `OPERATION_HINT` is the hint beside it
    raise ReferenceError_(
        "ambiguous_reference",
        f"{ref!r} matches {len(matches)} operations ({', '.join(m[:12] for m in matches[:5])})"
        "; type more of the id",
    )


OPERATION_HINT = (
    "an id prefix finds only the committed forks of live sessions; give the full operation id "
    "(`agenthost fork` prints it, `agenthost show CHILD` a committed fork's, the GUI's details "
    "(F3) an unknown fork's)"
)


def timeline(client: Client, ws: str, sid: str) -> list[Turn]:
    turns: list[Turn] = []
    after = 0
    while True:
        page = client.call(
            SESSION_TIMELINE,
            TimelineParams(workspaceId=ws, agentSessionId=sid, afterSequence=after, limit=200),
        )
        turns.extend(page["turns"])
        nxt = page.get("nextSequence")
        if not nxt or not page["turns"]:
            return turns
        after = int(page["turns"][-1]["sequence"])


def resolve_turn(turns: Sequence[Mapping[str, Any]], ref: str) -> str:
    """A Turn by id, by sequence number (`2`), or by unique id prefix."""
    for turn in turns:
        if turn["turnId"] == ref:
            return str(turn["turnId"])
    if ref.isdigit():
        for turn in turns:
            if int(turn["sequence"]) == int(ref):
                return str(turn["turnId"])
        raise ReferenceError_("turn_not_found", f"no turn with sequence {ref}{_turn_range(turns)}")
    matches = [t["turnId"] for t in turns if str(t["turnId"]).startswith(ref)]
    if len(matches) == 1:
        return str(matches[0])
    if not matches:
        raise ReferenceError_("turn_not_found", f"no turn matches {ref!r}{_turn_range(turns)}")
    raise ReferenceError_(
        "ambiguous_reference", f"{ref!r} matches {len(matches)} turns; type more of the id"
    )


def _turn_range(turns: Sequence[Mapping[str, Any]]) -> str:
    """The hint after a Turn reference that matched nothing."""
    if not turns:
        return " (the session has no turns yet)"
    first, last = int(turns[0]["sequence"]), int(turns[-1]["sequence"])
    return f" (its turns are {first}..{last}; a sequence number or an id prefix names one)"


# -- turns ---------------------------------------------------------------------------------
