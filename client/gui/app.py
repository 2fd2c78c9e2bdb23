"""The Textual application: wires the Engine (fork mutations, session cache, daemon events) to
the session tree, the transcript and the composer, and opens a fork's child on success.

Network calls other than the Engine's non-blocking fork run in thread workers; their results
come back with `call_from_thread`, and Engine changes arrive as `EngineChanged` messages.

This module is the wiring only: layout, key bindings, the command palette, and Engine changes
routed to the parts that handle them. What the screen shows lives in `client.gui.view`, the
user's actions in `client.gui.fork_actions` and `client.gui.control_actions`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Button, Footer, Static

from client.engine import ChangeKind, Engine, EngineChange
from client.gui.bridge import EngineChanged, bridge
from client.gui.composer import Composer
from client.gui.control_actions import ControlActions
from client.gui.controls import InteractionBar
from client.gui.fork_actions import ForkActions
from client.gui.session_list import SessionTree
from client.gui.transcript import TranscriptView
from client.gui.view import FORK_SESSION_ID, PAGE_SIZE
from transport.security import ClientCurve

__all__ = ["FORK_SESSION_ID", "PAGE_SIZE", "AgentHostApp", "run_gui"]


class AgentHostApp(ForkActions, ControlActions):
    """The GUI. `engine` is owned by the caller unless `own_engine` is set."""

    TITLE = "agenthost"
    CSS = """
    #body { height: 1fr; }
    /* At 80 columns the list shrinks to a quarter; ids are shortened to 8 characters. */
    #sessions { width: 40; max-width: 25%; border-right: solid $primary 40%; }
    #main { width: 1fr; }
    #session-bar { height: auto; background: $boost; }
    #session-title { width: 1fr; height: auto; padding: 0 1; text-style: bold; }
    #interrupt { margin: 0 1; min-width: 11; display: none; }
    #interrupt.-shown { display: block; }
    #fork-session { margin: 0 1; min-width: 14; display: none; }
    #fork-session.-shown { display: block; }
    #transcript { height: 1fr; }
    #composer { margin: 0 0; }
    """
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit"),
        Binding("ctrl+g", "interrupt", "Interrupt", priority=True),
        Binding("ctrl+y", "approve", "Approve", priority=True),
        Binding("ctrl+o", "decline", "Decline", priority=True),
        Binding("ctrl+t", "answer", "Answer", priority=True),
        Binding("ctrl+n", "new_session", "New", priority=True),
        Binding("f2", "rename_session", "Rename"),
        Binding("f8", "delete_session", "Delete"),
        Binding("ctrl+r", "reload", "Reload", show=False),
    ]

    def __init__(
        self, engine: Engine, *, page_size: int = PAGE_SIZE, own_engine: bool = False
    ) -> None:
        super().__init__(engine, page_size=page_size)
        self.own_engine = own_engine
        self._unbridge: Any = None

    # -- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield SessionTree(id="sessions")
            with Vertical(id="main"):
                with Horizontal(id="session-bar"):
                    yield Static("Select a session", id="session-title")
                    fork = Button("Fork session", "primary", id=FORK_SESSION_ID, compact=True)
                    fork.tooltip = "Fork the whole session from where it is now"
                    yield fork
                    button = Button("Interrupt", "warning", id="interrupt", compact=True)
                    button.tooltip = "Interrupt the running turn (ctrl+g)"
                    yield button
                yield TranscriptView(id="transcript")
                yield InteractionBar(id="interaction")
                yield Composer(id="composer")
        yield Footer()

    def on_mount(self) -> None:
        self._unbridge = bridge(self.engine, self)
        self.run_worker(self._load_sessions, thread=True, group="sessions")

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
        if change.kind is ChangeKind.MUTATION and change.key is not None:
            if change.key[0] == self.current:
                await self._refresh_actions()
            self._after_mutation(change.key)
        elif change.kind is ChangeKind.OPERATION and change.key is not None:
            if change.key[0] == self.current:
                await self._refresh_actions()
        elif change.kind is ChangeKind.SESSION:
            if self.sessions_loaded and not self._tree_dirty:
                self._tree_dirty = True
                self.call_after_refresh(self._refresh_tree)
            if change.session_id == self.current:
                self._update_title()
                await self._render()  # capabilities may have changed
        elif change.kind is ChangeKind.EVENT and change.event is not None:
            await self._on_daemon_event(change.event)

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
            "Delete session", "Delete the open session (f8)", self.action_delete_session
        )

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
