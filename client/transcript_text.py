"""A session in words for a terminal: the transcript (`agenthost show`) with its Turns,
messages, Interactions, failures, lineage, ancestry and divider, and the reads it needs (the
source's title, the ancestry walk).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from client.view_rules import divider_after, divider_text
from client.workspace_text import files_line
from domain.interrupts import ANSWERED_BY
from protocol.methods import SESSION_GET, SESSION_LINEAGE, LineageParams, SessionParams
from transport.client import ApiError, Client


def format_message(message: Mapping[str, Any]) -> str:
    return f"  {message.get('kind', ''):>9}: {message.get('text') or ''}"


def says_nothing(message: Mapping[str, Any]) -> bool:
    """A tool result with no text (an approved command that printed nothing): its line would
    read `tool_result:` and nothing more, so it is left out."""
    return message.get("kind") == "tool_result" and not str(message.get("text") or "").strip()


def source_title(client: Client, ws: str, session: Mapping[str, Any]) -> str | None:
    """The current title of a child's source session, or None when it is gone."""
    lineage = session.get("forkedFrom")
    if not isinstance(lineage, Mapping):
        return None
    try:
        source = client.call(
            SESSION_GET,
            SessionParams(workspaceId=ws, agentSessionId=lineage["sourceAgentSessionId"]),
        )["session"]
    except ApiError:
        return None
    return str(source["title"])


@dataclass(frozen=True, slots=True)
class Ancestor:
    """One step of a fork child's ancestry: the session id, its title (None when deleted)."""

    session_id: str
    title: str | None


def ancestry(
    client: Client, ws: str, session: Mapping[str, Any], limit: int = 64
) -> list[Ancestor]:
    """The sources of a fork child, oldest first, ending with the session itself.

    A deleted ancestor cannot be read any more: it is listed with `title=None` and the walk
    stops there (its own source is unknown to a client).
    """
    chain = [Ancestor(str(session["agentSessionId"]), str(session["title"]))]
    current: Mapping[str, Any] = session
    seen = {chain[0].session_id}
    while len(chain) < limit:
        lineage = current.get("forkedFrom")
        if not isinstance(lineage, Mapping):
            break
        source_id = str(lineage["sourceAgentSessionId"])
        if source_id in seen:
            break
        seen.add(source_id)
        try:
            current = client.call(
                SESSION_GET, SessionParams(workspaceId=ws, agentSessionId=source_id)
            )["session"]
        except ApiError:
            chain.append(Ancestor(source_id, None))
            break
        chain.append(Ancestor(source_id, str(current["title"])))
    chain.reverse()
    return chain


def lineage_ancestry(client: Client, ws: str, session: Mapping[str, Any]) -> list[Ancestor]:
    """The ancestry from the daemon's `session.lineage`, oldest first, ending with the session
    itself: unlike the walk of `ancestry`, it goes on past a deleted ancestor to the live
    ones above it (the store keeps the lineage of a deleted Session)."""
    if not isinstance(session.get("forkedFrom"), Mapping):
        return [Ancestor(str(session["agentSessionId"]), str(session["title"]))]
    try:
        tree = client.call(
            SESSION_LINEAGE, LineageParams(workspaceId=ws, agentSessionId=session["agentSessionId"])
        )
    except ApiError:
        return ancestry(client, ws, session)
    chain = [Ancestor(str(session["agentSessionId"]), str(session["title"]))]
    for step in tree.get("ancestors") or []:
        live = step.get("session")
        chain.append(Ancestor(str(step["agentSessionId"]), None if live is None else live["title"]))
    chain.reverse()
    return chain


def ancestor_name(ancestor: Ancestor) -> str:
    """Its title, or `(deleted <id8>)`."""
    if ancestor.title is not None:
        return ancestor.title
    return f"(deleted {ancestor.session_id[:8]})"


def format_ancestry(chain: Sequence[Ancestor]) -> str:
    """`A → A (2) → A (3)`; a deleted ancestor reads `(deleted <id8>)`."""
    return " → ".join(ancestor_name(a) for a in chain)


