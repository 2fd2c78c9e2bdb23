"""Lineage and fork resolution for people: `session.lineage` drawn as text for
`agenthost tree`, the ordinals and deleted-ancestor marks of the GUI's session list, and the
`fork.resolve` evidence in words (CLI `resolve`, the GUI's resolve dialog)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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

    # A stack, not recursion: a reply may list hundreds of levels.
    stack = [(node, depth + 1) for node in reversed(list(tree.get("descendants") or []))]
    while stack:
        node, level = stack.pop()
        lin = node.get("lineage") or {}
        title = "(deleted)" if node.get("deleted") else node["title"]
        through = str(lin.get("sourceTurnId") or "")[:8]
        line(
            level,
            f"#{node['ordinal']} {_short(node['agentSessionId'])}  {title}"
            f"  (through turn {through})",
        )
        cut = node.get("truncated")
        if cut:
            line(level + 1, f"… {_forks(cut)} below: agenthost tree {node['agentSessionId']}")
        stack.extend((child, level + 1) for child in reversed(list(node.get("children") or [])))
    cut = tree.get("truncated")
    if cut and cut.get("omittedChildren"):
        line(depth + 1, f"… {_forks(cut)} of this session not listed")
    return "\n".join(lines)


def _forks(cut: Json) -> str:
    n = int(cut.get("omittedChildren") or 0)
    return f"{n} more fork{'' if n == 1 else 's'}"


def status_words(op: Json) -> str:
    """`committed`, `accepted (dispatching)`: the status, and the phase when it says more."""
    status, phase = str(op.get("status")), str(op.get("phase"))
    return status if phase in (status, "None") else f"{status} ({phase})"


def format_resolution(result: Json) -> str:
    """`agenthost resolve`: the operation, then each provider child found and the verdict."""
    op = result["operation"]
    lines = [f"operation {op['operationId']}: {status_words(op)}"]
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


VERDICT_WORDS: dict[str, str] = {
    "adoptable": (
        "adoptable: exactly one provider child matches this fork (its turns equal the history "
        "up to here). Adopt makes it the fork's child session; Abandon moves it aside."
    ),
    "absent": (
        "absent: the provider made no child for this fork. Abandon releases the turn so it "
        "can be forked again."
    ),
    "ambiguous": (
        "ambiguous: more than one provider child, or one that does not match the history, so "
        "none can be adopted. Abandon moves them aside (never deleted) and releases the turn."
    ),
}


def verdict_words(verdict: str | None) -> str:
    """The evidence verdict of `fork.resolve` as a sentence for a person."""
    return VERDICT_WORDS.get(str(verdict), f"{verdict}: unrecognised verdict")


def child_words(child: Json) -> str:
    """One provider child of an `unknown` fork, readable: where it is, what it forked from,
    whether its turns equal the frozen prefix and whether it reads from its own home."""
    where = " and ".join(child.get("locations") or []) or "an unknown"
    return (
        f"provider session {child.get('providerSessionId')} in the {where} home: "
        f"forked from {child.get('forkedFromId') or '(not recorded)'}; its turns "
        f"{'equal' if child.get('turnsEqualPrefix') else 'do NOT equal'} the history up to "
        "the boundary; "
        + (
            "it reads from its own home"
            if child.get("readsFromOwnHome")
            else "it does not read from its own home yet (adopting binds it there)"
        )
    )


@dataclass(frozen=True, slots=True)
class LineageMark:
    """What the session list shows of a Session's lineage: its ordinal among its source's
    forks (None for a root, or when no live ancestor can tell), and whether any ancestor was
    deleted."""

    ordinal: int | None = None
    deleted_ancestor: bool = False


def lineage_marks(
    sessions: Iterable[Json], fetch: Callable[[str], Mapping[str, Any] | None]
) -> dict[str, LineageMark]:
    """Ordinals and deleted-ancestor marks for the listed Sessions from `session.lineage`
    (`fetch(id)` returns the result, or None when it failed), with few calls: one per
    top-level tree that has forks (its descendants carry every ordinal below it, through
    deleted nodes), one per fork whose source is not listed (its ancestors say which were
    deleted) and, for its own ordinal, one for its nearest live ancestor."""
    by_id = {str(s["agentSessionId"]): s for s in sessions}
    ordinal: dict[str, int] = {}
    deleted: set[str] = set()
    cache: dict[str, Json | None] = {}

    def get(sid: str) -> Json | None:
        if sid not in cache:
            cache[sid] = fetch(sid)
        return cache[sid]

    def walk(nodes: Iterable[Json], gone: bool) -> None:
        stack = [(node, gone) for node in nodes]
        while stack:
            node, below_gone = stack.pop()
            sid = str(node["agentSessionId"])
            ordinal.setdefault(sid, int(node["ordinal"]))
            if below_gone:
                deleted.add(sid)
            down = below_gone or bool(node.get("deleted"))
            stack.extend((child, down) for child in node.get("children") or [])

    def source_of(session: Json) -> str | None:
        lineage = session.get("forkedFrom")
        return str(lineage["sourceAgentSessionId"]) if isinstance(lineage, Mapping) else None

    has_children = {source_of(s) for s in by_id.values()}
    tops = [
        sid for sid, s in by_id.items() if (source := source_of(s)) is None or source not in by_id
    ]
    for sid in tops:
        if source_of(by_id[sid]) is None and sid not in has_children:
            continue  # a root without forks: nothing to mark
        tree = get(sid)
        if tree is None:
            continue
        ancestors = list(tree.get("ancestors") or [])
        gone = any(a.get("session") is None for a in ancestors)
        if gone:
            deleted.add(sid)
        walk(tree.get("descendants") or [], gone)
        live = next((a for a in ancestors if a.get("session") is not None), None)
        if live is not None and sid not in ordinal:
            above = get(str(live["agentSessionId"]))
            if above is not None:
                walk(above.get("descendants") or [], False)
    return {
        sid: LineageMark(ordinal.get(sid), sid in deleted)
        for sid in by_id
        if sid in ordinal or sid in deleted
    }
