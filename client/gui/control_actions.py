"""The GUI's everyday controls: send a message, interrupt the running Turn, approve, decline
or answer a pending Interaction, and create, rename or delete a session. Each request runs in
a thread worker; a failure becomes a toast in words.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from textual.css.query import NoMatches
from textual.widgets import Input

from client.gui.composer import Composer
from client.gui.controls import (
    ANSWER_INPUT_ID,
    ConfirmScreen,
    DeleteTreeScreen,
    InteractionBar,
    NewSessionScreen,
    RenameScreen,
)
from client.gui.view import SessionView
from client.session_client import error_words
from protocol.events import SESSION_REMOVED
from protocol.methods import (
    FORK_GET,
    INTERACTION_RESPOND,
    SESSION_CREATE,
    SESSION_DELETE,
    SESSION_UPDATE_TITLE,
    TURN_INTERRUPT,
    TURN_SUBMIT,
    Method,
    SessionResult,
)
from transport.client import ApiError

R = TypeVar("R")


class ControlActions(SessionView):
    """Composer, interrupt, interaction answers and session management."""

    # -- composer ----------------------------------------------------------------------------

    def on_composer_send(self, message: Composer.Send) -> None:
        if not self.current:
            self.notify("open a session first", severity="warning")
            return
        session_id, text = self.current, message.text
        self.run_worker(lambda: self._submit(session_id, text), thread=True)

    def _submit(self, session_id: str, text: str) -> None:
        try:
            result = self.engine.request(
                TURN_SUBMIT,
                {
                    "agentSessionId": session_id,
                    "requestId": str(uuid.uuid4()),
                    "input": [{"type": "text", "text": text}],
                },
            )
        except (ApiError, TimeoutError) as exc:
            self.call_from_thread(self.notify, error_words("send", exc), severity="error")
            return
        self.call_from_thread(self._sent, session_id, text, result["turn"])  # type: ignore[arg-type]

    async def _sent(self, session_id: str, text: str, turn: dict[str, Any]) -> None:
        with contextlib.suppress(NoMatches):
            self._main.query_one(Composer).sent(text)
        await self.merge_turn(session_id, turn)

    def focus_composer(self) -> None:
        """Where a keyboard user goes next after opening, creating or answering: typing."""
        with contextlib.suppress(NoMatches):
            self._main.query_one(Composer).focus()

    # -- everyday controls -------------------------------------------------------------------

    def _call(
        self,
        action: str,
        method: Method[Any, R],
        params: dict[str, Any],
        then: Callable[[R], Any] | None = None,
    ) -> None:
        """Run one request in a thread worker; a failure becomes a toast in words."""

        def work() -> None:
            try:
                result = self.engine.request(method, params)
            except (ApiError, TimeoutError) as exc:
                self.call_from_thread(self.notify, error_words(action, exc), severity="error")
                return
            if then is not None:
                self.call_from_thread(then, result)

        self.run_worker(work, thread=True, group="controls")

    def action_interrupt(self) -> None:
        turn_id = self.active_turn_id()
        if not self.current or turn_id is None:
            self.notify("no turn is running", severity="warning")
            return
        self._call(
            "interrupt",
            TURN_INTERRUPT,
            {"agentSessionId": self.current, "turnId": turn_id, "by": "gui"},
            lambda result: self.merge_turn(str(self.current), result["turn"]),
        )

    def _respond(self, response: dict[str, Any]) -> None:
        if not self._main.query_one(InteractionBar).respond(response):
            self.notify("nothing is waiting for an answer", severity="warning")

    def action_approve(self) -> None:
        bar = self._main.query_one(InteractionBar)
        if bar.interaction is not None and bar.interaction.get("kind") != "approval":
            self.notify("the turn asks a question: type the answer (ctrl+t)", severity="warning")
            return
        self._respond({"decision": "approve"})

    def action_decline(self) -> None:
        bar = self._main.query_one(InteractionBar)
        if bar.interaction is not None and bar.interaction.get("kind") != "approval":
            self.notify("the turn asks a question: type the answer (ctrl+t)", severity="warning")
            return
        self._respond({"decision": "decline"})

    def action_answer(self) -> None:
        found = self._main.query(f"#{ANSWER_INPUT_ID}")
        if not found:
            self.notify("no question is waiting for an answer", severity="warning")
            return
        found.first(Input).focus()

    def on_interaction_bar_respond(self, message: InteractionBar.Respond) -> None:
        interaction = message.interaction
        if not self.current:
            return
        session_id = self.current
        self._call(
            "answer",
            INTERACTION_RESPOND,
            {
                "agentSessionId": session_id,
                "turnId": interaction["turnId"],
                "requestId": interaction["requestId"],
                "response": message.response,
                "by": "gui",
            },
            lambda result: (
                self.merge_turn(session_id, turn)
                if isinstance(turn := dict(result).get("turn"), dict)
                else None
            ),
        )
        self.focus_composer()

    def action_new_session(self) -> None:
        def created(result: SessionResult) -> None:
            session = result["session"]
            self.engine.upsert_session(session)
            self._refresh_tree()
            self.open_session(str(session["agentSessionId"]))
            self.focus_composer()

        def chosen(choice: tuple[str, str] | None) -> None:
            if choice is None:
                return
            provider, title = choice
            params: dict[str, Any] = {"provider": provider, "cwd": os.getcwd()}
            if title:
                params["title"] = title
            self._call("create the session", SESSION_CREATE, params, created)

        self.push_screen(NewSessionScreen(), chosen)

    def action_rename_session(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            self.notify("open a session first", severity="warning")
            return
        session_id = str(session["agentSessionId"])

        def renamed(result: SessionResult) -> None:
            self.engine.upsert_session(result["session"])
            self._refresh_tree()
            self._update_title()

        def chosen(title: str | None) -> None:
            if title:
                self._call(
                    "rename the session",
                    SESSION_UPDATE_TITLE,
                    {"agentSessionId": session_id, "title": title},
                    renamed,
                )

        self.push_screen(RenameScreen(str(session["title"])), chosen)

    def action_delete_session(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            self.notify("open a session first", severity="warning")
            return
        lineage = session.get("forkedFrom")
        if not isinstance(lineage, dict):
            self._confirm_delete(session, None)
            return

        def work() -> None:
            # A worktree fork's child: the dialog asks about its tree too.
            try:
                op = self.engine.request(FORK_GET, {"operationId": lineage["operationId"]})
                where: Mapping[str, Any] = op["operation"].get("workspace") or {}
            except (ApiError, TimeoutError):
                where = {}
            made = where.get("mode") == "worktree" and where.get("state") == "made"
            self.call_from_thread(self._confirm_delete, session, where if made else None)

        self.run_worker(work, thread=True, group="controls")

    def _confirm_delete(self, session: dict[str, Any], tree: dict[str, Any] | None) -> None:
        session_id = str(session["agentSessionId"])
        question = f"Delete session {session['title']!r}? This cannot be undone."

        def deleted(result: dict[str, Any]) -> None:
            self.engine.handle_event(
                {
                    "type": SESSION_REMOVED,
                    "workspaceId": self.engine.workspace_id,
                    "agentSessionId": session_id,
                }
            )
            if self.current == session_id:
                self.current = None
                self.turns = []
                self._update_title()
                self.run_worker(self._clear_transcript())
            self._refresh_tree()
            done = result.get("worktree") or {}
            if done.get("state") == "removed":
                kept = " (its branch is kept: it has commits of its own)"
                self.notify(
                    f"deleted {session['title']} and removed its worktree"
                    f"{kept if done.get('branchKept') else ''}"
                )
            elif done:
                self.notify(f"deleted {session['title']}; its worktree stays: {done['path']}")
            else:
                self.notify(f"deleted {session['title']}")

        def delete(worktree: str, force: bool) -> None:
            params: dict[str, Any] = {"agentSessionId": session_id, "worktree": worktree}
            if force:
                params["force"] = True

            def work() -> None:
                try:
                    result = self.engine.request(SESSION_DELETE, params)
                except ApiError as exc:
                    if exc.reason == "workspace_worktree_dirty" and not force:
                        self.call_from_thread(self._confirm_forced, exc, delete)
                        return
                    words = error_words("delete the session", exc)
                    self.call_from_thread(self.notify, words, severity="error")
                    return
                except TimeoutError as exc:
                    words = error_words("delete the session", exc)
                    self.call_from_thread(self.notify, words, severity="error")
                    return
                self.call_from_thread(deleted, result)

            self.run_worker(work, thread=True, group="controls")

        if tree is None:
            self.push_screen(
                ConfirmScreen(question), lambda yes: delete("keep", False) if yes else None
            )
        else:
            self.push_screen(
                DeleteTreeScreen(question, str(tree.get("path"))),
                lambda choice: delete(choice, False) if choice else None,
            )

    def _confirm_forced(self, exc: ApiError, delete: Callable[[str, bool], None]) -> None:
        """The worktree holds work a removal would lose: say what, and offer to remove it
        anyway (`y`) or keep everything (Escape: nothing was deleted)."""
        p = exc.params
        what = []
        if p.get("uncaptured"):
            what.append("changes no turn recorded")
        if p.get("commits"):
            what.append(f"{p['commits']} commit(s) on {p.get('branch')} that no other branch has")
        self.push_screen(
            ConfirmScreen(
                f"Nothing was deleted: the worktree {p.get('path')} holds {' and '.join(what)}. "
                "Remove it anyway? (a branch with commits of its own is kept)",
                confirm="Remove anyway",
            ),
            lambda yes: delete("remove", True) if yes else None,
        )
