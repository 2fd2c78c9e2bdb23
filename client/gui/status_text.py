"""What the GUI says about the open session and its forks, as pure functions: the session
bar's text, the Session-level Fork button's label/state/tooltip, the notice of a fork that
failed or whose result is unknown, and a Turn's short label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from rich.text import Text

from client.engine.values import ForkMutation, MutationStatus
from client.session_client import fork_refusal
from protocol.objects import JsonObject


def session_bar_text(
    session: Mapping[str, Any], blocked: str | None, *, waiting: bool = False
) -> Text:
    """The session's title, provider and whether it forks through a Turn; with `blocked`, why
    it cannot be forked now; `waiting`: the daemon does not answer, so it says that instead of
    what it cannot know now."""
    text = Text(str(session["title"]), no_wrap=True, overflow="ellipsis")
    if waiting:
        # What it says first at 80 columns, where the provider would push it out of view.
        text.append("  waiting for the daemon…", style="bold yellow")
        return text
    can = session["lifecycleCapabilities"]["forkThroughTurn"]
    text.append(f"  {session['provider']} · {'can fork' if can else 'cannot fork'}", style="dim")
    if blocked:
        # Said here too, not only in the Fork tooltip: a keyboard user never hovers. One line
        # (the bar never grows); the details pane (F3) has the whole sentence.
        text.append(f" · not now: {blocked}", style="dim italic")
    return text


def short_path(path: str, parts: int = 2) -> str:
    """`…/repo.agenthost/e85edd7b` for a long path: a toast (40 cells wide at 80 columns) keeps
    the end of a path, the part that names it, instead of wrapping it mid-name."""
    pieces = [p for p in path.split("/") if p]
    if len(pieces) <= parts:
        return path
    return "…/" + "/".join(pieces[-parts:])


def turn_state_words(turn: Mapping[str, Any], can_fork: bool = False) -> str:
    """A Turn's state for a person: `done`, `running`, `waiting for an answer`, `interrupted`,
    `failed`; `can fork` when its Fork is usable, and why not when its binding forbids it;
    `never sent` for a Turn the provider never got (no fork goes through it, but it blocks no
    later one). The internal names (phase, outcome, binding) are in `show --json` and the
    details pane."""
    if turn.get("phase") != "settled":
        pending = any(i.get("status") == "pending" for i in turn.get("interactions") or [])
        return "waiting for an answer" if pending else "running"
    words = {"completed": "done"}.get(str(turn.get("outcome")), str(turn.get("outcome")))
    binding = turn.get("providerForkBindingState")
    if turn.get("hostOnly"):
        words += " · never sent to the provider"
    elif binding == "recovery_required":
        words += " · fork needs recovery"
    elif binding == "unavailable":
        words += " · cannot be forked"
    elif can_fork:
        words += " · can fork"
    return words


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def turn_glance(turn: Mapping[str, Any]) -> str:
    """What a Turn did, at a glance: `2 tool calls · approval approved · question`, empty
    when it only talked."""
    parts = []
    calls = sum(1 for m in turn.get("messages") or [] if m.get("kind") == "tool_call")
    if calls:
        parts.append(_count(calls, "tool call"))
    for interaction in turn.get("interactions") or []:
        kind = str(interaction.get("kind") or "interaction")
        output = interaction.get("output") or {}
        if interaction.get("status") == "pending":
            parts.append(f"{kind} waiting")
        elif "decision" in output:
            verdict = {"approve": "approved", "decline": "declined"}.get(str(output["decision"]))
            parts.append(f"{kind} {verdict or output['decision']}")
        elif interaction.get("status") == "resolved":
            parts.append(f"{kind} answered")
        else:
            parts.append(f"{kind} {interaction.get('status')}")
    if turn.get("outcome") == "failed":
        parts.append("error")
    return " · ".join(parts)


def details_text(
    session: Mapping[str, Any],
    turns: Sequence[Mapping[str, Any]],
    unknown: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The details pane: the internal names the rest of the GUI puts into words, and the whole
    id of each `unknown` fork (by boundary Turn id) that `agenthost resolve` needs: the mark
    names it by 8 characters, and no prefix of an operation that is not committed is found."""
    caps = session.get("lifecycleCapabilities") or {}
    lines = [
        f"session {session['agentSessionId']}  kind {session.get('kind')}",
        f"provider {session['provider']}  providerSessionId {session.get('providerSessionId')}",
        "lifecycleCapabilities " + ", ".join(f"{k}={v}" for k, v in sorted(caps.items())),
        f"activeTurnId {session.get('activeTurnId')}",
        f"cwd {session.get('cwd')}",
    ]
    lineage = session.get("forkedFrom")
    if isinstance(lineage, Mapping):
        lines.append(
            f"forkedFrom {lineage.get('sourceAgentSessionId')} through "
            f"{lineage.get('sourceTurnId')} (operation {lineage.get('operationId')})"
        )
    for turn in turns:
        lines.append(
            f"Turn {turn['sequence']} {turn['turnId']}: phase {turn['phase']}, outcome "
            f"{turn.get('outcome')}, binding {turn['providerForkBindingState']}"
            + (", hostOnly" if turn.get("hostOnly") else "")
        )
        operation = (unknown or {}).get(str(turn["turnId"]))
        if operation is not None:
            lines.append(
                f"  fork unknown: operation {operation['operationId']}"
                f" (agenthost resolve {operation['operationId']})"
            )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ButtonState:
    label: str
    disabled: bool
    tooltip: str


def fork_session_button(pending: bool, blocked: str | None) -> ButtonState:
    """The shown Session-level Fork (`latestSettled`): disabled while its fork is
    in flight or while the session is not quiet (the reason in the tooltip)."""
    if pending:
        tooltip = "A fork of this whole session is in progress"
    elif blocked is not None:
        tooltip = f"Cannot fork now: {blocked}"
    else:
        tooltip = "Fork the whole session from where it is now (its latest turn)"
    return ButtonState(
        label="Forking…" if pending else "Fork session",
        disabled=pending or blocked is not None,
        tooltip=tooltip,
    )


def fork_failure_words(
    record: ForkMutation,
    *,
    turns: Sequence[Mapping[str, Any]],
    session: Mapping[str, Any] | None,
) -> str:
    """The notice for a fork that failed (its refusal in words) or whose result is unknown."""
    if record.error_detail is not None:
        detail = record.error_detail
        return fork_refusal(
            str(detail.get("reason") or record.error),
            cast(JsonObject | None, detail.get("params")),
            turn_id=record.turn_id,
            turns=turns,
            session=session,
            message=str(detail["message"]) if detail.get("message") is not None else None,
            latest=record.point != "throughTurn",
        )
    if record.status is MutationStatus.UNKNOWN and record.recorded_unknown:
        return (
            f"the daemon cannot tell whether the fork made its provider child ({record.error});"
            " press Inspect on the turn to see the evidence, then adopt or abandon it"
        )
    if record.status is MutationStatus.UNKNOWN:
        return (
            f"the fork's result is unknown ({record.error}); "
            "Fork again to retry with the same identity (it never forks twice)"
        )
    return f"the fork failed: {record.error}"


def turn_label(turns: Sequence[Mapping[str, Any]], turn_id: str) -> str:
    """`Turn 3` for a loaded Turn, else the start of its id."""
    for turn in turns:
        if turn.get("turnId") == turn_id:
            return f"Turn {turn['sequence']}"
    return f"turn {turn_id[:8]}"
