"""Everyday controls of the GUI: the bar that answers a pending Interaction (Approve / Decline,
or an answer field and Send), and the small dialogs (new session, rename, confirm delete; the
fork and delete-worktree choices share one layout, `Choices`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from client.failure_words import EMPTY_TITLE_WORDS
from client.session_client import describe_interaction
from domain.providers import PROVIDERS

APPROVE_ID = "approve"
DECLINE_ID = "decline"
ANSWER_INPUT_ID = "answer-input"
ANSWER_SEND_ID = "answer-send"


class InteractionBar(Vertical):
    """Shown only while the open session waits for an answer; rebuilt per Interaction."""

    DEFAULT_CSS = """
    InteractionBar { height: auto; background: $warning 15%; padding: 0 1; display: none; }
    InteractionBar.-shown { display: block; }
    /* A long question or command stays a few lines high (it scrolls; the transcript holds it
       whole), so its answer field, its buttons and the Turns stay in view. */
    InteractionBar .ask { height: auto; max-height: 6; overflow-y: auto; }
    InteractionBar Horizontal { height: auto; }
    InteractionBar Button { margin: 0 1 0 0; min-width: 10; }
    InteractionBar Input { width: 1fr; }
    """

    class Respond(Message):
        def __init__(self, interaction: Mapping[str, Any], response: dict[str, Any]) -> None:
            super().__init__()
            self.interaction = dict(interaction)
            self.response = response

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.interaction: dict[str, Any] | None = None

    @property
    def request_id(self) -> str | None:
        return None if self.interaction is None else str(self.interaction["requestId"])

    async def show_interaction(self, interaction: Mapping[str, Any] | None) -> None:
        if interaction is None:
            self.interaction = None
            self.remove_class("-shown")
            await self.remove_children()
            return
        if self.interaction is not None and self.request_id == interaction["requestId"]:
            return  # the same question: keep what the user is typing
        self.interaction = dict(interaction)
        await self.remove_children()
        # Shown before its children mount: the answer field is focusable (ctrl+t) as soon as
        # it is there, not only once the whole bar has been mounted.
        self.add_class("-shown")
        kind = str(interaction.get("kind") or "question")
        ask = Text(f"{kind}: ", style="bold")
        ask.append(describe_interaction(interaction))
        if kind == "approval":
            ask.append("   (ctrl+y approve · ctrl+o decline)", style="dim")
            await self.mount(Static(ask, classes="ask"))
            await self.mount(
                Horizontal(
                    Button("Approve", "success", id=APPROVE_ID, compact=True),
                    Button("Decline", "error", id=DECLINE_ID, compact=True),
                )
            )
        else:
            ask.append("   (ctrl+t to answer)", style="dim")
            await self.mount(Static(ask, classes="ask"))
            await self.mount(
                Horizontal(
                    Input(placeholder="Your answer (Enter sends)", id=ANSWER_INPUT_ID),
                    Button("Send", "primary", id=ANSWER_SEND_ID, compact=True),
                )
            )

    def respond(self, response: dict[str, Any]) -> bool:
        if self.interaction is None:
            return False
        self.post_message(self.Respond(self.interaction, response))
        return True

    def send_answer(self) -> bool:
        if self.interaction is None or self.interaction.get("kind") == "approval":
            return False
        field = self.query_one(f"#{ANSWER_INPUT_ID}", Input)
        if not field.value.strip():
            return False
        return self.respond({"text": field.value})

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == APPROVE_ID:
            self.respond({"decision": "approve"})
        elif event.button.id == DECLINE_ID:
            self.respond({"decision": "decline"})
        elif event.button.id == ANSWER_SEND_ID:
            self.send_answer()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == ANSWER_INPUT_ID:
            self.send_answer()


_DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 60; max-width: 95%; height: auto; border: thick $primary; background: $surface;
    padding: 1 2;
}}
{name} Label {{ width: 100%; }}
{name} Horizontal {{ height: auto; margin-top: 1; }}
{name} Button {{ margin-right: 2; }}
"""


