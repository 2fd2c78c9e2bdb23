"""The transcript of one session: a block per loaded Turn with its messages and its Fork
action, and in a fork child the "continued from <source title>" divider right after the boundary
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

from agenthost.session_client import (
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


class ForkRequested(Message):
    def __init__(self, session_id: str, turn_id: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.turn_id = turn_id


class LoadMoreRequested(Message):
    pass


def _turn_header(turn: Mapping[str, Any]) -> Text:
    text = Text(f"Turn {turn['sequence']}", style="bold")
    state = str(turn["phase"]) + (f"/{turn['outcome']}" if turn.get("outcome") else "")
    text.append(f"  {state}  binding {turn['providerForkBindingState']}", style="dim")
    # A short id: the full one does not fit at 80 columns (`agenthost show` prints it).
    text.append(f"  {str(turn['turnId'])[:8]}", style="dim italic")
    return text


def _message_line(message: Mapping[str, Any]) -> Text:
    kind = str(message.get("kind") or "")
    style = {"user": "bold cyan", "assistant": "green"}.get(kind, "yellow")
    line = Text(f"{kind:>11} ", style=style)
    line.append(str(message.get("text") or ""))
    return line


class TurnView(Vertical):
    """One Turn; its Fork button exists only when the action is not HIDDEN.

    Updated in place (header, messages, button state) so a live event never re-mounts the
    button a user is about to click.
    """

    DEFAULT_CSS = """
    TurnView { height: auto; padding: 0 1; margin-bottom: 1; border-left: tall $primary 30%; }
    TurnView > .turn-head { height: auto; }
    TurnView > .turn-body { height: auto; }
    TurnView .turn-header { width: 1fr; }
    TurnView Button.fork { min-width: 12; margin: 0 1; }
    """

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

    @property
    def turn_id(self) -> str:
        return str(self.turn["turnId"])

    def compose(self) -> ComposeResult:
        with Horizontal(classes="turn-head"):
            yield Static(_turn_header(self.turn), classes="turn-header")
            if self.action is not ForkAction.HIDDEN:
                yield self._button()
        with Vertical(classes="turn-body"):
            for line in _body_lines(self.turn):
                yield Static(line, classes="line")

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

    async def update(
        self, turn: Mapping[str, Any], action: ForkAction, blocked: str | None = None
    ) -> None:
        """Bring the view to this Turn and action, touching only what changed."""
        if dict(turn) != self.turn:
            self.turn = dict(turn)
            self.query_one(".turn-header", Static).update(_turn_header(self.turn))
            body = self.query_one(".turn-body", Vertical)
            lines = _body_lines(self.turn)
            statics = list(body.query(".line").results(Static))
            for static, line in zip(statics, lines, strict=False):
                static.update(line)
            if len(lines) > len(statics):
                await body.mount_all(Static(line, classes="line") for line in lines[len(statics) :])
            for static in statics[len(lines) :]:
                await static.remove()
        await self.set_action(action, blocked)

    async def set_action(self, action: ForkAction, blocked: str | None = None) -> None:
        if action is self.action and blocked == self.blocked:
            return
        self.blocked = blocked
        was_hidden, self.action = self.action is ForkAction.HIDDEN, action
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
    ) -> None:
        """Reconcile the children with this state, reusing every widget that stays."""
        self._busy += 1
        try:
            await self._show(session, turns, action_for, source_title, has_more, blocked)
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
                    await view.update(turn, action_for(turn), blocked)
                else:
                    view = TurnView(session_id, turn, action_for(turn), blocked)
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
        if at_end:
            self.scroll_end(animate=False)

    async def _arrange(self, desired: list[Widget]) -> None:
        keep = set(map(id, desired))
        stale = [w for w in self.children if id(w) not in keep]
        if stale:
            await self.remove_children(stale)
        for index, widget in enumerate(desired):
            current = list(self.children)
            if index < len(current) and current[index] is widget:
                continue
            if widget in current:
                self.move_child(widget, before=current[index])
            elif index < len(current):
                await self.mount(widget, before=current[index])
            else:
                await self.mount(widget)

    async def set_actions(
        self,
        action_for: Callable[[Mapping[str, Any]], ForkAction],
        blocked: str | None = None,
    ) -> None:
        """Update every Turn's Fork action in place."""
        self._busy += 1
        try:
            async with self.lock:
                for view in list(self.query(TurnView)):
                    await view.set_action(action_for(view.turn), blocked)
        finally:
            self._busy -= 1

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == LOAD_MORE_ID:
            event.stop()
            self.post_message(LoadMoreRequested())
