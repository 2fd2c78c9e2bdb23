"""The transcript of one session: a block per loaded Turn with its messages, its Fork
action and, when a fork through it is `unknown`, a mark with Inspect; in a fork child the
"continued from <source title>" divider right after the boundary Turn (hidden while that Turn is
not loaded, never moved to the end). Only the rows near the viewport are mounted."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.selection import Selection
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.timer import Timer
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual.widgets import Button, Static

from client.gui.transcript_rows import (
    DIVIDER_ID,
    EMPTY_ID,
    LOAD_MORE_ID,
    MOUNT_ALL,
    OVERSCAN,
    Row,
    RowKind,
    band,
    build_rows,
    estimate_height,
    turn_widget_id,
)
from client.gui.turn_text import turn_body, turn_header, unknown_text
from client.session_client import ForkAction

__all__ = [
    "DIVIDER_ID",
    "EMPTY_ID",
    "LOAD_MORE_ID",
    "Divider",
    "ForkRequested",
    "InspectRequested",
    "LoadMoreRequested",
    "SettledTurnView",
    "TranscriptGap",
    "TranscriptView",
    "TurnView",
    "UnknownForkRow",
    "fork_button_id",
    "inspect_button_id",
    "turn_widget_id",
    "unknown_row_id",
]

FOLLOW_REHAND_S = 0.5
"""How often a pending follow's after-refresh step is handed again (`TranscriptView.follow`)."""

UNRESOLVED_TIP = "A fork through this turn ended unknown: Inspect it first (adopt or abandon)"

ABOVE_ID = "transcript-above"
BELOW_ID = "transcript-below"


def fork_button_id(turn_id: str) -> str:
    return f"fork-{turn_id}"


def inspect_button_id(turn_id: str) -> str:
    return f"inspect-{turn_id}"


def unknown_row_id(turn_id: str) -> str:
    return f"unknown-{turn_id}"


UnknownFor = Callable[[Mapping[str, Any]], "Mapping[str, Any] | None"]
"""The `unknown` fork operation whose boundary is this Turn, or None."""


