"""The transcript of one session: a block per loaded Turn with its messages, its Fork
action and, when a fork through it is `unknown`, a mark with Inspect; in a fork
child the "continued from <source title>" divider right after the boundary
Turn (hidden while that Turn is not loaded, never moved to the end)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Button, Static

from client.gui.status_text import turn_glance, turn_state_words
from client.session_client import (
    ForkAction,
    divider_after,
    divider_text,
    format_interaction,
    turn_error_text,
)

DIVIDER_ID = "continued-divider"
LOAD_MORE_ID = "load-more"
EMPTY_ID = "no-turns"


def turn_widget_id(turn_id: str) -> str:
    return f"turn-{turn_id}"


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
    def __init__(self, session_id: str, turn_id: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.turn_id = turn_id


class LoadMoreRequested(Message):
    pass


def _turn_header(turn: Mapping[str, Any], can_fork: bool = False) -> Text:
    text = Text(f"Turn {turn['sequence']}", style="bold", no_wrap=True, overflow="ellipsis")
    text.append(f"  {turn_state_words(turn, can_fork)}", style="dim")
    glance = turn_glance(turn)
    if glance:
        failed = turn.get("outcome") == "failed"
        text.append(f"  {glance}", style="bold red" if failed else "yellow")
    # A short id, last: the first thing elided when the line is narrow (`show` prints it whole).
    text.append(f"  {str(turn['turnId'])[:8]}", style="dim italic")
    return text


def _message_line(message: Mapping[str, Any]) -> Text:
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

    DEFAULT_CSS = """
    TurnView { height: auto; padding: 0 1; margin-bottom: 1; border-left: tall $primary 30%; }
    TurnView > .turn-head { height: auto; }
    TurnView > .turn-body { height: auto; }
    TurnView .turn-header { width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }
    TurnView Button.fork { min-width: 12; margin: 0 1; }
    """

    def __init__(
        self,
        session_id: str,
        turn: Mapping[str, Any],
        action: ForkAction,
        blocked: str | None = None,
        unknown: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(id=turn_widget_id(str(turn["turnId"])))
        self.session_id = session_id
        self.turn = dict(turn)
        self.action = action
        self.blocked = blocked
        self.unknown = None if unknown is None else dict(unknown)

    @property
    def turn_id(self) -> str:
        return str(self.turn["turnId"])

    def compose(self) -> ComposeResult:
        with Horizontal(classes="turn-head"):
            yield Static(self._header(), classes="turn-header")
            if self.action is not ForkAction.HIDDEN:
                yield self._button()
        if self.unknown is not None:
            yield UnknownForkRow(self.turn_id, self.unknown)
        # One widget for the whole body (not one per line): a long transcript's every frame
        # lays out each widget, so fewer widgets is what keeps it smooth.
        yield Static(_body(self.turn), classes="turn-body line")

    def _header(self) -> Text:
        return _turn_header(self.turn, self.action is ForkAction.ENABLED)

    def _button(self) -> Button:
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
        if self.action is ForkAction.BLOCKED:
            return ("Fork", "default")
        return ("Fork", "primary")

    def _fork_tooltip(self) -> str | None:
        if self.action is ForkAction.BLOCKED:
            return f"Cannot fork now: {self.blocked or 'the session is busy'}"
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
                UnknownForkRow(self.turn_id, operation), after=self.query_one(".turn-head")
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
            self.query_one(".turn-body", Static).update(_body(self.turn))
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
        if action is ForkAction.HIDDEN:
            await self.query_one(f"#{fork_button_id(self.turn_id)}", Button).remove()
        elif was_hidden:
            await self.query_one(".turn-head", Horizontal).mount(self._button())
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


def _body(turn: Mapping[str, Any]) -> Text:
    return Text("\n").join(_body_lines(turn))


def _body_lines(turn: Mapping[str, Any]) -> list[Text]:
    lines = [_message_line(m) for m in turn.get("messages") or []]
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
    return lines


class Divider(Static):
    DEFAULT_CSS = """
    Divider { color: $accent; text-style: italic; margin: 0 1 1 1; }
    """


class TranscriptView(VerticalScroll):
    """Renders a session's loaded Turns; the app calls `show` on every change."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session_id: str | None = None
        self._busy = 0

    @property
    def idle(self) -> bool:
        """False while widgets are being reconciled (a half-updated transcript is visible)."""
        return self._busy == 0

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
            await self._show(
                session, turns, action_for, source_title, has_more, blocked, unknown_for
            )
        finally:
            self._busy -= 1

    async def _show(
        self,
        session: Mapping[str, Any],
        turns: Sequence[Mapping[str, Any]],
        action_for: Callable[[Mapping[str, Any]], ForkAction],
        source_title: str | None,
        has_more: bool,
        blocked: str | None,
        unknown_for: UnknownFor,
    ) -> None:
        async with self.lock:
            session_id = str(session["agentSessionId"])
            if session_id != self.session_id:
                await self.remove_children()
                self.session_id = session_id
            at_end = self.scroll_y >= self.max_scroll_y - 1
            existing = {str(w.id): w for w in self.children if w.id}
            desired: list[Widget] = []
            boundary = divider_after(session, turns)
            for index, turn in enumerate(turns):
                view = existing.get(turn_widget_id(str(turn["turnId"])))
                if isinstance(view, TurnView):
                    await view.update(turn, action_for(turn), blocked, unknown_for(turn))
                else:
                    view = TurnView(session_id, turn, action_for(turn), blocked, unknown_for(turn))
                desired.append(view)
                if index == boundary:
                    lineage = session.get("forkedFrom") or {}
                    title = source_title or str(lineage.get("sourceAgentSessionId", "the source"))
                    text = f"──── {divider_text(title)} ────"
                    divider = existing.get(DIVIDER_ID)
                    if isinstance(divider, Divider):
                        divider.update(text)
                    else:
                        divider = Divider(text, id=DIVIDER_ID)
                    desired.append(divider)
            if has_more:
                more = existing.get(LOAD_MORE_ID)
                desired.append(
                    more if more is not None else Button("Load more turns", id=LOAD_MORE_ID)
                )
            if not turns:
                empty = existing.get(EMPTY_ID)
                desired.append(
                    empty
                    if empty is not None
                    else Static(
                        Text("No turns yet — say something below.", style="dim"), id=EMPTY_ID
                    )
                )
            await self._arrange(desired)
        self.follow(at_end)

    def follow(self, at_end: bool) -> None:
        """Keep the newest Turn in view as it grows, unless the user scrolled up: scrolled once
        the new widgets are laid out (before that the end is where it was)."""
        if at_end:
            self.scroll_end(animate=False)
            self.call_after_refresh(self._follow_after, self.scroll_y)

    def _follow_after(self, was: float) -> None:
        # Not if the user scrolled up in between: their place wins over the newest Turn.
        if self.scroll_y >= was:
            self.scroll_end(animate=False)

    async def _arrange(self, desired: list[Widget]) -> None:
        if len(self.children) == len(desired) and all(
            a is b for a, b in zip(self.children, desired, strict=True)
        ):
            return  # the usual update (a streamed piece, a settled Turn): nothing moves
        keep = set(map(id, desired))
        stale = [w for w in self.children if id(w) not in keep]
        if stale:
            await self.remove_children(stale)
        current = list(self.children)
        present = set(map(id, current))
        index = 0
        while index < len(desired):
            widget = desired[index]
            if id(widget) not in present:
                # A run of new widgets (a page of Turns, a session just opened) is mounted in
                # one call: one layout for the run instead of one per Turn.
                end = index
                while end < len(desired) and id(desired[end]) not in present:
                    end += 1
                batch = desired[index:end]
                if index < len(current):
                    await self.mount_all(batch, before=current[index])
                else:
                    await self.mount_all(batch)
                present.update(map(id, batch))
                index = end
            else:
                if index < len(current) and current[index] is widget:
                    index += 1
                    continue
                if index < len(current):
                    self.move_child(widget, before=current[index])
                else:
                    self.move_child(widget, after=current[-1])
                index += 1
            current = list(self.children)  # re-read only after a change: O(n), not O(n²)

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
                for view in list(self.query(TurnView)):  # in place: the scroll stays
                    await view.set_action(action_for(view.turn), blocked)
                    await view.set_unknown(unknown_for(view.turn))
        finally:
            self._busy -= 1

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == LOAD_MORE_ID:
            event.stop()
            self.post_message(LoadMoreRequested())
