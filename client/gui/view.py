"""What the GUI's main screen shows, kept current: the session list (with its lineage marks),
the open session's pages of Turns, its title bar and Session-level Fork button, each Turn's
Fork action, the interaction bar, and Turn updates (events, streamed replies, submit replies)
merged into the open transcript.

`SessionView` is a part the app (`client.gui.app.AgentHostApp`) owns: it holds the open
session's state and draws it into the app's widgets; the actions the user takes are the parts in
`client.gui.fork_actions` and `client.gui.control_actions`, which read and refresh this one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from textual.app import App
from textual.css.query import NoMatches
from textual.widgets import Button, Static

from client.engine.lifecycle import Engine
from client.engine.values import LATEST_SETTLED
from client.gui.controls import InteractionBar
from client.gui.session_list import SessionTree
from client.gui.status_text import fork_session_button, session_bar_text
from client.gui.transcript import TranscriptView
from client.gui.turn_merge import message_count, staler, with_streams
from client.gui.waiting import NOT_ANSWERING, DaemonWaits
from client.lineage_view import LineageMark, lineage_marks
from client.session_client import ForkAction, error_words, fork_action, fork_blocked
from protocol.events import (
    MESSAGE_DELTA,
    TURN_UPDATED,
    ClientEvent,
    EventTurn,
    MessageDelta,
    UnknownEvent,
)
from protocol.methods import (
    SESSION_GET,
    SESSION_LINEAGE,
    SESSION_TIMELINE,
    LineageParams,
    LineageResult,
    SessionParams,
    TimelineParams,
    TimelineResult,
)
from protocol.objects import Operation, Session, Turn
from transport.client import ApiError
from transport.client import merge_turn as merged_turn

PAGE_SIZE = 200
FORK_SESSION_ID = "fork-session"


class SessionView:
    """The main screen's state and rendering (see the module docstring). `app` runs its
    workers, toasts and thread callbacks; its widgets are found on the app's main screen."""

    def __init__(self, app: App[int], engine: Engine, *, page_size: int = PAGE_SIZE) -> None:
        self.app = app
        self.engine = engine
        self.page_size = page_size
        self.current: str | None = None
        self.turns: list[Turn] = []
        # Replies streaming in (message.delta) by (turn id, provider item id); not durable.
        self._streams: dict[tuple[str, str], str] = {}
        # The provider's latest retry note (`message.delta` of kind `progress`) by Turn id,
        # until that Turn streams again or settles; not durable.
        self._progress: dict[str, str] = {}
        self.has_more = False
        self.source_title: str | None = None
        self.tree_dirty = False
        self.sessions_loaded = False
        # session.lineage marks of the session list (ordinals, deleted ancestors), recomputed
        # only when the set of sessions or their lineage changes.
        self.marks: dict[str, LineageMark] = {}
        self._marks_for: frozenset[tuple[str, str | None]] | None = None
        # The requests a person waits on, timed: the bar says when the daemon does not answer.
        self.waits = DaemonWaits(engine, app)
        self.waiting = False

    @property
    def main(self) -> Any:
        """The main screen: its widgets are queried even while a dialog (resolve, rename, …) is
        on top, so an Engine change that arrives then still updates them."""
        return self.app.screen_stack[0] if self.app.screen_stack else self.app

    # -- sessions ----------------------------------------------------------------------------

    def load_sessions(self) -> None:
        try:
            with self.waits.track():
                self.engine.load_sessions()
        except (ApiError, TimeoutError) as exc:
            self.app.call_from_thread(
                self.app.notify, error_words("list sessions", exc), severity="error"
            )
            return
        self.app.call_from_thread(self._sessions_ready)

    def _sessions_ready(self) -> None:
        self.sessions_loaded = True
        self.refresh_tree()

    def refresh_tree(self) -> None:
        self.tree_dirty = False
        sessions = self.engine.sessions()
        try:
            tree = self.main.query_one(SessionTree)
        except NoMatches:
            return  # shutting down (a refresh scheduled just before the screen went)
        tree.show_sessions(sessions, self.current, self.marks)
        shape = frozenset((str(s["agentSessionId"]), _fork_operation_id(s)) for s in sessions)
        if shape != self._marks_for:
            self._marks_for = shape
            self.app.run_worker(
                lambda: self._load_marks(sessions, shape),
                thread=True,
                group="lineage",
                exclusive=True,
                exit_on_error=False,  # marks are decoration: never take the GUI down
            )

    def _load_marks(
        self, sessions: list[Session], shape: frozenset[tuple[str, str | None]]
    ) -> None:
        def fetch(sid: str) -> LineageResult | None:
            try:
                return self.engine.request(
                    SESSION_LINEAGE,
                    LineageParams(workspaceId=self.engine.workspace_id, agentSessionId=sid),
                )
            except (ApiError, TimeoutError):
                return None  # deleted meanwhile: the next refresh asks again

        marks = lineage_marks(sessions, fetch)
        with contextlib.suppress(RuntimeError):  # the app stopped meanwhile
            self.app.call_from_thread(self._marks_loaded, marks, shape)

    def _marks_loaded(
        self, marks: dict[str, LineageMark], shape: frozenset[tuple[str, str | None]]
    ) -> None:
        if shape != self._marks_for:
            return  # a newer list is being marked
        if marks != self.marks:
            self.marks = marks
            # The answer may arrive while the app shuts down: its widgets may be gone.
            with contextlib.suppress(NoMatches):
                self.main.query_one(SessionTree).show_sessions(
                    self.engine.sessions(), self.current, self.marks
                )

    def select(self, session_id: str | None) -> None:
        """A session picked in the list: open it unless it is the open one."""
        if session_id and session_id != self.current:
            self.open_session(session_id)

    def reload(self) -> None:
        """Ctrl+R: re-read the list and the open session's first page. The Turns on screen
        stay until the new page replaces them, so a daemon that does not answer leaves them
        in view with a toast, not an empty transcript."""
        self.app.run_worker(self.load_sessions, thread=True, group="sessions")
        if self.current:
            self._load_page(self.current, 0)

    # -- the open session --------------------------------------------------------------------

    def open_session(self, session_id: str) -> None:
        self.current = session_id
        self.turns, self.has_more, self.source_title = [], False, None
        self.update_title()
        tree = self.main.query_one(SessionTree)
        node = tree.node_for(session_id)
        if node is not None:
            tree.show_cursor_on(node)
        self._load_page(session_id, 0)

    def _load_page(self, session_id: str, after: int) -> None:
        self.app.run_worker(lambda: self._fetch_page(session_id, after), thread=True)

    def _fetch_page(self, session_id: str, after: int) -> None:
        try:
            page = self.waits.request(
                SESSION_TIMELINE,
                TimelineParams(
                    workspaceId=self.engine.workspace_id,
                    agentSessionId=session_id,
                    afterSequence=after,
                    limit=self.page_size,
                ),
            )
        except (ApiError, TimeoutError) as exc:
            self.app.call_from_thread(
                self.app.notify, error_words("load turns", exc), severity="error"
            )
            return
        title = self._fetch_source_title(session_id)
        self.app.call_from_thread(self._page_loaded, session_id, after, page, title)  # type: ignore[arg-type]

    def _fetch_source_title(self, session_id: str) -> str | None:
        session = self.engine.session(session_id)
        lineage = None if session is None else session.get("forkedFrom")
        if not isinstance(lineage, Mapping):
            return None
        source_id = str(lineage["sourceAgentSessionId"])
        cached = self.engine.session(source_id)
        if cached is not None:
            return str(cached["title"])
        try:
            return str(
                self.engine.request(
                    SESSION_GET,
                    SessionParams(workspaceId=self.engine.workspace_id, agentSessionId=source_id),
                )["session"]["title"]
            )
        except (ApiError, TimeoutError):
            return None  # the source is gone: the divider names its id instead

    async def _page_loaded(
        self, session_id: str, after: int, page: TimelineResult, source_title: str | None
    ) -> None:
        if session_id != self.current:
            return
        known = {t["turnId"] for t in self.turns} if after else set()
        fresh = [t.copy() for t in page["turns"] if t["turnId"] not in known]
        self.turns = (self.turns if after else []) + fresh
        self.has_more = page.get("nextSequence") is not None
        self.source_title = source_title
        with contextlib.suppress(NoMatches):  # a page that arrives while the app shuts down
            await self.render()

    def load_more(self) -> None:
        """The next page of the open session's Turns."""
        if self.current and self.turns:
            self._load_page(self.current, int(self.turns[-1]["sequence"]))

    def check_waiting(self) -> None:
        """Whether a request has gone unanswered for a while: the bar says so while it is, and
        a toast says so once when it starts."""
        waiting = self.waits.overdue()
        if waiting == self.waiting:
            return
        self.waiting = waiting
        # The Turns' Fork buttons and "can fork" follow: a fork now would wait as long.
        self.app.run_worker(self.refresh_actions_later())
        if waiting:
            self.app.notify(
                "waiting for the daemon… (not answering; a request gives up after 30 s)",
                title="Daemon",
                severity="warning",
            )

    def update_title(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        widget = self.main.query_one("#session-title", Static)
        if session is None:
            words = "Select a session" if not self.current else "(session not available)"
            widget.update(words + (" · waiting for the daemon…" if self.waiting else ""))
            self._update_fork_session(None, None)
            return
        can = session["lifecycleCapabilities"]["forkThroughTurn"]
        full = bool(session["lifecycleCapabilities"].get("fork"))
        blocked = self.blocked_reason() if (can or full) else None
        widget.update(session_bar_text(session, blocked, waiting=self.waiting))
        self._update_fork_session(session, blocked)

    def _update_fork_session(self, session: Mapping[str, Any] | None, blocked: str | None) -> None:
        """The Session-level Fork (`latestSettled`): shown only when the Session's
        `lifecycleCapabilities.fork` is true; disabled while its fork is in flight
        or while the session is not quiet (the reason in the tooltip)."""
        button = self.main.query_one(f"#{FORK_SESSION_ID}", Button)
        caps = (session or {}).get("lifecycleCapabilities") or {}
        shown = session is not None and bool(caps.get("fork"))
        button.set_class(shown, "-shown")
        if not shown or session is None:
            return
        pending = self.engine.is_fork_pending(str(session["agentSessionId"]), LATEST_SETTLED)
        state = fork_session_button(pending, blocked)
        button.label = state.label
        button.disabled = state.disabled
        button.tooltip = state.tooltip

    def action_for(self, turn: Mapping[str, Any]) -> ForkAction:
        return self._actions()(turn)

    def _actions(self) -> Callable[[Mapping[str, Any]], ForkAction]:
        """`action_for` with the session and whether it is quiet read once, for a render of
        every loaded Turn (not once per Turn: a long transcript renders on every streamed
        piece)."""
        session = self.engine.session(self.current) if self.current else None
        busy = self.blocked_reason() is not None
        source = self.current or ""
        unknown = self.engine.unknown_operations(source) if source else {}

        def action(turn: Mapping[str, Any]) -> ForkAction:
            if session is None:
                return ForkAction.HIDDEN
            turn_id = str(turn["turnId"])
            pending = self.engine.is_fork_pending(source, turn_id)
            return fork_action(session, turn, pending, busy, turn_id in unknown)

        return action

    def _unknowns(self) -> Callable[[Mapping[str, Any]], Mapping[str, Any] | None]:
        """`unknown_for` with the open session's `unknown` operations read once."""
        found = self.engine.unknown_operations(self.current) if self.current else {}
        return lambda turn: found.get(str(turn["turnId"]))

    def unknown_for(self, turn: Mapping[str, Any]) -> Operation | None:
        """The `unknown` fork operation whose boundary is this Turn of the open session."""
        if not self.current:
            return None
        return self.engine.unknown_operations(self.current).get(str(turn["turnId"]))

    def active_turn_id(self) -> str | None:
        """The open session's running Turn: from the session, or a loaded unsettled Turn."""
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            return None
        if session.get("activeTurnId"):
            return str(session["activeTurnId"])
        for turn in reversed(self.turns):
            if turn.get("phase") != "settled":
                return str(turn["turnId"])
        return None

    def blocked_reason(self) -> str | None:
        """Why the open session cannot be forked now (it is not quiet, or the daemon does not
        answer: what the GUI knows of its forks may be stale), or None."""
        active = self.active_turn_id()
        if active:
            return fork_blocked({"activeTurnId": active}, self.turns)
        return NOT_ANSWERING if self.waiting else None

    def pending_interaction(self) -> dict[str, Any] | None:
        for turn in self.turns:
            if turn.get("phase") == "settled":
                continue
            for interaction in turn.get("interactions") or []:
                if interaction.get("status") == "pending":
                    return dict(interaction)
        return None

    async def render(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            if self.current:
                # Deleted under us (another client): its Turns stay to be read, forkable no more.
                await self.refresh_actions()
            return
        await self.main.query_one(TranscriptView).show(
            session,
            with_streams(self.turns, self._streams, self._progress),
            action_for=self._actions(),
            source_title=self.source_title,
            has_more=self.has_more,
            blocked=self.blocked_reason(),
            unknown_for=self._unknowns(),
        )
        await self.update_controls()

    async def update_controls(self) -> None:
        self.update_title()
        self.main.query_one("#interrupt", Button).set_class(
            self.active_turn_id() is not None, "-shown"
        )
        await self.main.query_one(InteractionBar).show_interaction(self.pending_interaction())

    async def refresh_actions_later(self) -> None:
        """`_refresh_actions` from a worker: the screen may be gone by the time it runs."""
        with contextlib.suppress(NoMatches):
            await self.refresh_actions()

    async def refresh_actions(self) -> None:
        await self.main.query_one(TranscriptView).set_actions(
            self._actions(), self.blocked_reason(), self._unknowns()
        )
        self.update_title()

    # -- live updates ------------------------------------------------------------------------

    async def on_daemon_event(self, event: ClientEvent) -> None:
        if isinstance(event, UnknownEvent):
            return  # a newer daemon's event: nothing this view shows
        if event["type"] == TURN_UPDATED:
            await self.merge_turn(event["agentSessionId"], event["turn"])
        elif event["type"] == MESSAGE_DELTA:
            await self.on_delta(event)

    async def on_delta(self, event: MessageDelta) -> None:
        """A streamed piece of a reply: the open Turn's reply grows in place until its settled
        message (same provider item) replaces it. A `progress` piece (the provider retries the
        model request) shows as the Turn's status line until the Turn streams again."""
        if event.get("agentSessionId") != self.current:
            return
        turn_id, kind = str(event.get("turnId")), event.get("kind")
        if kind == "progress":
            self._progress[turn_id] = str(event.get("delta") or "")
        elif kind in ("assistant", "reasoning"):
            had_note = self._progress.pop(turn_id, None) is not None
            if kind == "reasoning" and not had_note:
                return  # reasoning is not shown while it streams
            if kind == "assistant":
                key = (turn_id, str(event.get("itemId")))
                self._streams[key] = self._streams.get(key, "") + str(event.get("delta") or "")
        else:
            return
        await self.render()

    async def merge_turn(self, session_id: str, turn: Turn | EventTurn) -> None:
        """Apply a fresher copy of one Turn (event or submit reply) to the open transcript. An
        event carries only the messages added since the Turn's previous one: it is merged by
        message id, and a Turn it cannot complete (a missed event) is read back whole."""
        if session_id != self.current:
            return
        for index, known in enumerate(self.turns):
            if known["turnId"] == turn["turnId"]:
                if staler(turn, known):
                    return  # e.g. a submit reply that arrives after the settled event
                merged = merged_turn(known, turn)
                if merged is None:
                    self._reload_turn(session_id, turn)
                    return
                if message_count(merged) > message_count(known):
                    self._progress.pop(str(turn["turnId"]), None)  # the model answered
                self.turns[index] = merged
                break
        else:
            if self.has_more:
                return  # beyond the loaded pages: it shows up when they are loaded
            merged = merged_turn(None, turn)
            if merged is None:
                self._reload_turn(session_id, turn)
                return
            self.turns.append(merged)
            self.turns.sort(key=lambda t: int(t["sequence"]))
        await self.render()

    def _reload_turn(self, session_id: str, turn: Turn | EventTurn) -> None:
        """Read one Turn whole (`session.timeline`) and merge it; for an event it missed."""
        params = TimelineParams(
            workspaceId=self.engine.workspace_id,
            agentSessionId=session_id,
            afterSequence=int(turn["sequence"]) - 1,
            limit=1,
        )

        def work() -> None:
            try:
                page = self.engine.request(SESSION_TIMELINE, params)
            except (ApiError, TimeoutError):
                return  # the next event or a reload shows it
            for fresh in page["turns"]:
                if fresh["turnId"] == turn["turnId"]:
                    self.app.call_from_thread(self.merge_turn, session_id, fresh)  # type: ignore[arg-type]

        self.app.run_worker(work, thread=True, group="turns")

    async def clear_transcript(self) -> None:
        await self.main.query_one(TranscriptView).clear()
        await self.update_controls()


def _fork_operation_id(session: Session) -> str | None:
    """The operation that forked `session`, or None for a root."""
    lineage = session.get("forkedFrom")
    return None if lineage is None else lineage.get("operationId")
