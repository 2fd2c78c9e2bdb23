"""A Turn's diff on demand: the modal screen that shows what one Turn changed in its folder
(`session.workspaceDiff`), scrollable by keyboard, or in words why it has no diff. From it, `a`
and `b` ask to restore the folder as the Turn left it or found it (`client.gui.restore_actions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from client.workspace_text import change_list
from transport.client import ApiError

_LINE_STYLES = (
    ("+++", "bold"),
    ("---", "bold"),
    ("diff ", "bold"),
    ("@@", "cyan"),
    ("+", "green"),
    ("-", "red"),
)


def diff_title(result: Mapping[str, Any], label: str) -> str:
    """`Turn 2 in /src/app: 2 files changed: M a.txt, A b.txt` / `…: no files changed`."""
    files = list(result.get("changedFiles") or [])
    where = f"{label} in {result.get('cwd', '?')}"
    if not files:
        return f"{where}: no files changed"
    count = f"{len(files)} file{'s' if len(files) != 1 else ''} changed"
    return f"{where}: {count}: {change_list(files)}"


def diff_body(result: Mapping[str, Any]) -> Text:
    """The unified diff, coloured by line (added green, removed red, hunks cyan), and a last
    line when the daemon cut it at its size bound."""
    text = Text(no_wrap=True)
    diff = str(result.get("diff") or "").rstrip("\n")
    if not diff:
        text.append("(nothing to show: the turn left its folder as it found it)", "italic")
    for line in diff.splitlines():
        style = next((s for prefix, s in _LINE_STYLES if line.startswith(prefix)), "")
        text.append(line + "\n", style)
    if result.get("truncated"):
        text.append(
            "(the diff is cut at the size bound: `agenthost diff --max-bytes` shows more)",
            "italic",
        )
    return text


def no_diff_words(exc: ApiError | TimeoutError, label: str, turn_id: str) -> str:
    """Why a Turn has no diff, in the daemon's words with the Turn named as the GUI names it:
    `Turn 1 has no workspace checkpoint: the working directory /x does not exist
    (workspace_checkpoint_missing)`."""
    if isinstance(exc, TimeoutError):
        return f"no diff for {label}: the daemon did not answer ({exc})"
    message = exc.message.replace(f"turn {turn_id}", label) or exc.reason
    return f"{message} ({exc.reason})"


RESTORE_HINT = "a: restore the files as this turn left them · b: as it found them"


class DiffScreen(ModalScreen[str | None]):
    """One Turn's diff (or why it has none); arrows / PgUp / PgDn scroll, Esc closes. With
    `restorable`, `a` dismisses with `after` and `b` with `before` (the app asks, then
    restores)."""

    DEFAULT_CSS = """
    DiffScreen { align: center middle; }
    DiffScreen > Vertical {
        width: 95%; height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    DiffScreen #diff-title { text-style: bold; width: 1fr; }
    DiffScreen VerticalScroll { height: 1fr; }
    /* As wide as its longest line: long lines scroll sideways instead of wrapping. */
    DiffScreen #diff-text { width: auto; }
    DiffScreen .hint { color: $text-muted; }
    """
    BINDINGS = [
        ("escape", "close", "Close"),
        ("q", "close", "Close"),
        ("a", "restore('after')", "Restore as the turn left it"),
        ("b", "restore('before')", "Restore as the turn found it"),
    ]

    def __init__(self, title: str, body: Text | str, *, restorable: bool = False) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.restorable = restorable

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="diff-title")
            with VerticalScroll(id="diff-scroll"):
                yield Static(self.body, id="diff-text", markup=False)
            yield Label("↑/↓ PgUp/PgDn scroll, ←/→ for long lines. Esc closes.", classes="hint")
            if self.restorable:
                yield Label(RESTORE_HINT, classes="hint", id="restore-hint")

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_restore(self, which: str) -> None:
        if self.restorable:
            self.dismiss(which)
