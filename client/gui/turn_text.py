"""What one Turn says on screen, as Rich text: its header line, its body (messages, interactions,
error, and the provider's retry note while it retries), the `unknown` fork mark, and how many
lines each takes at a width (what the transcript needs to place Turns it has not mounted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.content import Content

from client.gui.status_text import turn_glance, turn_state_words
from client.session_client import format_interaction, turn_error_text
from client.workspace_text import change_list, changed_count, changed_files

GUI_FILES = 5
"""Changed files a Turn names in the transcript (`agenthost diff` lists them all)."""
PROGRESS_KEY = "guiProgress"
"""A GUI-only key of a Turn copy: the provider's latest retry note (`message.delta` of kind
`progress`), shown while the Turn waits for the model and dropped once it streams or settles."""


def turn_header(turn: Mapping[str, Any], can_fork: bool = False) -> Text:
    text = Text(f"Turn {turn['sequence']}", style="bold", no_wrap=True, overflow="ellipsis")
    text.append(f"  {turn_state_words(turn, can_fork)}", style="dim")
    # The file count before the glance: a narrow header (80 columns) is cut from the end, and
    # how many files a Turn changed is what a person looks for (its body lists the tool calls).
    files = changed_count(turn)
    if files is not None:
        text.append(f"  {files} changed", style="cyan")
    glance = turn_glance(turn)
    if glance:
        failed = turn.get("outcome") == "failed"
        text.append(f"  {glance}", style="bold red" if failed else "yellow")
    # A short id, last: the first thing elided when the line is narrow (`show` prints it whole).
    text.append(f"  {str(turn['turnId'])[:8]}", style="dim italic")
    return text


def message_line(message: Mapping[str, Any]) -> Text:
    kind = str(message.get("kind") or "")
    style = {"user": "bold cyan", "assistant": "green"}.get(kind, "yellow")
    line = Text(f"{kind:>11} ", style=style)
    line.append(str(message.get("text") or ""))
    return line


def unknown_text(operation: Mapping[str, Any]) -> Text:
    """The mark on the boundary Turn of an `unknown` fork operation."""
    text = Text("⚠ fork result unknown", style="bold yellow")
    point = operation.get("point") or {}
    full = " (full session)" if point.get("type") == "latestSettled" else ""
    text.append(
        f"{full}: operation {str(operation.get('operationId'))[:8]} may or may not have made a "
        "provider child; this turn cannot be forked again until it is resolved",
        style="yellow",
    )
    return text


def turn_body(turn: Mapping[str, Any]) -> Text:
    return Text("\n").join(body_lines(turn))


def body_lines(turn: Mapping[str, Any]) -> list[Text]:
    lines = [message_line(m) for m in turn.get("messages") or []]
    for interaction in turn.get("interactions") or []:
        pending = interaction.get("status") == "pending"
        lines.append(
            Text(
                f"{'':>11} {format_interaction(interaction, 'answer below')}",
                style="bold magenta" if pending else "magenta",
            )
        )
    why = turn_error_text(turn)
    if why:
        lines.append(Text(f"{'':>11} {why}", style="bold red"))
    files = changed_files(turn)
    if files:
        # The first few; `agenthost diff` shows them all, with the diff.
        lines.append(Text(f"{'files':>11} {change_list(files, limit=GUI_FILES)}", style="cyan"))
    progress = turn.get(PROGRESS_KEY)
    if progress:
        lines.append(Text(f"{'progress':>11} {progress}", style="dim italic"))
    return lines


def text_height(text: Text, width: int) -> int:
    """Lines `text` takes in a `Static` `width` cells wide (Textual's own wrapping)."""
    return Content.from_rich_text(text).get_height({}, max(1, width))
