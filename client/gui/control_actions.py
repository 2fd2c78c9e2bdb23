"""The GUI's everyday controls: send a message, interrupt the running Turn, approve, decline
or answer a pending Interaction, and create, rename, pin or delete a session. Each request runs in
a thread worker; a failure becomes a toast in words. A part the app owns, beside the session
view it reads and refreshes.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast

from textual.app import App
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
from client.gui.session_list import SessionTree
from client.gui.status_text import short_path
from client.gui.view import SessionView
from client.session_client import error_words
from protocol.events import SESSION_REMOVED, SessionRemoved
from protocol.methods import (
    FORK_GET,
    INTERACTION_RESPOND,
    SESSION_CREATE,
    SESSION_DELETE,
    SESSION_PIN,
    SESSION_UPDATE_TITLE,
    TURN_INTERRUPT,
    TURN_SUBMIT,
    DeleteParams,
    DeleteResult,
    InteractionRespondParams,
    Method,
    OperationParams,
    PinParams,
    SessionCreateParams,
    SessionResult,
    TurnInterruptParams,
    TurnSubmitParams,
    UpdateTitleParams,
)
from protocol.objects import Session, Turn
from transport.client import ApiError

P = TypeVar("P")
R = TypeVar("R")


class ControlActions:
    """Composer, interrupt, interaction answers and session management."""

    def __init__(self, app: App[int], view: SessionView) -> None:
        self.app = app
        self.view = view
        self.engine = view.engine

    # -- composer ----------------------------------------------------------------------------

    def send(self, message: Composer.Send) -> None:
        if not self.view.current:
            self.app.notify("open a session first", severity="warning")
            return
        session_id, text = self.view.current, message.text
        self.app.run_worker(lambda: self._submit(session_id, text), thread=True)

    def _submit(self, session_id: str, text: str) -> None:
        try:
            result = self.view.waits.request(
                TURN_SUBMIT,
                TurnSubmitParams(
                    workspaceId=self.engine.workspace_id,
                    agentSessionId=session_id,
                    requestId=str(uuid.uuid4()),
                    input=[{"type": "text", "text": text}],
                ),
            )
        except (ApiError, TimeoutError) as exc:
            self.app.call_from_thread(self.app.notify, error_words("send", exc), severity="error")
            return
        self.app.call_from_thread(self._sent, session_id, text, result["turn"])  # type: ignore[arg-type]

    async def _sent(self, session_id: str, text: str, turn: Turn) -> None:
        with contextlib.suppress(NoMatches):
            self.view.main.query_one(Composer).sent(text)
        await self.view.merge_turn(session_id, turn)

    def focus_composer(self) -> None:
        """Where a keyboard user goes next after opening, creating or answering: typing."""
        with contextlib.suppress(NoMatches):
            self.view.main.query_one(Composer).focus()

    # -- everyday controls -------------------------------------------------------------------

    def _call(
        self,
        action: str,
        method: Method[P, R],
        params: P,
        then: Callable[[R], Any] | None = None,
    ) -> None:
        """Run one request in a thread worker; a failure becomes a toast in words."""

        def work() -> None:
            try:
                result = self.view.waits.request(method, params)
            except (ApiError, TimeoutError) as exc:
                self.app.call_from_thread(
                    self.app.notify, error_words(action, exc), severity="error"
                )
                return
            if then is not None:
                self.app.call_from_thread(then, result)

        self.app.run_worker(work, thread=True, group="controls")

    def interrupt(self) -> None:
        turn_id = self.view.active_turn_id()
        if not self.view.current or turn_id is None:
            self.app.notify("no turn is running", severity="warning")
            return
        self._call(
            "interrupt",
            TURN_INTERRUPT,
            TurnInterruptParams(
                workspaceId=self.engine.workspace_id,
                agentSessionId=self.view.current,
                turnId=turn_id,
                by="gui",
            ),
            lambda result: self.view.merge_turn(str(self.view.current), result["turn"]),
        )

    def _respond(self, response: dict[str, Any]) -> None:
        if not self.view.main.query_one(InteractionBar).respond(response):
            self.app.notify("nothing is waiting for an answer", severity="warning")

    def approve(self) -> None:
        bar = self.view.main.query_one(InteractionBar)
        if bar.interaction is not None and bar.interaction.get("kind") != "approval":
            self.app.notify(
                "the turn asks a question: type the answer (ctrl+t)", severity="warning"
            )
            return
        self._respond({"decision": "approve"})

    def decline(self) -> None:
        bar = self.view.main.query_one(InteractionBar)
        if bar.interaction is not None and bar.interaction.get("kind") != "approval":
            self.app.notify(
                "the turn asks a question: type the answer (ctrl+t)", severity="warning"
            )
            return
        self._respond({"decision": "decline"})

    def answer(self) -> None:
        found = self.view.main.query(f"#{ANSWER_INPUT_ID}")
        if not found:
            self.app.notify("no question is waiting for an answer", severity="warning")
            return
        found.first(Input).focus()

    def answered(self, message: InteractionBar.Respond) -> None:
        interaction = message.interaction
        if not self.view.current:
            return
        session_id = self.view.current
        self._call(
            "answer",
            INTERACTION_RESPOND,
            InteractionRespondParams(
                workspaceId=self.engine.workspace_id,
                agentSessionId=session_id,
                turnId=interaction["turnId"],
                requestId=interaction["requestId"],
                response=message.response,
                by="gui",
            ),
            lambda result: (
                # This daemon's answer also carries the Turn it moved on (an extension).
                self.view.merge_turn(session_id, cast(Turn, turn))
                if isinstance(turn := cast(Mapping[str, object], result).get("turn"), dict)
                else None
            ),
        )
        self.focus_composer()

    def new_session(self) -> None:
        def created(result: SessionResult) -> None:
            session = result["session"]
            self.engine.upsert_session(session)
            self.view.refresh_tree()
            self.view.open_session(str(session["agentSessionId"]))
            self.focus_composer()

        def chosen(choice: tuple[str, str] | None) -> None:
            if choice is None:
                return
            provider, title = choice
            params = SessionCreateParams(
                workspaceId=self.engine.workspace_id, provider=provider, cwd=os.getcwd()
            )
            if title:
                params["title"] = title
            self._call("create the session", SESSION_CREATE, params, created)

        self.app.push_screen(NewSessionScreen(), chosen)

    def rename_session(self) -> None:
        session = self.engine.session(self.view.current) if self.view.current else None
        if session is None:
            self.app.notify("open a session first", severity="warning")
            return
        session_id = str(session["agentSessionId"])

        def renamed(result: SessionResult) -> None:
            self.engine.upsert_session(result["session"])
            self.view.refresh_tree()
            self.view.update_title()

        def chosen(title: str | None) -> None:
            if title:
                self._call(
                    "rename the session",
                    SESSION_UPDATE_TITLE,
                    UpdateTitleParams(
                        workspaceId=self.engine.workspace_id, agentSessionId=session_id, title=title
                    ),
                    renamed,
                )

        self.app.push_screen(RenameScreen(str(session["title"])), chosen)

    def toggle_pin(self) -> None:
        """Pin the open session, or unpin it if it is pinned (`session.pin`); the list marks a
        pinned session with ★ and the toast says which it now is."""
        session = self.engine.session(self.view.current) if self.view.current else None
        if session is None:
            self.app.notify("open a session first", severity="warning")
            return
        pinned = not session.get("pinned")

        def done(result: SessionResult) -> None:
            self.engine.upsert_session(result["session"])
            self.view.refresh_tree()
            self.view.update_title()
            state = "pinned" if result["session"].get("pinned") else "unpinned"
            self.app.notify(f"{state} {result['session']['title']}")

        self._call(
            "pin the session" if pinned else "unpin the session",
            SESSION_PIN,
            PinParams(
                workspaceId=self.engine.workspace_id,
                agentSessionId=str(session["agentSessionId"]),
                pinned=pinned,
            ),
            done,
        )

    def delete_session(self) -> None:
        session = self.engine.session(self.view.current) if self.view.current else None
        if session is None:
            self.app.notify("open a session first", severity="warning")
            return
        lineage = session.get("forkedFrom")
        if not isinstance(lineage, dict):
            self._confirm_delete(session, None)
            return

        def work() -> None:
            # A worktree fork's child: the dialog asks about its tree too.
            try:
                op = self.view.waits.request(
                    FORK_GET,
                    OperationParams(
                        workspaceId=self.engine.workspace_id, operationId=lineage["operationId"]
                    ),
                )
                where: Mapping[str, Any] = op["operation"].get("workspace") or {}
            except (ApiError, TimeoutError):
                where = {}
            made = where.get("mode") == "worktree" and where.get("state") == "made"
            self.app.call_from_thread(self._confirm_delete, session, where if made else None)

        self.app.run_worker(work, thread=True, group="controls")

    def _confirm_delete(self, session: Session, tree: Mapping[str, Any] | None) -> None:
        session_id = str(session["agentSessionId"])
        question = f"Delete session {session['title']!r}? This cannot be undone."

        def deleted(result: DeleteResult) -> None:
            self.engine.handle_event(
                SessionRemoved(type=SESSION_REMOVED, agentSessionId=session_id)
            )
            was_open = self.view.current == session_id
            self.view.refresh_tree()
            if was_open:
                self._open_after_delete(session)
            done: Mapping[str, Any] = result.get("worktree") or {}
            if done.get("state") == "removed":
                kept = " (its branch is kept: it has commits of its own)"
                self.app.notify(
                    f"deleted {session['title']} and removed its worktree"
                    f"{kept if done.get('branchKept') else ''}"
                )
            elif done.get("state") == "removing":
                self.app.notify(
                    f"deleted {session['title']}; its worktree could not be removed: "
                    f"{done.get('error', '')} (the daemon tries again in the background)",
                    severity="warning",
                )
            elif done:
                users = done.get("inUseBy") or []
                why = f" ({len(users)} other session(s) work in it)" if users else ""
                self.app.notify(
                    f"deleted {session['title']}; its worktree stays: "
                    f"{short_path(str(done['path']))}{why}"
                )
            else:
                self.app.notify(f"deleted {session['title']}")

        def delete(worktree: str, force: bool) -> None:
            params = DeleteParams(
                workspaceId=self.engine.workspace_id,
                agentSessionId=session_id,
                worktree=cast(Literal["keep", "remove"], worktree),
            )
            if force:
                params["force"] = True

            def work() -> None:
                try:
                    result = self.view.waits.request(SESSION_DELETE, params)
                except ApiError as exc:
                    if exc.reason == "workspace_worktree_dirty" and not force:
                        self.app.call_from_thread(self._confirm_forced, exc, delete)
                        return
                    words = error_words("delete the session", exc)
                    self.app.call_from_thread(self.app.notify, words, severity="error")
                    return
                except TimeoutError as exc:
                    words = error_words("delete the session", exc)
                    self.app.call_from_thread(self.app.notify, words, severity="error")
                    return
                self.app.call_from_thread(deleted, result)

            self.app.run_worker(work, thread=True, group="controls")

        if tree is None:
            self.app.push_screen(
                ConfirmScreen(question), lambda yes: delete("keep", False) if yes else None
            )
        else:
            self.app.push_screen(
                DeleteTreeScreen(question, str(tree.get("path"))),
                lambda choice: delete(choice, False) if choice else None,
            )

    def _open_after_delete(self, session: Session) -> None:
        """The open session was deleted: open its source (a fork child's), else the session the
        list's cursor is on, else none ("Select a session")."""
        lineage = session.get("forkedFrom")
        source = lineage.get("sourceAgentSessionId") if isinstance(lineage, Mapping) else None
        if source and self.engine.session(str(source)) is not None:
            self.view.open_session(str(source))
            return
        with contextlib.suppress(NoMatches):
            node = self.view.main.query_one(SessionTree).cursor_node
            if node is not None and node.data and self.engine.session(node.data) is not None:
                self.view.open_session(node.data)
                return
        self.view.current = None
        self.view.turns = []
        self.view.update_title()
        self.app.run_worker(self.view.clear_transcript())

    def _confirm_forced(self, exc: ApiError, delete: Callable[[str, bool], None]) -> None:
        """The worktree holds work a removal would lose: say what, and offer to remove it
        anyway (`y`) or keep everything (Escape: nothing was deleted)."""
        p = exc.params
        what = []
        if p.get("uncaptured"):
            what.append("changes no turn recorded")
        if p.get("commits"):
            what.append(f"{p['commits']} commit(s) on {p.get('branch')} that no other branch has")
        self.app.push_screen(
            ConfirmScreen(
                f"Nothing was deleted: the worktree {p.get('path')} holds {' and '.join(what)}. "
                "Remove it anyway? (a branch with commits of its own is kept)",
                confirm="Remove anyway",
            ),
            lambda yes: delete("remove", True) if yes else None,
        )