def describe_interaction(interaction: Mapping[str, Any]) -> str:
    """What an Interaction asks: the question, or the command/action awaiting approval."""
    value = interaction.get("input") or {}
    for key in ("text", "question", "command", "prompt", "title", "toolName"):
        if value.get(key):
            return str(value[key])
    return ", ".join(f"{k}={v}" for k, v in value.items()) or str(interaction.get("kind"))


def format_interaction(
    interaction: Mapping[str, Any], pending_hint: str = "answer with `agenthost answer`"
) -> str:
    """One readable line: `approval: ls  → approved`, `question: color?  → "blue"`, or the
    pending one with a hint to answer it."""
    kind = str(interaction.get("kind") or "interaction")
    head = f"{kind}: {describe_interaction(interaction)}"
    status = str(interaction.get("status") or "")
    output = interaction.get("output") or {}
    if status == "pending":
        return f"{head}  (pending — {pending_hint})"
    by = f" (by {ANSWERED_BY.get(str(output['by']), 'a client')})" if output.get("by") else ""
    if "decision" in output:
        verdict = {"approve": "approved", "decline": "declined"}.get(
            str(output["decision"]), str(output["decision"])
        )
        return f"{head}  → {verdict}{by}"
    if "text" in output:
        return f"{head}  → {json.dumps(str(output['text']), ensure_ascii=False)}{by}"
    return f"{head}  ({status})"


def format_transcript(
    session: Mapping[str, Any],
    turns: Sequence[Mapping[str, Any]],
    source: str | None = None,
    chain: Sequence[Ancestor] | None = None,
) -> str:
    """Human transcript: Turn ids, phases, binding states, lineage, ancestry, the divider,
    Interactions and why a Turn failed or was interrupted."""
    capabilities = session.get("lifecycleCapabilities") or {}
    lines = [
        f"Session {session['agentSessionId']} — {session['title']} [{session['provider']}]"
        f"  fork through turn: {'yes' if capabilities.get('forkThroughTurn') else 'no'}"
    ]
    lineage = session.get("forkedFrom")
    if isinstance(lineage, Mapping):
        source_id = str(lineage["sourceAgentSessionId"])
        # A deleted source has no title: named once, by its short id, never as "id (id)".
        named = f"{source} ({source_id})" if source else f"(deleted {source_id[:8]})"
        lines.append(
            f"  forked from {named} through turn {lineage['sourceTurnId']}, "
            f"operation {lineage['operationId']}"
        )
        if session.get("cwd"):
            # A worktree fork's files are in a tree of its own: where to open them.
            lines.append(f"  files: {session['cwd']}")
        if chain and len(chain) > 1:
            lines.append(f"  ancestry: {format_ancestry(chain)}")
            root = chain[0]
            if source is None and root.title is not None:
                lines.append(f"  live root: {root.title} ({root.session_id})")
    boundary = divider_after(session, turns)
    for index, turn in enumerate(turns):
        outcome = f"/{turn['outcome']}" if turn.get("outcome") else ""
        # A Turn the provider never got blocks no fork: not "binding unavailable", which does.
        binding = (
            "never sent to the provider"
            if turn.get("hostOnly")
            else f"binding {turn['providerForkBindingState']}"
        )
        lines.append(
            f"  Turn {turn['sequence']} {turn['turnId']} [{turn['phase']}{outcome}, {binding}]"
        )
        for message in turn.get("messages") or []:
            if not says_nothing(message):
                lines.append("  " + format_message(message))
        for interaction in turn.get("interactions") or []:
            lines.append(f"      {format_interaction(interaction)}")
        why = turn_error_text(turn)
        if why:
            lines.append(f"      {why}")
        files = files_line(turn)
        if files:
            lines.append(f"      {files}")
        if index == boundary:
            source_id = str((lineage or {}).get("sourceAgentSessionId", ""))
            title = source or (f"(deleted {source_id[:8]})" if source_id else "the source")
            lines.append(f"    ──── {divider_text(str(title))} ────")
    return "\n".join(lines)


def turn_error_text(turn: Mapping[str, Any]) -> str | None:
    """`failed: <why>` / `interrupted: <why>` for a Turn that did not complete, else None."""
    outcome = turn.get("outcome")
    if turn.get("phase") != "settled" or outcome in (None, "completed"):
        return None
    why = turn.get("error")
    return f"{outcome}: {why}" if why else f"{outcome} (no reason given)"
