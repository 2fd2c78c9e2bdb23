"""What a keyboard user needs beyond the Tab order: the help screen that lists every key (the
footer has no room for all of them at 80 columns), the details pane with the internal names the
rest of the GUI puts into words, and the picker that reaches a Turn's Fork without its button.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 76; max-width: 95%; height: auto; max-height: 90%;
    border: thick $primary; background: $surface; padding: 0 1;
}}
{name} VerticalScroll {{ height: auto; max-height: 100%; }}
{name} OptionList {{ height: auto; max-height: 12; }}
{name} .hint {{ color: $text-muted; }}
"""


def key_name(key: str) -> str:
    """`ctrl+g` → `Ctrl+G`, `f2` → `F2`, `question_mark` → `?`."""
    special = {"question_mark": "?", "escape": "Esc", "enter": "Enter", "tab": "Tab"}
    parts = [special.get(part, part.upper() if len(part) <= 3 else part) for part in key.split("+")]
    return "+".join(p.capitalize() if p in ("ctrl", "shift", "alt") else p for p in parts)


def help_lines(bindings: Iterable[Binding]) -> list[str]:
    """One line an action: `Ctrl+G   Interrupt the running turn`; the keys of one action
    share its line (`F1 / ?   This list of keys`), in the order they are bound."""
    keys_of: dict[str, list[str]] = {}
    for binding in bindings:
        if not binding.description:
            continue
        named = keys_of.setdefault(binding.description, [])
        named.extend(key_name(k.strip()) for k in binding.key.split(",") if k.strip())
    return [f"{' / '.join(keys):<12} {words}" for words, keys in keys_of.items()]


class HelpScreen(ModalScreen[None]):
    """Every key of the GUI, each with what it does (F1 or `?`; Esc closes)."""

    DEFAULT_CSS = _CSS.format(name="HelpScreen")
    BINDINGS = [("escape", "close", "Close"), ("q", "close", "Close")]

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__()
        self.lines = list(lines)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Keys", classes="title")
            with VerticalScroll():
                yield Static("\n".join(self.lines), id="help-keys")
            yield Label(
                "Tab moves: session list → transcript → message box. Esc closes.", classes="hint"
            )

    def action_close(self) -> None:
        self.dismiss(None)


class DetailsScreen(ModalScreen[None]):
    """The open session's internal names (phase, outcome, binding, capabilities, ids)."""

    DEFAULT_CSS = _CSS.format(name="DetailsScreen")
    BINDINGS = [("escape", "close", "Close")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Details (the daemon's names, as in `agenthost show --json`)")
            with VerticalScroll():
                yield Static(self.text, id="details-text")

    def action_close(self) -> None:
        self.dismiss(None)


def turn_choice(turn: Mapping[str, Any], width: int = 60) -> str:
    """`Turn 3 · "plan the trip"`: the Turn and the start of what the user said in it."""
    said = next(
        (str(m.get("text") or "") for m in turn.get("messages") or [] if m.get("kind") == "user"),
        "",
    )
    said = " ".join(said.split())
    if len(said) > width:
        said = said[: width - 1] + "…"
    return f"Turn {turn['sequence']} · “{said}”" if said else f"Turn {turn['sequence']}"


class TurnPickerScreen(ModalScreen[str | None]):
    """Pick a Turn (newest first, the newest highlighted); Enter picks it, Esc cancels. For a
    fork the app then asks for a confirmation that names it; `prompt` says what the pick is
    for."""

    DEFAULT_CSS = _CSS.format(name="TurnPickerScreen")
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(
        self, turns: Sequence[Mapping[str, Any]], prompt: str = "Fork through which turn?"
    ) -> None:
        super().__init__()
        self.turns = list(turns)
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"{self.prompt} (Enter picks, Esc cancels)")
            yield OptionList(
                *(Option(turn_choice(t), id=str(t["turnId"])) for t in reversed(self.turns)),
                id="turn-picker",
            )

    def on_mount(self) -> None:
        picker = self.query_one(OptionList)
        picker.highlighted = 0
        picker.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
