"""The GUI's fork actions: a Turn's Fork click and the Session-level Fork (both through the
Engine, which owns identities, replay and ACK), the resolve dialog of an `unknown` fork, and
what follows a fork the user started (open the child, or say why it failed). A part the app
owns, beside the session view it reads and refreshes.
"""

from __future__ import annotations

from typing import Any

from textual.app import App

from client.engine.values import LATEST_SETTLED, MutationStatus
from client.gui.controls import ForkScreen
from client.gui.keyboard import TurnPickerScreen, turn_choice
from client.gui.resolve import ResolveScreen, resolved_words
from client.gui.status_text import fork_failure_words, short_path, turn_label
from client.gui.transcript import ForkRequested, InspectRequested
from client.gui.view import SessionView
from client.session_client import ForkAction


class ForkActions:
    """Fork a Turn (its button, or F5's pick and confirm), fork the whole session, resolve
    an unknown fork."""

    def __init__(self, app: App[int], view: SessionView) -> None:
        self.app = app
        self.view = view
        self.engine = view.engine
        # The boundaries whose fork this user started here: their outcome is followed up.
        self.clicked: set[tuple[str, str]] = set()

    async def fork_turn(self, message: ForkRequested) -> None:
        key = (message.session_id, message.turn_id)
        # Never blocks; a click while in flight sends nothing.
        self.engine.fork(*key, message.workspace)
        self.clicked.add(key)
        self.after_mutation(key)
        if key[0] == self.view.current:
            await self.view.refresh_actions()

    def fork_session(self) -> None:
        """The Session-level Fork: through the Engine's `latestSettled` entry (same identity,
        replay and ACK rules as a Turn's Fork)."""
        current = self.view.current
        session = self.engine.session(current) if current else None
        if session is None or not session["lifecycleCapabilities"].get("fork"):
            self.app.notify(
                "this session cannot be forked as a whole (its provider does not declare "
                "forkFullSession for it)",
                title="Fork",
                severity="warning",
            )
            return
        key = (str(session["agentSessionId"]), LATEST_SETTLED)
        self.engine.fork_latest(key[0])
        self.clicked.add(key)
        self.after_mutation(key)
        self.app.run_worker(self.view.refresh_actions_later())

    def pick_turn(self) -> None:
        """F5: pick a Turn, then confirm a fork that names it (a keyboard user never forks by
        landing on a button)."""
        view = self.view
        if not view.current:
            self.app.notify("open a session first", severity="warning")
            return
        session_id = view.current
        forkable = [t for t in view.turns if view.action_for(t) is ForkAction.ENABLED]
        if not forkable:
            blocked = view.blocked_reason()
            self.app.notify(
                f"no turn can be forked now{': ' + blocked if blocked else ''}",
                title="Fork",
                severity="warning",
            )
            return

        def picked(turn_id: str | None) -> None:
            turn = next((t for t in forkable if t["turnId"] == turn_id), None)
            if turn is None:
                return

            def confirmed(workspace: str | None) -> None:
                if workspace:
                    message = ForkRequested(session_id, str(turn["turnId"]), workspace)
                    self.app.post_message(message)

            self.app.push_screen(
                ForkScreen(
                    f"Fork through {turn_choice(turn)}? A new session starts with the "
                    "conversation up to the end of that turn."
                ),
                confirmed,
            )

        self.app.push_screen(TurnPickerScreen(forkable), picked)

    # -- resolve an unknown fork -------------------------------------------------------------

    def inspect(self, message: InspectRequested) -> None:
        label = turn_label(self.view.turns, message.turn_id)

        def resolved(result: dict[str, Any] | None) -> None:
            if result is None:
                return
            self.app.notify(resolved_words(result, label), title="Fork")
            op = result.get("operation") or {}
            self.app.run_worker(self.view.refresh_actions_later())
            if op.get("status") == "committed" and op.get("targetAgentSessionId"):
                self.view.refresh_tree()
                self.view.open_session(str(op["targetAgentSessionId"]))

        self.app.push_screen(ResolveScreen(self.engine, message.operation, label), resolved)

    def after_mutation(self, key: tuple[str, str]) -> None:
        """A fork's state changed: follow up the one this user started (open its child, or
        say why it failed)."""
        record = self.engine.mutation(*key)
        if key not in self.clicked or record is None:
            return
        if record.status is MutationStatus.SUCCEEDED and record.child_session_id:
            self.clicked.discard(key)
            self.view.refresh_tree()
            self.view.open_session(record.child_session_id)
            if record.workspace == "worktree":
                child = self.engine.session(record.child_session_id)
                where = short_path(str(child["cwd"])) if child else "?"
                self.app.notify(
                    f"the fork works in a new worktree: {where} (F3 shows its whole path)",
                    title="Fork",
                    timeout=15,
                )
        elif record.status in (MutationStatus.FAILED, MutationStatus.UNKNOWN):
            self.clicked.discard(key)
            text = fork_failure_words(
                record,
                turns=self.view.turns if key[0] == self.view.current else [],
                session=self.engine.session(key[0]),
            )
            self.app.notify(text, title="Fork", severity="error", timeout=10)
