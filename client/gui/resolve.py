"""The resolve dialog: for the `unknown` fork operation marked on a Turn, it
inspects the evidence (`fork.resolve` action `inspect`), shows the verdict and every provider
child in words, and offers Adopt (only when the verdict is `adoptable`) and Abandon.

Requests go through the Engine (`Engine.resolve`) in thread workers, so an adopted operation is
upserted and ACKed, and an abandoned one frees its boundary, exactly as a fork's result is.
Refusals and errors are shown in words in the dialog, never as raw codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from client.engine.lifecycle import Engine
from client.lineage_view import child_words, verdict_words
from client.session_client import error_words
from transport.client import ApiError

ADOPT_ID = "resolve-adopt"
ABANDON_ID = "resolve-abandon"
INSPECT_ID = "resolve-inspect"
CLOSE_ID = "resolve-close"
VERDICT_ID = "resolve-verdict"
CHILDREN_ID = "resolve-children"
ERROR_ID = "resolve-error"


class ResolveScreen(ModalScreen[dict[str, Any] | None]):
    """Dismissed with the `fork.resolve` result of an Adopt or Abandon, or None (closed)."""

    DEFAULT_CSS = """
    ResolveScreen { align: center middle; }
    ResolveScreen > Vertical {
        width: 100; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 1 2;
    }
    ResolveScreen .title { text-style: bold; }
    ResolveScreen Static { height: auto; margin-top: 1; }
    ResolveScreen #resolve-error { color: $error; display: none; }
    ResolveScreen #resolve-error.-shown { display: block; }
    ResolveScreen Horizontal { height: auto; margin-top: 1; }
    ResolveScreen Button { margin-right: 2; }
    ResolveScreen #resolve-adopt { display: none; }
    ResolveScreen #resolve-adopt.-shown { display: block; }
    """
    BINDINGS = [("escape", "close", "Close")]

    def __init__(self, engine: Engine, operation: Mapping[str, Any], turn_label: str) -> None:
        super().__init__()
        self.engine = engine
        self.operation = dict(operation)
        self.turn_label = turn_label
        self.evidence: dict[str, Any] | None = None
        self.busy = False

    @property
    def operation_id(self) -> str:
        return str(self.operation["operationId"])

    @property
    def adoptable(self) -> bool:
        return (
            self.evidence is not None
            and self.evidence.get("verdict") == "adoptable"
            and self.operation.get("status") == "unknown"
        )

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Unknown fork through {self.turn_label}", classes="title")
            yield Static(self._status_text(), id="resolve-status")
            yield Static(Text("Inspecting the provider's homes…", style="dim"), id=VERDICT_ID)
            yield Static("", id=CHILDREN_ID)
            yield Static("", id=ERROR_ID)
            with Horizontal():
                adopt = Button("Adopt", "success", id=ADOPT_ID, disabled=True)
                adopt.tooltip = "Bind the one verified provider child and commit the fork"
                yield adopt
                abandon = Button("Abandon", "error", id=ABANDON_ID, disabled=True)
                abandon.tooltip = (
                    "Move any provider child into quarantine (never deleted) and free the turn"
                )
                yield abandon
                yield Button("Inspect again", id=INSPECT_ID, disabled=True)
                yield Button("Close", id=CLOSE_ID)

    def _status_text(self) -> Text:
        op = self.operation
        text = Text(f"operation {op['operationId']}\n", style="dim")
        status = str(op.get("status"))
        if status == "unknown":
            text.append(
                "The daemon lost track of this fork at the provider (a crash or a lost reply), so "
                "it cannot tell whether the provider made the child. Inspect looks for it."
            )
        else:
            text.append(f"This fork is {status} now: nothing is left to resolve.")
        return text

    def on_mount(self) -> None:
        self.query_one(f"#{CLOSE_ID}", Button).focus()
        self._run("inspect")

    def _run(self, action: str, *, refresh: bool = False) -> None:
        if self.busy:
            return
        if action == "adopt" and not self.adoptable:
            # Adopt is only allowed on an `adoptable` verdict (the daemon would refuse too).
            self._show_error("cannot adopt: the evidence does not show one verified child")
            return
        self.busy = True
        self._set_buttons()
        op_id, engine = self.operation_id, self.engine

        def work() -> None:
            try:
                result = engine.resolve(op_id, action)
            except (ApiError, TimeoutError) as exc:
                verb = {"inspect": "inspect", "adopt": "adopt", "abandon": "abandon"}[action]
                self.app.call_from_thread(
                    self._failed, action, error_words(f"{verb} the fork", exc)
                )
                return
            self.app.call_from_thread(self._done, action, result, refresh)

        self.run_worker(work, thread=True, group="resolve")

    def _failed(self, action: str, words: str) -> None:
        self.busy = False
        self._show_error(words)
        self._set_buttons()
        if action != "inspect":
            # Someone else may have resolved it meanwhile: show where it stands now.
            self._run("inspect", refresh=True)

    def _show_error(self, words: str) -> None:
        error = self.query_one(f"#{ERROR_ID}", Static)
        error.update(words)
        error.add_class("-shown")

    def _done(self, action: str, result: Mapping[str, Any], refresh: bool = False) -> None:
        self.busy = False
        if not refresh:
            self.query_one(f"#{ERROR_ID}", Static).remove_class("-shown")
        self.operation = dict(result.get("operation") or self.operation)
        self.evidence = dict(result.get("evidence") or {})
        if action != "inspect":
            self.dismiss(dict(result))
            return
        self.query_one("#resolve-status", Static).update(self._status_text())
        self.query_one(f"#{VERDICT_ID}", Static).update(self._verdict_text())
        self.query_one(f"#{CHILDREN_ID}", Static).update(self._children_text())
        self._set_buttons()

    def _verdict_text(self) -> Text:
        verdict = str((self.evidence or {}).get("verdict"))
        style = {"adoptable": "bold green", "absent": "bold", "ambiguous": "bold red"}
        text = Text("Verdict: ", style="bold")
        head, _, rest = verdict_words(verdict).partition(":")
        text.append(head, style=style.get(verdict, "bold"))
        text.append(":" + rest)
        return text

    def _children_text(self) -> Text:
        evidence = self.evidence or {}
        children = list(evidence.get("children") or [])
        text = Text()
        if not children:
            text.append("No provider child was found for this fork.", style="dim")
        for index, child in enumerate(children):
            if index:
                text.append("\n")
            text.append("• " + child_words(child))
        for path in evidence.get("quarantined") or []:
            text.append(f"\nalready quarantined: {path}", style="dim")
        return text

    def _set_buttons(self) -> None:
        unknown = self.operation.get("status") == "unknown"
        inspected = self.evidence is not None
        adopt = self.query_one(f"#{ADOPT_ID}", Button)
        adopt.set_class(self.adoptable, "-shown")
        adopt.disabled = self.busy or not self.adoptable
        abandon = self.query_one(f"#{ABANDON_ID}", Button)
        abandon.disabled = self.busy or not unknown or not inspected
        self.query_one(f"#{INSPECT_ID}", Button).disabled = self.busy

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == ADOPT_ID:
            self._run("adopt")
        elif event.button.id == ABANDON_ID:
            self._run("abandon")
        elif event.button.id == INSPECT_ID:
            self._run("inspect")
        elif event.button.id == CLOSE_ID:
            self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


def resolved_words(result: Mapping[str, Any], turn_label: str) -> str:
    """The toast after an Adopt or Abandon."""
    op = result.get("operation") or {}
    status = op.get("status")
    if status == "committed":
        title = (op.get("session") or {}).get("title") or op.get("targetAgentSessionId")
        return f"adopted: the fork through {turn_label} is now the session {title!r}"
    if status == "abandoned":
        moved = list((result.get("evidence") or {}).get("quarantinedNow") or [])
        aside = f"; {len(moved)} provider child(ren) moved to quarantine" if moved else ""
        return f"abandoned: {turn_label} can be forked again{aside}"
    return f"the fork through {turn_label} is {status}"