class NewSessionScreen(ModalScreen[tuple[str, str] | None]):
    """Provider picker and title; dismissed with `(provider, title)` or None."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="NewSessionScreen")
    BINDINGS = [("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("New session")
            yield Select(
                [(p, p) for p in PROVIDERS], value=PROVIDERS[0], allow_blank=False, id="provider"
            )
            yield Input(placeholder="Title (optional)", id="new-title")
            with Horizontal():
                yield Button("Create", "primary", id="create")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#new-title", Input).focus()

    def _create(self) -> None:
        provider = self.query_one("#provider", Select).value
        title = self.query_one("#new-title", Input).value.strip()
        self.dismiss((str(provider), title))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._create()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "create":
            self._create()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RenameScreen(ModalScreen[str | None]):
    DEFAULT_CSS = _DIALOG_CSS.format(name="RenameScreen")
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.current = title

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Rename session")
            yield Input(value=self.current, id="rename-title")
            with Horizontal():
                yield Button("Rename", "primary", id="rename")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#rename-title", Input).focus()

    def _done(self) -> None:
        title = self.query_one("#rename-title", Input).value.strip()
        if not title:
            # Nothing to send (the protocol wants 1.. characters): say so, as the CLI does,
            # and keep the dialog open for a title.
            self.notify(EMPTY_TITLE_WORDS, severity="warning")
            return
        self.dismiss(title)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._done()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "rename":
            self._done()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Choices(Vertical):
    """The body of a choice dialog: the question, what the choices mean, a row of buttons
    and Cancel. Cancel has the focus, so a stray Enter chooses nothing; a press is posted as
    `Choices.Chosen` with the button's id (None for Cancel) for the screen to dismiss with."""

    class Chosen(Message):
        def __init__(self, choice: str | None) -> None:
            super().__init__()
            self.choice = choice

    def __init__(self, question: str, details: str, buttons: Sequence[Button]) -> None:
        super().__init__()
        self.question = question
        self.details = details
        self.buttons = list(buttons)

    def compose(self) -> ComposeResult:
        yield Label(self.question)
        yield Label(self.details)
        with Horizontal():
            yield from self.buttons
            yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.Chosen(None if event.button.id == "cancel" else event.button.id))


class ForkScreen(ModalScreen[str | None]):
    """Confirm a fork and choose where its files go: dismissed with `shared` (the same
    folder), `worktree` (a new worktree holding the files as they were at that Turn) or None.
    Keyboard: `s` same folder, `w` new worktree, Escape cancels; Cancel has the focus, so a
    stray Enter forks nothing."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="ForkScreen") + "ForkScreen > Vertical { width: 72; }\n"
    BINDINGS = [
        ("escape", "cancel", "Cancel"),
        ("s", "same_folder", "Fork, same folder"),
        ("w", "worktree", "Fork into a new worktree"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Choices(
            self.question,
            "Same folder: the fork works on the files where they are now.\n"
            "New worktree: the fork gets a folder of its own (a git worktree on a new "
            "branch) holding the files as they were at the end of that turn.",
            [
                Button("Same folder (s)", "primary", id="shared"),
                Button("New worktree (w)", "success", id="worktree"),
            ],
        )

    def on_choices_chosen(self, message: Choices.Chosen) -> None:
        self.dismiss(message.choice)

    def action_same_folder(self) -> None:
        self.dismiss("shared")

    def action_worktree(self) -> None:
        self.dismiss("worktree")

    def action_cancel(self) -> None:
        self.dismiss(None)


class DeleteTreeScreen(ModalScreen[str | None]):
    """Confirm deleting a worktree fork's child and choose what becomes of its worktree:
    dismissed with `keep`, `remove` or None. Keyboard: `k` keep it, `r` remove it, Escape
    cancels; Cancel has the focus, so a stray Enter deletes nothing."""

    DEFAULT_CSS = (
        _DIALOG_CSS.format(name="DeleteTreeScreen") + "DeleteTreeScreen > Vertical { width: 76; }\n"
    )
    BINDINGS = [
        ("escape", "cancel", "Cancel"),
        ("k", "keep", "Delete, keep the worktree"),
        ("r", "remove", "Delete and remove the worktree"),
    ]

    def __init__(self, question: str, path: str) -> None:
        super().__init__()
        self.question = question
        self.path = path

    def compose(self) -> ComposeResult:
        yield Choices(
            self.question,
            f"Its files are in the worktree {self.path}.\n"
            "Keep: the folder and its branch stay for you.\n"
            "Remove: both go — refused if the folder holds changes no turn recorded, or "
            "commits no other branch has.",
            [
                Button("Keep worktree (k)", "primary", id="keep"),
                Button("Remove worktree (r)", "error", id="remove"),
            ],
        )

    def on_choices_chosen(self, message: Choices.Chosen) -> None:
        self.dismiss(message.choice)

    def action_keep(self) -> None:
        self.dismiss("keep")

    def action_remove(self) -> None:
        self.dismiss("remove")

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = _DIALOG_CSS.format(name="ConfirmScreen")
    BINDINGS = [("escape", "cancel", "Cancel"), ("y", "confirm", "Yes")]

    def __init__(self, question: str, confirm: str = "Delete") -> None:
        super().__init__()
        self.question = question
        self.confirm_label = confirm

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            with Horizontal():
                yield Button(self.confirm_label, "error", id="confirm")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
