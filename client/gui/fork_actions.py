"""The GUI's fork actions: a Turn's Fork click and the Session-level Fork (both through the
Engine, which owns identities, replay and ACK), the resolve dialog of an `unknown` fork, and
what follows a fork the user started (open the child, or say why it failed).
"""

from __future__ import annotations

from typing import Any

from client.engine import LATEST_SETTLED, Engine, MutationStatus
from client.gui.resolve import ResolveScreen, resolved_words
from client.gui.status_text import fork_failure_words, turn_label
from client.gui.transcript import ForkRequested, InspectRequested
from client.gui.view import PAGE_SIZE, SessionView


class ForkActions(SessionView):
    """Fork, fork the whole session, resolve an unknown fork."""

    def __init__(self, engine: Engine, *, page_size: int = PAGE_SIZE) -> None:
        super().__init__(engine, page_size=page_size)
        # The boundaries whose fork this user started here: their outcome is followed up.
        self._clicked: set[tuple[str, str]] = set()

    async def on_fork_requested(self, message: ForkRequested) -> None:
        key = (message.session_id, message.turn_id)
        # Never blocks; a click while in flight sends nothing.
        self.engine.fork(*key, message.workspace)
        self._clicked.add(key)
        self._after_mutation(key)
        if key[0] == self.current:
            await self._refresh_actions()

    def action_fork_session(self) -> None:
        """The Session-level Fork: through the Engine's `latestSettled` entry (same identity,
        replay and ACK rules as a Turn's Fork)."""
        session = self.engine.session(self.current) if self.current else None
        caps = (session or {}).get("lifecycleCapabilities") or {}
        if session is None or not caps.get("fork"):
            self.notify(
                "this session cannot be forked as a whole (its provider does not declare "
                "forkFullSession for it)",
                title="Fork",
                severity="warning",
            )
            return
        key = (str(session["agentSessionId"]), LATEST_SETTLED)
        self.engine.fork_latest(key[0])
        self._clicked.add(key)
        self._after_mutation(key)
        self.run_worker(self._refresh_actions_later())

    # -- resolve an unknown fork -------------------------------------------------------------

    def on_inspect_requested(self, message: InspectRequested) -> None:
        label = turn_label(self.turns, message.turn_id)

        def resolved(result: dict[str, Any] | None) -> None:
            if result is None:
                return
            self.notify(resolved_words(result, label), title="Fork")
            op = result.get("operation") or {}
            self.run_worker(self._refresh_actions_later())
            if op.get("status") == "committed" and op.get("targetAgentSessionId"):
                self._refresh_tree()
                self.open_session(str(op["targetAgentSessionId"]))

        self.push_screen(ResolveScreen(self.engine, message.operation, label), resolved)

    def _after_mutation(self, key: tuple[str, str]) -> None:
        record = self.engine.mutation(*key)
        if key not in self._clicked or record is None:
            return
        if record.status is MutationStatus.SUCCEEDED and record.child_session_id:
            self._clicked.discard(key)
            self._refresh_tree()
            self.open_session(record.child_session_id)
            if record.workspace == "worktree":
                child = self.engine.session(record.child_session_id) or {}
                self.notify(
                    f"the fork's files are in its new worktree: {child.get('cwd', '?')}",
                    title="Fork",
                    timeout=15,
                )
        elif record.status in (MutationStatus.FAILED, MutationStatus.UNKNOWN):
            self._clicked.discard(key)
            text = fork_failure_words(
                record,
                turns=self.turns if key[0] == self.current else [],
                session=self.engine.session(key[0]),
            )
            self.notify(text, title="Fork", severity="error", timeout=10)
