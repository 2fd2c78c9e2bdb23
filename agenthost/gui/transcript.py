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
from textual.widgets import Button, Static

from agenthost.session_client import ForkAction, divider_after, divider_text

DIVIDER_ID = "continued-divider"
LOAD_MORE_ID = "load-more"


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
    text.append(f"  {turn['turnId']}", style="dim italic")
    return text


def _message_line(message: Mapping[str, Any]) -> Text:
    kind = str(message.get("kind") or "")
    style = {"user": "bold cyan", "assistant": "green"}.get(kind, "yellow")
    line = Text(f"{kind:>11} ", style=style)
    line.append(str(message.get("text") or ""))
    return line


class TurnView(Vertical):
    """One Turn; its Fork button exists only when the action is not HIDDEN."""

    DEFAULT_CSS = """
    TurnView { height: auto; padding: 0 1; margin-bottom: 1; border-left: tall $primary 30%; }
    TurnView > Horizontal { height: auto; }
    TurnView .turn-header { width: 1fr; }
    TurnView Button { min-width: 10; height: 1; border: none; margin: 0 1; }
    """

    def __init__(self, session_id: str, turn: Mapping[str, Any], action: ForkAction) -> None:
        super().__init__(id=turn_widget_id(str(turn["turnId"])))
        self.session_id = session_id
        self.turn = dict(turn)
        self.action = action

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static(_turn_header(self.turn), classes="turn-header")
            if self.action is not ForkAction.HIDDEN:
                yield Button(
                    *self._label(),
                    id=fork_button_id(str(self.turn["turnId"])),
                    classes="fork",
                    disabled=self.action is ForkAction.DISABLED,
                )
        for message in self.turn.get("messages") or []:
            yield Static(_message_line(message), classes="message")
        for interaction in self.turn.get("interactions") or []:
            value = interaction.get("input") or {}
            yield Static(
                Text(
                    f"{interaction['kind']:>11}? {interaction['status']}: "
                    f"{value.get('text') or value.get('command') or ''}",
                    style="magenta",
                )
            )

    def _label(self) -> tuple[str, str]:
        if self.action is ForkAction.DISABLED:
            return ("Forking…", "default")
        return ("Fork", "primary")

    def set_action(self, action: ForkAction) -> None:
        """Enable/disable in place; a change to or from HIDDEN needs a re-render instead."""
        if action is self.action or ForkAction.HIDDEN in (action, self.action):
            return
        self.action = action
        button = self.query_one(f"#{fork_button_id(str(self.turn['turnId']))}", Button)
        button.disabled = action is ForkAction.DISABLED
        button.label, button.variant = self._label()  # type: ignore[assignment]

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == fork_button_id(str(self.turn["turnId"])):
            self.post_message(ForkRequested(self.session_id, str(self.turn["turnId"])))


class Divider(Static):
    DEFAULT_CSS = """
    Divider { color: $accent; text-style: italic; margin: 0 1 1 1; }
    """


class TranscriptView(VerticalScroll):
    """Renders a session's loaded Turns; the app calls `show` and `set_actions`."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session_id: str | None = None

    async def show(
        self,
        session: Mapping[str, Any],
        turns: Sequence[Mapping[str, Any]],
        *,
        action_for: Callable[[Mapping[str, Any]], ForkAction],
        source_title: str | None,
        has_more: bool,
    ) -> None:
        self.session_id = str(session["agentSessionId"])
        at_end = self.scroll_y >= self.max_scroll_y - 1
        widgets: list[Any] = []
        boundary = divider_after(session, turns)
        for index, turn in enumerate(turns):
            widgets.append(TurnView(self.session_id, turn, action_for(turn)))
            if index == boundary:
                lineage = session.get("forkedFrom") or {}
                title = source_title or str(lineage.get("sourceAgentSessionId", "the source"))
                widgets.append(Divider(f"──── {divider_text(title)} ────", id=DIVIDER_ID))
        if has_more:
            widgets.append(Button("Load more turns", id=LOAD_MORE_ID))
        if not turns:
            widgets.append(Static(Text("No turns yet — say something below.", style="dim")))
        async with self.batch():
            await self.remove_children()
            await self.mount_all(widgets)
        if at_end:
            self.scroll_end(animate=False)

    def set_actions(self, action_for: Callable[[Mapping[str, Any]], ForkAction]) -> bool:
        """Update Fork buttons in place; False when a re-render is needed (HIDDEN changed)."""
        for view in self.query(TurnView):
            action = action_for(view.turn)
            if (action is ForkAction.HIDDEN) != (view.action is ForkAction.HIDDEN):
                return False
            view.set_action(action)
        return True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == LOAD_MORE_ID:
            event.stop()
            self.post_message(LoadMoreRequested())