def _no_unknown(_: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return None


class InspectRequested(Message):
    """Inspect / Adopt / Abandon the `unknown` fork operation marked on a Turn."""

    def __init__(self, session_id: str, turn_id: str, operation: Mapping[str, Any]) -> None:
        super().__init__()
        self.session_id = session_id
        self.turn_id = turn_id
        self.operation = dict(operation)


class ForkRequested(Message):
    def __init__(self, session_id: str, turn_id: str, workspace: str = "shared") -> None:
        super().__init__()
        self.session_id = session_id
        self.turn_id = turn_id
        # `shared` (the same folder) or `worktree` (a new worktree of the Turn's files).
        self.workspace = workspace


class LoadMoreRequested(Message):
    pass


class UnknownForkRow(Horizontal):
    """Shown on a Turn while a fork through it is `unknown`: the mark and an Inspect button
    that opens Inspect / Adopt / Abandon."""

    DEFAULT_CSS = """
    UnknownForkRow { height: auto; background: $warning 12%; }
    UnknownForkRow > Static { width: 1fr; }
    UnknownForkRow > Button { min-width: 11; margin: 0 1; }
    """

    def __init__(self, turn_id: str, operation: Mapping[str, Any]) -> None:
        super().__init__(id=unknown_row_id(turn_id), classes="unknown-fork")
        self.turn_id = turn_id
        self.operation = dict(operation)

    def compose(self) -> ComposeResult:
        yield Static(unknown_text(self.operation), classes="unknown-text")
        button = Button("Inspect", "warning", id=inspect_button_id(self.turn_id), compact=True)
        button.tooltip = "Inspect the evidence, then Adopt the provider child or Abandon the fork"
        yield button

    def set_operation(self, operation: Mapping[str, Any]) -> None:
        if dict(operation) != self.operation:
            self.operation = dict(operation)
            self.query_one(".unknown-text", Static).update(unknown_text(self.operation))


class TurnView(Vertical):
    """One Turn; its Fork button exists only when the action is not HIDDEN.

    Updated in place (header, messages, button state) so a live event never re-mounts the
    button a user is about to click.
    """

    # The Fork button sits on the header line without a row container: on a layer of its own,
    # docked right (a dock shrinks only its own layer's region, so the body keeps the full
    # width), with the header leaving its columns free. Each widget a Turn has is paid again
    # whenever a scroll mounts it (its styles, compose and first layout).
    DEFAULT_CSS = """
    TurnView {
        height: auto; padding: 0 1; margin-bottom: 1; border-left: tall $primary 30%;
        layers: turn fork;
    }
    TurnView > .turn-body { height: auto; }
    TurnView > .turn-header { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    TurnView.-fork > .turn-header { margin-right: 14; }
    TurnView > Button.fork { layer: fork; dock: right; min-width: 12; margin: 0 1; }
    """

    def __init__(
        self,
        session_id: str,
        turn: Mapping[str, Any],
        action: ForkAction,
        blocked: str | None = None,
        unknown: Mapping[str, Any] | None = None,
    ) -> None:
        # Classes given here, not set later: a class change restyles the widget at once.
        fork = "-fork" if action is not ForkAction.HIDDEN else None
        super().__init__(id=turn_widget_id(str(turn["turnId"])), classes=fork)
        self.session_id = session_id
        self.turn = dict(turn)
        self.action = action
        self.blocked = blocked
        self.unknown = None if unknown is None else dict(unknown)

    @property
    def turn_id(self) -> str:
        return str(self.turn["turnId"])

    def compose(self) -> ComposeResult:
        yield Static(self._header(), classes="turn-header")
        if self.action is not ForkAction.HIDDEN:
            yield self._button()
        if self.unknown is not None:
            yield UnknownForkRow(self.turn_id, self.unknown)
        # One widget for the whole body (not one per line): a long transcript's every frame
        # lays out each widget, so fewer widgets is what keeps it smooth.
        yield Static(turn_body(self.turn), classes="turn-body line")

    def _header(self) -> Text:
        return turn_header(self.turn, self.action is ForkAction.ENABLED)

    def _button(self) -> Button:
        # Made outside the app's context: a Button sets its variant's and style's classes as it
        # is made, and in the app's context each class change restyles it at once (a Button
        # was most of what mounting a Turn cost); its styles are applied once, when mounted.
        return contextvars.Context().run(self._new_button)

    def _new_button(self) -> Button:
        label, variant = self._label()
        button = Button(
            label,
            variant,  # type: ignore[arg-type]
            id=fork_button_id(self.turn_id),
            classes="fork",
            compact=True,  # one line, no border: it sits on the Turn's header line
            disabled=self.action is not ForkAction.ENABLED,
        )
        # Not in the Tab order (Tab goes from the list to the message box); the keyboard
        # forks with F5, which names the Turn and asks first.
        button.can_focus = False
        button.tooltip = self._fork_tooltip()
        return button

    def _label(self) -> tuple[str, str]:
        if self.action is ForkAction.DISABLED:
            return ("Forking…", "default")
        if self.action in (ForkAction.BLOCKED, ForkAction.UNRESOLVED):
            return ("Fork", "default")
        return ("Fork", "primary")

    def _fork_tooltip(self) -> str | None:
        if self.action is ForkAction.BLOCKED:
            return f"Cannot fork now: {self.blocked or 'the session is busy'}"
        if self.action is ForkAction.UNRESOLVED:
            return UNRESOLVED_TIP
        if self.action is ForkAction.DISABLED:
            return "A fork through this turn is in progress"
        return "Fork a new session through this turn"

    async def set_unknown(self, operation: Mapping[str, Any] | None) -> None:
        """Show, update or remove the `unknown` fork mark (in place)."""
        found = self.query(f"#{unknown_row_id(self.turn_id)}")
        row = found.first(UnknownForkRow) if found else None
        self.unknown = None if operation is None else dict(operation)
        if operation is None:
            if row is not None:
                await row.remove()
        elif row is not None:
            row.set_operation(operation)
        else:
            await self.mount(
                UnknownForkRow(self.turn_id, operation), after=self.query_one(".turn-header")
            )

    async def update(
        self,
        turn: Mapping[str, Any],
        action: ForkAction,
        blocked: str | None = None,
        unknown: Mapping[str, Any] | None = None,
    ) -> None:
        """Bring the view to this Turn and action, touching only what changed."""
        if dict(turn) != self.turn:
            self.turn = dict(turn)
            self.query_one(".turn-header", Static).update(self._header())
            self.query_one(".turn-body", Static).update(turn_body(self.turn))
        await self.set_action(action, blocked)
        await self.set_unknown(unknown)

    async def set_action(self, action: ForkAction, blocked: str | None = None) -> None:
        if action is self.action and blocked == self.blocked:
            return
        self.blocked = blocked
        was_hidden, self.action = self.action is ForkAction.HIDDEN, action
        self.query_one(".turn-header", Static).update(self._header())
        if was_hidden and action is ForkAction.HIDDEN:
            return  # only the reason changed, and no button shows it
        self.set_class(action is not ForkAction.HIDDEN, "-fork")
        if action is ForkAction.HIDDEN:
            await self.query_one(f"#{fork_button_id(self.turn_id)}", Button).remove()
        elif was_hidden:
            await self.mount(self._button(), after=self.query_one(".turn-header"))
        else:
            button = self.query_one(f"#{fork_button_id(self.turn_id)}", Button)
            button.disabled = action is not ForkAction.ENABLED
            label, variant = self._label()
            button.label = label
            button.variant = variant
            button.tooltip = self._fork_tooltip()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == fork_button_id(self.turn_id):
            self.post_message(ForkRequested(self.session_id, self.turn_id))
        elif event.button.id == inspect_button_id(self.turn_id) and self.unknown is not None:
            self.post_message(InspectRequested(self.session_id, self.turn_id, self.unknown))


FORK_LABEL_WIDTH = 12
"""The Fork label's cells (a compact `Button` of min-width 12); with its margin 0 1, the 14
columns a Turn's header leaves free for it."""
FORK_COLS = FORK_LABEL_WIDTH + 2


class SettledTurnView(Widget):
    """A settled Turn drawn with Textual's line API: one widget, no children. Its header line
    (the Fork label at its right end, where `TurnView`'s docked button sits) and its body are
    rendered once per width into `Strip`s that `render_line` returns, so mounting it costs one
    widget's styles and layout (a `TurnView` is four widgets), and a frame draws only the lines
    on screen. It looks exactly like a `TurnView` of the same Turn; a click on the label forks,
    as the button does (not in the Tab order either: the keyboard forks with F5). Its text is
    selectable with the mouse like a `Static`'s: each line's cells carry their offset (what
    Textual maps a mouse position to), `get_selection` gives the text under a selection, and
    `render_line` paints the selected span (the Fork label is not part of the text).

    Used for a settled Turn without an `unknown` fork mark (which has an Inspect button); a
    Turn that settles while mounted keeps its `TurnView`.
    """

    # The label's colours mirror a compact `Button`'s CSS: primary when usable, default and
    # dimmed (text-opacity 0.6) when disabled.
    DEFAULT_CSS = """
    SettledTurnView {
        height: auto; padding: 0 1; margin-bottom: 1; border-left: tall $primary 30%;
    }
    SettledTurnView > .settled-turn--fork {
        text-style: bold; color: $button-color-foreground; background: $primary;
    }
    SettledTurnView > .settled-turn--fork-hover {
        text-style: bold; color: $button-color-foreground; background: $primary-darken-2;
    }
    SettledTurnView > .settled-turn--fork-off {
        text-style: bold; color: $button-foreground 60%; background: $surface;
    }
    SettledTurnView > .settled-turn--fork-off-hover {
        text-style: bold; color: $button-foreground 60%; background: $surface-darken-1;
    }
    """
    COMPONENT_CLASSES = {
        "settled-turn--fork",
        "settled-turn--fork-hover",
        "settled-turn--fork-off",
        "settled-turn--fork-off-hover",
    }

    def __init__(
        self,
        session_id: str,
        turn: Mapping[str, Any],
        action: ForkAction,
        blocked: str | None = None,
    ) -> None:
        super().__init__(id=turn_widget_id(str(turn["turnId"])))
        self.session_id = session_id
        self.turn = dict(turn)
        self.action = action
        self.blocked = blocked
        self.unknown: Mapping[str, Any] | None = None
        self._hover = False
        # The lines at one width, and their text (a header line's without the Fork label).
        self._strips: tuple[int, list[Strip], list[str]] | None = None

    @property
    def turn_id(self) -> str:
        return str(self.turn["turnId"])

    @property
    def fork_label(self) -> str | None:
        """What the Fork label says, None when the Turn has no Fork action."""
        if self.action is ForkAction.HIDDEN:
            return None
        return "Forking…" if self.action is ForkAction.DISABLED else "Fork"

    @property
    def fork_disabled(self) -> bool:
        return self.action is not ForkAction.ENABLED

    def lines(self, width: int | None = None) -> list[Strip]:
        """What the Turn draws inside its border and padding, a `Strip` per line: at its own
        width, or at `width` (drawn aside, its cached lines kept)."""
        if width is None:
            return self._lines(self.size.width or 1)
        kept = self._strips
        try:
            self._strips = None
            return self._lines(width)
        finally:
            self._strips = kept

    def texts(self) -> list[str]:
        """The text of each line at the Turn's width (what a selection selects from)."""
        self._lines(self.size.width or 1)
        return self._strips[2] if self._strips is not None else []

    def _lines(self, width: int) -> list[Strip]:
        if self._strips is not None and self._strips[0] == width:
            return self._strips[1]
        style = self.visual_style
        fork = self._fork_strip()
        head_width = max(1, width - fork.cell_length)
        header = turn_header(self.turn, self.action is ForkAction.ENABLED)
        header.truncate(head_width, overflow="ellipsis")
        head = Visual.to_strips(
            self, visualize(self, Content.from_rich_text(header)), head_width, 1, style
        )[0]
        head = head.extend_cell_length(head_width, self.rich_style).crop(0, head_width)
        body = Visual.to_strips(
            self, visualize(self, Content.from_rich_text(turn_body(self.turn))), width, None, style
        )
        body = [strip.extend_cell_length(width, self.rich_style) for strip in body]
        lines = [
            Strip.join([head.apply_offsets(0, 0), fork]),
            *(strip.apply_offsets(0, y) for y, strip in enumerate(body, 1)),
        ]
        texts = [strip.text.rstrip() for strip in (head, *body)]
        self._strips = (width, lines, texts)
        return lines

    def _fork_strip(self) -> Strip:
        label = self.fork_label
        if label is None:
            return Strip([])
        part = "settled-turn--fork-off" if self.fork_disabled else "settled-turn--fork"
        if self._hover:
            part += "-hover"
        base = self.rich_style
        return Strip(
            [
                Segment(" ", base),
                Segment(label.center(FORK_LABEL_WIDTH), self.get_component_rich_style(part)),
                Segment(" ", base),
            ]
        )

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width))

    def render_line(self, y: int) -> Strip:
        lines = self.lines()
        if y >= len(lines):
            return Strip.blank(self.size.width, self.rich_style)
        selection = self.text_selection
        span = selection.get_span(y) if selection is not None else None
        if span is None:
            return lines[y]
        text = self.texts()[y]
        start, end = span
        end = len(text) if end == -1 else min(end, len(text))
        if start >= end:
            return lines[y]
        selected = VisualStyle.from_styles(self.screen.get_component_styles("screen--selection"))
        return _painted(
            lines[y], cell_len(text[:start]), cell_len(text[:end]), selected, self.rich_style
        )

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The text under `selection`: the Turn's lines as drawn (wrapped at its width)."""
        return selection.extract("\n".join(self.texts())), "\n"

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = None  # a new theme or a hover restyle: the cached colours are stale

    def _redraw(self, *, layout: bool = False) -> None:
        self._strips = None
        self.refresh(layout=layout)

    def _on_label(self, event: events.MouseEvent) -> bool:
        offset = event.get_content_offset(self)
        if offset is None or offset.y != 0 or self.fork_label is None:
            return False
        width = self.size.width
        return width - FORK_COLS + 1 <= offset.x < width - 1

    def on_mouse_move(self, event: events.MouseMove) -> None:
        hover = self._on_label(event)
        if hover != self._hover:
            self._hover = hover
            self.tooltip = self.fork_tooltip if hover else None
            self._redraw()

    def on_leave(self, _: events.Leave) -> None:
        if self._hover:
            self._hover = False
            self.tooltip = None
            self._redraw()

    def on_click(self, event: events.Click) -> None:
        if self._on_label(event):
            event.stop()
            if self.action is ForkAction.ENABLED:
                self.post_message(ForkRequested(self.session_id, self.turn_id))

    @property
    def fork_tooltip(self) -> str:
        """What hovering the Fork label says (the Button's tooltip)."""
        if self.action is ForkAction.BLOCKED:
            return f"Cannot fork now: {self.blocked or 'the session is busy'}"
        if self.action is ForkAction.UNRESOLVED:
            return UNRESOLVED_TIP
        if self.action is ForkAction.DISABLED:
            return "A fork through this turn is in progress"
        return "Fork a new session through this turn"

    async def update(
        self,
        turn: Mapping[str, Any],
        action: ForkAction,
        blocked: str | None = None,
        unknown: Mapping[str, Any] | None = None,
    ) -> None:
        """Bring the view to this Turn and action (the transcript replaces it with a `TurnView`
        for an `unknown` mark, which needs its Inspect button)."""
        changed = dict(turn) != self.turn
        if changed or action is not self.action or blocked != self.blocked:
            self.turn, self.action, self.blocked = dict(turn), action, blocked
            if self._hover:
                self.tooltip = self.fork_tooltip
            self._redraw(layout=changed)


