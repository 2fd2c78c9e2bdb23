"""The pure view rules of seed 000 §9, free of Textual so the CLI and the GUI show the same thing
and tests pin them without a terminal: a Turn's Fork action, where the "continued from …"
divider goes, and the lineage tree of the session list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

Json = dict[str, Any]


class ForkAction(StrEnum):
    """How a Turn's Fork action is shown."""

    HIDDEN = "hidden"
    """The Session cannot fork through this Turn at all: capability false, a child-lane
    (non-root) Session, a Turn not settled, or a Turn whose provider binding is not `bound`."""
    ENABLED = "enabled"
    DISABLED = "disabled"
    """Shown but not clickable: a fork through this exact Turn is in flight."""
    BLOCKED = "blocked"
    """Shown but not clickable: the source is not quiet (a Turn is running or waiting for an
    answer); `fork_blocked` gives the reason for the tooltip."""
    UNRESOLVED = "unresolved"
    """Shown but not clickable: a fork through this Turn ended `unknown` and waits for a
    person's `fork.resolve` (a new fork of the Turn is refused until then)."""


def fork_action(
    session: Mapping[str, Any],
    turn: Mapping[str, Any],
    pending: bool,
    blocked: bool = False,
    unresolved: bool = False,
) -> ForkAction:
    capabilities = session.get("lifecycleCapabilities") or {}
    if not capabilities.get("forkThroughTurn") or session.get("kind") != "root":
        return ForkAction.HIDDEN
    if turn.get("phase") != "settled" or turn.get("providerForkBindingState") != "bound":
        return ForkAction.HIDDEN
    if pending:
        return ForkAction.DISABLED
    if unresolved:
        return ForkAction.UNRESOLVED
    return ForkAction.BLOCKED if blocked else ForkAction.ENABLED


def divider_after(session: Mapping[str, Any], turns: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the loaded Turn after which "continued from …" goes, or None.

    Only right after the Turn that `forkedFrom.targetTurnId` names; while that Turn is not
    loaded the divider is hidden, never moved to the end of the timeline.
    """
    lineage = session.get("forkedFrom")
    if not isinstance(lineage, Mapping):
        return None
    for index, turn in enumerate(turns):
        if turn.get("turnId") == lineage.get("targetTurnId"):
            return index
    return None


@dataclass(frozen=True, slots=True)
class TreeRow:
    depth: int
    session: Json


def session_tree(sessions: Iterable[Mapping[str, Any]]) -> list[TreeRow]:
    """Sessions in lineage order: each fork child under its source (orphans become roots)."""
    by_id = {str(s["agentSessionId"]): dict(s) for s in sessions}
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for sid, session in by_id.items():
        source = (session.get("forkedFrom") or {}).get("sourceAgentSessionId")
        if source in by_id and source != sid:
            children.setdefault(str(source), []).append(sid)
        else:
            roots.append(sid)

    def order(ids: list[str]) -> list[str]:
        return sorted(ids, key=lambda i: (by_id[i].get("createdAtUnixMs") or 0, i))

    rows: list[TreeRow] = []
    seen: set[str] = set()

    def walk(sid: str, depth: int) -> None:
        if sid in seen:
            return
        seen.add(sid)
        rows.append(TreeRow(depth, by_id[sid]))
        for child in order(children.get(sid, [])):
            walk(child, depth + 1)

    for root in order(roots):
        walk(root, 0)
    return rows


def divider_text(source_title: str) -> str:
    return f"continued from {source_title}"
