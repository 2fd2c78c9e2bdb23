"""The Textual application: wires the Engine (fork mutations, session cache, daemon events) to
the session tree, the transcript and the composer, and opens a fork's child on success.

Network calls other than the Engine's non-blocking fork run in thread workers; their results
come back with `call_from_thread`, and Engine changes arrive as `EngineChanged` messages.

This module is the wiring only: layout, key bindings, the command palette, and messages and
Engine changes routed to the parts the app owns: `view` (what the screen shows,
`client.gui.view`), `forks`, `controls` and `restores` (the user's actions,
`client.gui.fork_actions`, `client.gui.control_actions` and `client.gui.restore_actions`).
Each action and message handler delegates to the part whose concern it is; the widgets talk to
the app by messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.filter import LineFilter
from textual.screen import Screen
from textual.widgets import Button, Footer, Static, Tree

from client.engine.lifecycle import Engine
from client.engine.values import ChangeKind, EngineChange
from client.gui.bridge import EngineChanged, bridge
from client.gui.composer import Composer
from client.gui.control_actions import ControlActions
from client.gui.control_filter import ControlCharacters
from client.gui.controls import InteractionBar
from client.gui.diff_view import DiffScreen, diff_body, diff_title, no_diff_words
from client.gui.fork_actions import ForkActions
from client.gui.keyboard import (
    DetailsScreen,
    HelpScreen,
    TurnPickerScreen,
    help_lines,
)
from client.gui.restore_actions import RestoreActions, RestoreTarget
from client.gui.session_list import SessionTree
from client.gui.status_text import details_text, turn_label
from client.gui.transcript import (
    ForkRequested,
    InspectRequested,
    LoadMoreRequested,
    TranscriptView,
)
from client.gui.view import FORK_SESSION_ID, PAGE_SIZE, SessionView
from client.gui.waiting import WaitChanged
from client.lineage_view import LineageMark
from protocol.events import MessageDelta
from protocol.objects import Turn
from transport.client import ApiError
from transport.security import ClientCurve

__all__ = ["FORK_SESSION_ID", "PAGE_SIZE", "AgentHostApp", "run_gui"]


class AgentHostApp(App[int]):
    """The GUI. `engine` is owned by the caller unless `own_engine` is set."""

    TITLE = "agenthost"
    CSS = """
    #body { height: 1fr; }
    /* A quarter of the screen, 21 to 40 cells: at 80 columns a title keeps 20 (the id gives
       way first) and a Turn's header its file count; ids are shortened to 8 characters. */
    #sessions { width: 25%; min-width: 21; max-width: 40; border-right: solid $primary 40%; }
    #main { width: 1fr; }
    #session-bar { height: auto; background: $boost; }
    /* One line whatever it says (a blocked fork's reason included): elided with "…". */
    #session-title {
        width: 1fr; height: 1; padding: 0 1; text-style: bold;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    #interrupt { margin: 0 1; min-width: 11; display: none; }
    #interrupt.-shown { display: block; }
    #fork-session { margin: 0 1; min-width: 14; display: none; }
    #fork-session.-shown { display: block; }
    #transcript { height: 1fr; }
    #composer { margin: 0 0; }
    /* Toasts at the top right, under the session bar: at the bottom (Textual's place) they
       hid the message box and the dialogs' hint lines at 80x24. */
    ToastRack { dock: top; align: right top; margin-top: 1; margin-bottom: 0; }
    """
    BINDINGS = [
        # First: at 80 columns the footer shows only its first few keys; F1 lists them all.
        Binding("f1", "help", "Keys", priority=True),
        Binding("ctrl+q", "quit", "Quit"),
        Binding("ctrl+g", "interrupt", "Interrupt", priority=True),
        Binding("ctrl+y", "approve", "Approve", priority=True),
        Binding("ctrl+o", "decline", "Decline", priority=True),
        Binding("ctrl+t", "answer", "Answer", priority=True),
        Binding("ctrl+n", "new_session", "New", priority=True),
        Binding("f2", "rename_session", "Rename"),
        Binding("f7", "toggle_pin", "Pin"),
        Binding("f8", "delete_session", "Delete"),
        Binding("f5", "fork_turn", "Fork…", priority=True),
        Binding("f6", "turn_diff", "Diff…", priority=True),
        Binding("f3", "details", "Details", priority=True),
        Binding("f9", "undo_restore", "Undo restore", priority=True),
        Binding("question_mark", "help", "Keys", show=False),
        Binding("ctrl+r", "reload", "Reload", show=False),
    ]
    KEY_HELP: ClassVar[dict[str, str]] = {
        "quit": "Quit",
        "interrupt": "Interrupt the running turn",
        "approve": "Approve the pending approval",
        "decline": "Decline the pending approval",
        "answer": "Type the answer to the pending question",
        "new_session": "New session",
        "rename_session": "Rename the open session",
        "toggle_pin": "Pin the open session (★ in the list), or unpin it",
        "delete_session": "Delete the open session (asks first)",
        "fork_turn": "Fork through a turn: pick it, then confirm",
        "turn_diff": "Pick a turn, see its diff; a/b there restore its files",
        "undo_restore": "Undo the last restore (files as they were before it)",
        "details": "Details: the daemon's names for the session and its turns",
        "help": "This list of keys (? outside the message box)",
        "reload": "Reload the session list",
    }

    def __init__(
        self, engine: Engine, *, page_size: int = PAGE_SIZE, own_engine: bool = False
    ) -> None:
        super().__init__()
        self.engine = engine
        self.own_engine = own_engine
        self._unbridge: Any = None
        self.view = SessionView(self, engine, page_size=page_size)
        self.forks = ForkActions(self, self.view)
        self.controls = ControlActions(self, self.view)
        self.restores = RestoreActions(self, self.view)
        self._control_characters = ControlCharacters()

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's filters, then `ControlCharacters`: a title or a reply drawn as it came
        could command the terminal."""
        return [*super().get_line_filters(), self._control_characters]

    # -- the open session's state, read where the parts keep it --------------------------------

    @property
    def current(self) -> str | None:
        """The open session's id."""
        return self.view.current

    @property
    def turns(self) -> list[Turn]:
        """The open session's loaded Turns, oldest first."""
        return self.view.turns

    @property
    def has_more(self) -> bool:
        return self.view.has_more

    @property
    def sessions_loaded(self) -> bool:
        return self.view.sessions_loaded

    @property
    def marks(self) -> dict[str, LineageMark]:
        return self.view.marks

    @property
    def _main(self) -> Any:
        return self.view.main

    def open_session(self, session_id: str) -> None:
        self.view.open_session(session_id)

    def blocked_reason(self) -> str | None:
        return self.view.blocked_reason()

    def focus_composer(self) -> None:
        self.controls.focus_composer()

    async def _on_delta(self, event: MessageDelta) -> None:
        await self.view.on_delta(event)

    # -- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield SessionTree(id="sessions")
            with Vertical(id="main"):
                with Horizontal(id="session-bar"):
                    yield Static("Select a session", id="session-title")
                    fork = Button("Fork session", "primary", id=FORK_SESSION_ID, compact=True)
                    fork.tooltip = "Fork the whole session from where it is now"
                    # Out of the Tab order (list → transcript → message box): the palette
                    # and ctrl+g reach them from the keyboard.
                    fork.can_focus = False
                    yield fork
                    button = Button("Interrupt", "warning", id="interrupt", compact=True)
                    button.tooltip = "Interrupt the running turn (ctrl+g)"
                    button.can_focus = False
                    yield button
                yield TranscriptView(id="transcript")
                yield InteractionBar(id="interaction")
                yield Composer(id="composer")
        yield Footer()

    def on_mount(self) -> None:
        self._unbridge = bridge(self.engine, self)
        self.run_worker(self.view.load_sessions, thread=True, group="sessions")

    def on_unmount(self) -> None:
        if self._unbridge is not None:
            self._unbridge()
        if self.own_engine:
            self.engine.close()

    # -- Engine changes, routed ------------------------------------------------------------

    async def on_engine_changed(self, message: EngineChanged) -> None:
        if not self.is_running or not self.screen.is_mounted:
            return  # shutting down: the widgets may already be gone
        with contextlib.suppress(NoMatches):  # a change that raced the screen's teardown
            await self._apply_change(message.change)

    async def _apply_change(self, change: EngineChange) -> None:
        view = self.view
        if change.kind is ChangeKind.MUTATION and change.key is not None:
            if change.key[0] == view.current:
                await view.refresh_actions()
            self.forks.after_mutation(change.key)
        elif change.kind is ChangeKind.OPERATION and change.key is not None:
            if change.key[0] == view.current:
                await view.refresh_actions()
        elif change.kind is ChangeKind.SESSION:
            if view.sessions_loaded and not view.tree_dirty:
                view.tree_dirty = True
                self.call_after_refresh(view.refresh_tree)
            if change.session_id == view.current:
                view.update_title()
                await view.render()  # capabilities may have changed
        elif change.kind is ChangeKind.EVENT and change.event is not None:
            await view.on_daemon_event(change.event)

    # -- messages from the widgets, to the part whose concern they are -------------------------

    def on_tree_node_selected(self, event: Tree.NodeSelected[str]) -> None:
        self.view.select(event.node.data)

    def on_wait_changed(self, message: WaitChanged) -> None:
        if message.after > 0:
            self.set_timer(message.after, self.view.check_waiting)
        else:
            self.view.check_waiting()

    def on_load_more_requested(self, _: LoadMoreRequested) -> None:
        self.view.load_more()

    async def on_fork_requested(self, message: ForkRequested) -> None:
        await self.forks.fork_turn(message)

    def on_inspect_requested(self, message: InspectRequested) -> None:
        self.forks.inspect(message)

    def on_composer_send(self, message: Composer.Send) -> None:
        self.controls.send(message)

    def on_interaction_bar_respond(self, message: InteractionBar.Respond) -> None:
        self.controls.answered(message)

    # -- the command palette and the session bar's buttons -------------------------------------

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New session", "Create a session (ctrl+n)", self.action_new_session)
        yield SystemCommand(
            "Interrupt", "Interrupt the open session's turn (ctrl+g)", self.action_interrupt
        )
        yield SystemCommand(
            "Fork session",
            "Fork the open session from its latest turn (when its provider supports it)",
            self.action_fork_session,
        )
        yield SystemCommand("Approve", "Approve the pending approval (ctrl+y)", self.action_approve)
        yield SystemCommand("Decline", "Decline the pending approval (ctrl+o)", self.action_decline)
        yield SystemCommand("Answer", "Answer the pending question (ctrl+t)", self.action_answer)
        yield SystemCommand(
            "Rename session", "Rename the open session (f2)", self.action_rename_session
        )
        yield SystemCommand(
            "Pin / unpin session", "Pin the open session, or unpin it (f7)", self.action_toggle_pin
        )
        yield SystemCommand(
            "Delete session", "Delete the open session (f8)", self.action_delete_session
        )
        yield SystemCommand(
            "Fork a turn", "Pick a turn to fork through, then confirm (f5)", self.action_fork_turn
        )
        yield SystemCommand(
            "Turn diff",
            "Pick a turn, see what it changed in its folder (f6)",
            self.action_turn_diff,
        )
        yield SystemCommand(
            "Restore a turn's files",
            "Pick a turn, see its diff, then a (as it left them) or b (as it found them) (f6)",
            self.action_turn_diff,
        )
        yield SystemCommand(
            "Undo restore",
            "Put the files back as they were before the last restore (f9)",
            self.action_undo_restore,
        )
        yield SystemCommand(
            "Details", "The daemon's names for the session (f3)", self.action_details
        )
        yield SystemCommand("Keys", "Every key of the GUI (f1)", self.action_help)

    # -- actions (keys, palette, buttons), each delegated to the part that owns it -------------

    def action_reload(self) -> None:
        self.view.reload()

    def action_fork_session(self) -> None:
        self.forks.fork_session()

    def action_interrupt(self) -> None:
        self.controls.interrupt()

    def action_approve(self) -> None:
        self.controls.approve()

    def action_decline(self) -> None:
        self.controls.decline()

    def action_answer(self) -> None:
        self.controls.answer()

    def action_new_session(self) -> None:
        self.controls.new_session()

    def action_rename_session(self) -> None:
        self.controls.rename_session()

    def action_toggle_pin(self) -> None:
        self.controls.toggle_pin()

    def action_delete_session(self) -> None:
        self.controls.delete_session()

    # -- keys beyond the Tab order ----------------------------------------------------------

    def action_help(self) -> None:
        bindings = [
            Binding(b.key, b.action, self.KEY_HELP.get(b.action, b.description))
            for b in self.BINDINGS
            if isinstance(b, Binding)
        ]
        bindings.append(Binding("ctrl+p", "palette", "Command palette (every action by name)"))
        bindings.append(Binding("enter", "send", "Send the message / open the selected session"))
        self.push_screen(HelpScreen(help_lines(bindings)))

    def action_details(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            self.notify("open a session first", severity="warning")
            return
        unknown = self.engine.unknown_operations(str(self.current))
        self.push_screen(DetailsScreen(details_text(session, self.turns, unknown)))

    def action_fork_turn(self) -> None:
        self.forks.pick_turn()

    def action_turn_diff(self) -> None:
        """F6: pick a settled Turn, then see its diff (`session.workspaceDiff`) in a modal
        screen; a Turn without a checkpoint says why instead. There `a` / `b` restore the
        folder as the Turn left / found it, asked first (`client.gui.restore_actions`)."""
        if not self.current:
            self.notify("open a session first", severity="warning")
            return
        session_id = self.current
        settled = [t for t in self.turns if t.get("phase") == "settled"]
        if not settled:
            self.notify(
                "no turn has settled yet: nothing to diff", title="Diff", severity="warning"
            )
            return
        turns = list(self.turns)

        def fetch(turn_id: str) -> None:
            label = turn_label(turns, turn_id)
            try:
                with self.view.waits.track():
                    result = self.engine.workspace_diff(session_id, turn_id)
            except (ApiError, TimeoutError) as exc:
                words = no_diff_words(exc, label, turn_id)
                self.call_from_thread(self.push_screen, DiffScreen(f"{label}: no diff", words))
                return
            screen = DiffScreen(diff_title(result, label), diff_body(result), restorable=True)
            self.call_from_thread(self.push_screen, screen, lambda which: restore(turn_id, which))

        def restore(turn_id: str, which: str | None) -> None:
            if which is not None:
                label = turn_label(turns, turn_id)
                self.restores.ask(RestoreTarget(session_id, label, turn_id, which))

        def picked(turn_id: str | None) -> None:
            if turn_id is not None:
                self.run_worker(lambda: fetch(turn_id), thread=True, group="diff")

        self.push_screen(TurnPickerScreen(settled, "See the diff of which turn?"), picked)

    def action_undo_restore(self) -> None:
        self.restores.undo_last()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "interrupt":
            event.stop()
            self.action_interrupt()
        elif event.button.id == FORK_SESSION_ID:
            event.stop()
            self.action_fork_session()


def run_gui(
    api_endpoint: str,
    events_endpoint: str | None,
    workspace_id: str,
    *,
    curve: ClientCurve | None = None,
    events_exact: bool = False,
) -> int:
    """`agenthost gui`: run the app until the user quits; `curve` for a tcp connection file;
    `events_exact`: `events_endpoint` is the terminated-topic one (`eventsExact`)."""
    engine = Engine.connect(
        api_endpoint, events_endpoint, workspace_id, curve=curve, events_exact=events_exact
    )
    app = AgentHostApp(engine, own_engine=True)
    try:
        app.run()
    finally:
        engine.close()
    return 0