def _painted(strip: Strip, start: int, end: int, selected: VisualStyle, base: Style) -> Strip:
    """`strip` with its cells `start` to `end` (a selected span) painted as Textual paints a
    selection in a `Static`: the selection's colours blended over each cell's own (its
    foreground is usually transparent: the text keeps its colour), the cells' offsets kept."""
    before, inside, after = strip.divide([start, end, strip.cell_length])
    segments = []
    for text, own, control in inside:
        own = own or base
        background = Color.from_rich_color(own.bgcolor or base.bgcolor)
        foreground = Color.from_rich_color(own.color or base.color)
        if selected.background is not None:
            background = background + selected.background
        if selected.foreground is not None:
            foreground = foreground + selected.foreground
        paint = Style(color=foreground.rich_color, bgcolor=background.rich_color)
        segments.append(Segment(text, own + paint, control))
    return Strip.join([before, Strip(segments, inside.cell_length), after])


class Divider(Static):
    DEFAULT_CSS = """
    Divider { color: $accent; text-style: italic; margin: 0 1 1 1; }
    """


class TranscriptGap(Widget):
    """Stands in for the rows above or below the mounted ones: exactly the lines they take, so
    the scroll bar and every position are those of the whole transcript."""

    DEFAULT_CSS = """
    TranscriptGap { height: 0; }
    """


