"""Drawing `session.lineage` as text for `agenthost tree` (issue 21 §3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Json = Mapping[str, Any]


def _short(sid: str) -> str:
    return sid[:8]


def format_tree(tree: Json) -> str:
    """Ancestors root first, then the Session (marked `*`), then its descendants indented;
    a deleted node is drawn as `(deleted)`, each fork child with `#ordinal` among its
    source's forks and the source Turn it was forked through."""
    lines: list[str] = []

    def line(level: int, text: str) -> None:
        lines.append(("  " * (level - 1) + "└─ " if level else "") + text)

    depth = 0
    for ancestor in reversed(list(tree.get("ancestors") or [])):
        session = ancestor.get("session")
        title = "(deleted)" if session is None else session["title"]
        line(depth, f"{_short(ancestor['agentSessionId'])}  {title}")
        depth += 1
    me = tree["session"]
    line(depth, f"{_short(me['agentSessionId'])}  {me['title']}  <- this session")

    def walk(nodes: list[Json], level: int) -> None:
        for node in nodes:
            lin = node.get("lineage") or {}
            title = "(deleted)" if node.get("deleted") else node["title"]
            through = str(lin.get("sourceTurnId") or "")[:8]
            line(
                level,
                f"#{node['ordinal']} {_short(node['agentSessionId'])}  {title}"
                f"  (through turn {through})",
            )
            walk(list(node.get("children") or []), level + 1)

    walk(list(tree.get("descendants") or []), depth + 1)
    return "\n".join(lines)
