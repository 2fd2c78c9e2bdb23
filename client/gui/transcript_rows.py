"""The transcript as rows (one per Turn, the fork divider, Load more, the empty note) and which
of them to mount: only the rows near the viewport are widgets, the rest are counted in lines so
the scroll bar, a jump and the newest-Turn follow behave as if every Turn were mounted. Pure:
no widget here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rich.text import Text

from client.gui.turn_text import text_height, turn_body, unknown_text
from client.session_client import ForkAction, divider_after, divider_text

DIVIDER_ID = "continued-divider"
LOAD_MORE_ID = "load-more"
EMPTY_ID = "no-turns"

MOUNT_ALL = 40
"""A transcript of up to this many rows is mounted whole (every frame lays out every mounted
widget, which is cheap for a few dozen)."""

OVERSCAN = 8
"""Lines mounted beyond each edge of the viewport, so a wheel step mostly lands on rows that
are already there; small, because what a jump (a scroll bar drag) costs is the rows it mounts."""

# Lines around a row's text, per kind (TurnView: header line + bottom margin; its border and
# padding take 3 columns; the `unknown` mark's Inspect button 13). Kept beside the CSS they
# mirror in `client.gui.transcript`; a mounted row is measured, so a drift costs only a shift.
TURN_CHROME_LINES = 2
TURN_CHROME_COLS = 3
UNKNOWN_BUTTON_COLS = 13
DIVIDER_CHROME_COLS = 2
LOAD_MORE_LINES = 3


class RowKind(Enum):
    TURN = "turn"
    DIVIDER = "divider"
    LOAD_MORE = "load_more"
    EMPTY = "empty"


@dataclass(frozen=True)
class Row:
    """One row: `key` is its widget's id; `state` what it shows (a change re-renders it)."""

    key: str
    kind: RowKind
    turn: Mapping[str, Any] | None = None
    action: ForkAction = ForkAction.HIDDEN
    blocked: str | None = None
    unknown: Mapping[str, Any] | None = None
    text: str = ""

    def same_look(self, other: Row) -> bool:
        return (
            self.kind is other.kind
            and (self.turn is other.turn or self.turn == other.turn)
            and self.action is other.action
            and self.blocked == other.blocked
            and self.unknown == other.unknown
            and self.text == other.text
        )


def turn_widget_id(turn_id: str) -> str:
    return f"turn-{turn_id}"


def build_rows(
    session: Mapping[str, Any],
    turns: Sequence[Mapping[str, Any]],
    *,
    action_for: Callable[[Mapping[str, Any]], ForkAction],
    unknown_for: Callable[[Mapping[str, Any]], Mapping[str, Any] | None],
    source_title: str | None,
    has_more: bool,
    blocked: str | None,
) -> list[Row]:
    """Every row of the transcript in order; the divider right after the boundary Turn."""
    rows: list[Row] = []
    boundary = divider_after(session, turns)
    for index, turn in enumerate(turns):
        rows.append(
            Row(
                turn_widget_id(str(turn["turnId"])),
                RowKind.TURN,
                turn=turn,
                action=action_for(turn),
                blocked=blocked,
                unknown=unknown_for(turn),
            )
        )
        if index == boundary:
            lineage = session.get("forkedFrom") or {}
            title = source_title or str(lineage.get("sourceAgentSessionId", "the source"))
            rows.append(Row(DIVIDER_ID, RowKind.DIVIDER, text=f"──── {divider_text(title)} ────"))
    if has_more:
        rows.append(Row(LOAD_MORE_ID, RowKind.LOAD_MORE))
    if not turns:
        rows.append(Row(EMPTY_ID, RowKind.EMPTY))
    return rows


def estimate_height(row: Row, width: int) -> int:
    """The lines `row` takes, margins included, in a transcript `width` cells wide."""
    if row.kind is RowKind.TURN and row.turn is not None:
        inner = width - TURN_CHROME_COLS
        lines = TURN_CHROME_LINES + text_height(turn_body(row.turn), inner)
        if row.unknown is not None:
            lines += text_height(unknown_text(row.unknown), inner - UNKNOWN_BUTTON_COLS)
        return lines
    if row.kind is RowKind.DIVIDER:
        return text_height(Text(row.text), width - DIVIDER_CHROME_COLS) + 1
    if row.kind is RowKind.LOAD_MORE:
        return LOAD_MORE_LINES
    return 1


def band(heights: Sequence[int], top: int, bottom: int) -> tuple[int, int]:
    """The rows `[lo, hi)` that overlap lines `[top, bottom)` (at least one row)."""
    y, lo, hi = 0, None, len(heights)
    for index, height in enumerate(heights):
        if lo is None and y + height > top:
            lo = index
        if y >= bottom:
            hi = index
            break
        y += height
    if lo is None:
        lo = max(0, len(heights) - 1)
    return lo, max(hi, min(lo + 1, len(heights)))