class TranscriptView(VerticalScroll):
    """Renders a session's loaded Turns; the app calls `show` on every change.

    Only the rows near the viewport are mounted (`client.gui.transcript_rows`): every frame lays
    out every mounted widget, so a streamed piece or a scroll step costs what is on screen, not
    what is loaded. A streamed piece updates only its own Turn's widget; a scroll that nears the
    edge of the mounted rows mounts the next ones and unmounts those far away.
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session_id: str | None = None
        self._busy = 0
        self._rows: list[Row] = []
        # Lines each row takes (margins included) at a width, for the rows not mounted: measured
        # when it was last mounted, else estimated; forgotten when the row's look changes.
        self._heights: dict[str, tuple[int, int]] = {}
        self._window = (0, 0)  # the mounted rows, [lo, hi)
        self._gaps = (0, 0)  # lines above and below them
        self._rewindow_queued = False
        # A jump (the viewport lands beyond the mounted rows) mounts only the rows on screen;
        # their margins follow on the next frame, so the jump's own frame pays for fewer Turns.
        self._jumped = False
        self._margins_pending = False
        self._sized = Size(0, 0)
        # Follows made, and the newest whose after-refresh step ran (`follow`).
        self._follows = 0
        self._followed = 0
        self._follow_from = 0.0
        self._follow_timer: Timer | None = None

    @property
    def idle(self) -> bool:
        """False while widgets are being reconciled (a half-updated transcript is visible) or a
        follow to the newest Turn is not yet laid out (the view is still moving to the end)."""
        return (
            self._busy == 0
            and not self._rewindow_queued
            and not self._margins_pending
            and self._follow_pending == 0
        )

    @property
    def turn_count(self) -> int:
        """The loaded Turns the transcript shows (mounted or counted in a gap)."""
        return sum(1 for row in self._rows if row.kind is RowKind.TURN)

    @property
    def window(self) -> tuple[int, int]:
        """The mounted rows `[lo, hi)` of `turn_count` Turns and the other rows."""
        return self._window

    async def show(
        self,
        session: Mapping[str, Any],
        turns: Sequence[Mapping[str, Any]],
        *,
        action_for: Callable[[Mapping[str, Any]], ForkAction],
        source_title: str | None,
        has_more: bool,
        blocked: str | None = None,
        unknown_for: UnknownFor = _no_unknown,
    ) -> None:
        """Reconcile the children with this state, reusing every widget that stays."""
        self._busy += 1
        try:
            async with self.lock:
                session_id = str(session["agentSessionId"])
                if session_id != self.session_id:
                    await self._reset()
                    self.session_id = session_id
                at_end = self._following()
                rows = build_rows(
                    session,
                    turns,
                    action_for=action_for,
                    unknown_for=unknown_for,
                    source_title=source_title,
                    has_more=has_more,
                    blocked=blocked,
                )
                await self._place(rows, at_end)
            self.follow(at_end)
        finally:
            self._busy -= 1

    async def set_actions(
        self,
        action_for: Callable[[Mapping[str, Any]], ForkAction],
        blocked: str | None = None,
        unknown_for: UnknownFor = _no_unknown,
    ) -> None:
        """Update every Turn's Fork action and `unknown` fork mark in place."""
        self._busy += 1
        try:
            async with self.lock:
                rows = [
                    replace(
                        row,
                        action=action_for(row.turn),
                        blocked=blocked,
                        unknown=unknown_for(row.turn),
                    )
                    if row.turn is not None
                    else row
                    for row in self._rows
                ]
                await self._place(rows, at_end=False)
        finally:
            self._busy -= 1

    async def clear(self) -> None:
        """Show nothing (the open session is gone)."""
        async with self.lock:
            await self._reset()

    async def _reset(self) -> None:
        await self.remove_children()
        self.session_id = None
        self._rows, self._window, self._gaps = [], (0, 0), (0, 0)
        self._heights.clear()
        self._jumped = False

    def follow(self, at_end: bool) -> None:
        """Keep the newest Turn in view as it grows, unless the user scrolled up: scrolled once
        the new widgets are laid out (before that the end is where it was).

        Follows are numbered; one is pending until an after-refresh step of its number (or a
        later one) ran. Textual hands an after-refresh callback to the screen on top when it is
        handled, and a screen dismissed before it refreshes drops it: a follow made while the
        resolve dialog was closing stayed pending for good (the transcript never idle again,
        and every later update pulled a user who had scrolled up back to the end). So while a
        follow is pending, its step is handed again every `FOLLOW_REHAND_S` (one timer at a
        time); a step that comes twice runs once."""
        if at_end:
            self._follows += 1
            self.scroll_end(animate=False)
            self._follow_from = self.scroll_y
            self.call_after_refresh(self._follow_after, self._follows, self._follow_from)
            if self._follow_timer is None:
                self._follow_timer = self.set_timer(FOLLOW_REHAND_S, self._rehand_follow)

    def _follow_after(self, number: int, was: float) -> None:
        if number <= self._followed:
            return  # a later follow's step ran already, or this one was handed twice
        self._followed = number
        # Not if the user scrolled up in between: their place wins over the newest Turn.
        if self.scroll_y >= was:
            self.scroll_end(animate=False)

    def _rehand_follow(self) -> None:
        self._follow_timer = None
        if self._followed < self._follows:
            self.call_after_refresh(self._follow_after, self._follows, self._follow_from)
            self._follow_timer = self.set_timer(FOLLOW_REHAND_S, self._rehand_follow)

    @property
    def _follow_pending(self) -> int:
        """Follows made whose after-refresh step has not run yet."""
        return self._follows - self._followed

    def _following(self) -> bool:
        """At the end, or on the way there (a follow not yet laid out): an update that comes
        meanwhile follows too, instead of keeping the place the follow is leaving."""
        return self._follow_pending > 0 or self.scroll_y >= self.max_scroll_y - 1

    # -- which rows are mounted ------------------------------------------------------------

    def _row_width(self) -> int:
        """The width a row is laid out at (a windowed transcript always shows its scroll bar)."""
        width = self.size.width - self.styles.gutter.width
        if len(self._rows) > MOUNT_ALL or self.show_vertical_scrollbar:
            width -= self.styles.scrollbar_size_vertical
        return max(1, width)

    def _height(self, row: Row, width: int, widget: Widget | None) -> int:
        """Lines `row` takes: its widget's own when it is mounted and laid out, else the last
        measured (at this width, with this look), else an estimate."""
        if widget is not None and widget.size.height and not widget._layout_required:  # noqa: SLF001
            margin = widget.styles.margin
            if widget.outer_size.width + margin.width == width:
                lines = widget.outer_size.height + margin.top + margin.bottom
                self._heights[row.key] = (width, lines)
                return lines
        known = self._heights.get(row.key)
        if known is not None and known[0] == width:
            return known[1]
        lines = estimate_height(row, width)
        self._heights[row.key] = (width, lines)
        return lines

    def _band_for(
        self, heights: list[int], at_end: bool, overscan: int = OVERSCAN
    ) -> tuple[int, int]:
        if len(heights) <= MOUNT_ALL:
            return 0, len(heights)
        view = self.scrollable_content_region.height or self.app.size.height
        if at_end:
            total = sum(heights)
            return band(heights, total - view - overscan, total + 1)
        y = round(self.scroll_y)
        return band(heights, y - overscan, y + view + overscan)

    async def _place(self, rows: list[Row], at_end: bool, overscan: int = OVERSCAN) -> None:
        """Mount the rows near the viewport (all of a short transcript), update those already
        mounted, and size the gaps for the rest."""
        before = {row.key: row for row in self._rows}
        changed = set()
        for row in rows:
            old = before.get(row.key)
            if old is None or not old.same_look(row):
                changed.add(row.key)
                self._heights.pop(row.key, None)
        self._rows = rows
        mounted = {str(w.id): w for w in self.children if w.id}
        width = self._row_width()
        heights = [
            self._height(row, width, None if row.key in changed else mounted.get(row.key))
            for row in rows
        ]
        # Rows about to be unmounted keep their measured height (read above, before they go).
        lo, hi = self._band_for(heights, at_end, overscan)
        above, below = sum(heights[:lo]), sum(heights[hi:])
        y = self.scroll_y
        desired: list[Widget] = []
        if lo > 0:
            desired.append(self._gap(mounted, ABOVE_ID, above))
        for row in rows[lo:hi]:
            widget = mounted.get(row.key)
            if isinstance(widget, SettledTurnView) and not _line_drawn(row):
                # Its `unknown` mark needs an Inspect button: made again as a `TurnView` (the
                # old one goes first, as the new one takes its id).
                await widget.remove()
                widget = None
            if widget is None:
                widget = _make_row_widget(self.session_id or "", row)
            elif row.key in changed:
                await _update_row_widget(widget, row)
            desired.append(widget)
        if hi < len(rows):
            desired.append(self._gap(mounted, BELOW_ID, below))
        self._window, self._gaps = (lo, hi), (above, below)
        if await self._arrange(desired):
            # While new rows are laid out the transcript can be shorter for a frame, which pulls
            # the scroll back; the gaps take exactly the lines of the rows they replace, so
            # putting it back shows the same place (or the end, when following it).
            if at_end:
                self.follow(True)
            else:
                self._keep_place(y)

    def _keep_place(self, y: float) -> None:
        target = self.scroll_target_y

        def back() -> None:
            # Only a scroll the layout moved: one the user made since has a new target.
            if self.scroll_target_y == target and round(self.scroll_y) != round(y):
                self.scroll_to(y=y, animate=False, immediate=True)

        back()
        self.call_after_refresh(back)

    def _gap(self, mounted: dict[str, Widget], gap_id: str, lines: int) -> Widget:
        gap = mounted.get(gap_id)
        if not isinstance(gap, TranscriptGap):
            gap = TranscriptGap(id=gap_id)
        if gap.styles.height is None or gap.styles.height.value != lines:
            gap.styles.height = lines
        return gap

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        lo, hi = self._window
        if self._rewindow_queued or self._margins_pending or (lo == 0 and hi == len(self._rows)):
            return
        view = self.scrollable_content_region.height
        slack = OVERSCAN // 2
        above, below = self._gaps
        if new_value + view <= above or new_value >= self.virtual_size.height - below:
            # Nothing on screen is mounted: a jump (a scroll bar drag, a page jump).
            self._jumped = True
        if (lo > 0 and new_value - slack < above) or (
            hi < len(self._rows) and new_value + view + slack > self.virtual_size.height - below
        ):
            # Near the edge of the mounted rows: mount the next ones before they are on screen.
            self._rewindow_queued = True
            self.call_later(self._rewindow)

    def on_resize(self, event: events.Resize) -> None:
        # Only a new size of the pane (not of its content, which grows as a reply streams)
        # changes the rows' heights and how many of them are on screen.
        if event.size == self._sized:
            return
        self._sized = event.size
        if self._rows and not self._rewindow_queued:
            self._rewindow_queued = True
            self.call_later(self._rewindow)

    async def _rewindow(self) -> None:
        self._busy += 1
        try:
            self._rewindow_queued = False
            jump, self._jumped = self._jumped, False
            async with self.lock:
                at_end = self.max_scroll_y > 0 and self._following()
                jump = jump and not at_end
                await self._place(list(self._rows), at_end, 0 if jump else OVERSCAN)
            if jump:
                self._margins_pending = True
                self.call_after_refresh(self._mount_margins)
        finally:
            self._busy -= 1

    def _mount_margins(self) -> None:
        """After a jump's frame: mount the rows either side of the viewport."""
        self._margins_pending = False
        if not self._rewindow_queued:
            self._rewindow_queued = True
            self.call_later(self._rewindow)

    async def _arrange(self, desired: list[Widget]) -> bool:
        """Make the children `desired`, in order; whether anything changed. Every mount and
        removal is issued before any is awaited (one layout for the whole change, not one per
        step), new widgets before stale ones go, so the transcript never shrinks under the
        scroll."""
        if len(self.children) == len(desired) and all(
            a is b for a, b in zip(self.children, desired, strict=True)
        ):
            return False  # the usual update (a streamed piece, a settled Turn): nothing moves
        if self._closing or self._pruning:
            return False  # the app is closing: Textual mounts nothing now, so nothing to place
        pending: list[Awaitable[Any]] = []
        present = set(map(id, self.children))
        index = 0
        while index < len(desired):
            if id(desired[index]) in present:
                index += 1
                continue
            # A run of new widgets (a page of Turns, a session just opened, the rows a scroll
            # reaches) is mounted in one call.
            end = index
            while end < len(desired) and id(desired[end]) not in present:
                end += 1
            batch = desired[index:end]
            if index > 0:
                pending.append(self.mount_all(batch, after=desired[index - 1]))
            elif end < len(desired):
                pending.append(self.mount_all(batch, before=desired[end]))
            elif self.children:
                pending.append(self.mount_all(batch, before=self.children[0]))
            else:
                pending.append(self.mount_all(batch))
            present.update(map(id, batch))
            index = end
        keep = set(map(id, desired))
        stale = [w for w in self.children if id(w) not in keep]
        if stale:
            pending.append(self.remove_children(stale))
        current = [w for w in self.children if id(w) in keep]
        for index, widget in enumerate(desired):
            if current[index] is not widget:  # a row that moved (rare): put it in its place
                self.move_child(widget, before=current[index])
                current = [w for w in self.children if id(w) in keep]
        for step in pending:
            await step
        return True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == LOAD_MORE_ID:
            event.stop()
            self.post_message(LoadMoreRequested())


def _line_drawn(row: Row) -> bool:
    """A settled Turn without an `unknown` mark: drawn by one `SettledTurnView`."""
    return row.turn is not None and row.turn.get("phase") == "settled" and row.unknown is None


def _make_row_widget(session_id: str, row: Row) -> Widget:
    if row.kind is RowKind.TURN and row.turn is not None:
        if _line_drawn(row):
            return SettledTurnView(session_id, row.turn, row.action, row.blocked)
        return TurnView(session_id, row.turn, row.action, row.blocked, row.unknown)
    if row.kind is RowKind.DIVIDER:
        return Divider(row.text, id=DIVIDER_ID)
    if row.kind is RowKind.LOAD_MORE:
        return Button("Load more turns", id=LOAD_MORE_ID)
    return Static(Text("No turns yet — say something below.", style="dim"), id=EMPTY_ID)


async def _update_row_widget(widget: Widget, row: Row) -> None:
    if isinstance(widget, (TurnView, SettledTurnView)) and row.turn is not None:
        await widget.update(row.turn, row.action, row.blocked, row.unknown)
    elif isinstance(widget, Divider):
        widget.update(row.text)
