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


def format_resolution(result: Json) -> str:
    """`agenthost resolve`: the operation, then each provider child found and the verdict."""
    op = result["operation"]
    lines = [f"operation {op['operationId']}: {op['status']} ({op['phase']})"]
    evidence = result.get("evidence") or {}
    children = list(evidence.get("children") or [])
    if evidence:
        lines.append(f"  verdict: {evidence.get('verdict')}")
    for child in children:
        where = ", ".join(child.get("locations") or []) or "?"
        lines.append(
            f"  child {child['providerSessionId']} (in the {where} home): "
            f"forked from {child.get('forkedFromId')}, "
            f"turns {'equal' if child.get('turnsEqualPrefix') else 'DIFFER from'} the frozen "
            f"prefix, {'reads' if child.get('readsFromOwnHome') else 'does not read'} "
            "from its own home"
        )
    if evidence and not children:
        lines.append("  no provider child for this operation")
    for path in evidence.get("quarantinedNow") or evidence.get("quarantined") or []:
        lines.append(f"  quarantined: {path}")
    if op.get("session"):
        lines.append(
            f"  child session: {op['session']['agentSessionId']}  {op['session']['title']}"
        )
    if op["status"] == "unknown" and evidence.get("verdict") == "adoptable":
        lines.append("  next: agenthost resolve OP --adopt (or --abandon)")
    elif op["status"] == "unknown":
        lines.append("  next: agenthost resolve OP --abandon")
    return "\n".join(lines)
