"""The Textual application: wires the Engine (fork mutations, session cache, daemon events) to
the session tree, the transcript and the composer, and opens a fork's child on success.

Network calls other than the Engine's non-blocking fork run in thread workers; their results
come back with `call_from_thread`, and Engine changes arrive as `EngineChanged` messages.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Footer, Static, Tree

from agenthost.engine import ChangeKind, Engine, EngineChange, MutationStatus
from agenthost.gui.bridge import EngineChanged, bridge
from agenthost.gui.composer import Composer
from agenthost.gui.session_list import SessionTree
from agenthost.gui.transcript import ForkRequested, LoadMoreRequested, TranscriptView
from agenthost.session_client import ForkAction, fork_action
from transport.client import ApiError
from transport.security import ClientCurve

PAGE_SIZE = 200


class AgentHostApp(App[int]):
    """The GUI. `engine` is owned by the caller unless `own_engine` is set."""

    TITLE = "agenthost"
    CSS = """
    #body { height: 1fr; }
    #sessions { width: 40; border-right: solid $primary 40%; }
    #main { width: 1fr; }
    #session-title { height: auto; padding: 0 1; background: $boost; text-style: bold; }
    #transcript { height: 1fr; }
    #composer { margin: 0 0; }
    """
    BINDINGS = [("ctrl+q", "quit", "Quit"), ("ctrl+r", "reload", "Reload")]

    def __init__(
        self, engine: Engine, *, page_size: int = PAGE_SIZE, own_engine: bool = False
    ) -> None:
        super().__init__()
        self.engine = engine
        self.page_size = page_size
        self.own_engine = own_engine
        self.current: str | None = None
        self.turns: list[dict[str, Any]] = []
        self.has_more = False
        self.source_title: str | None = None
        self._clicked: set[tuple[str, str]] = set()
        self._unbridge: Any = None
        self._tree_dirty = False
        self.sessions_loaded = False

    # -- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield SessionTree(id="sessions")
            with Vertical(id="main"):
                yield Static("Select a session", id="session-title")
                yield TranscriptView(id="transcript")
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

    # -- sessions ----------------------------------------------------------------------------

    def _load_sessions(self) -> None:
        try:
            self.engine.load_sessions()
        except (ApiError, TimeoutError) as exc:
            self.call_from_thread(self.notify, f"cannot list sessions: {exc}", severity="error")
            return
        self.call_from_thread(self._sessions_ready)

    def _sessions_ready(self) -> None:
        self.sessions_loaded = True
        self._refresh_tree()

    def _refresh_tree(self) -> None:
        self._tree_dirty = False
        self.query_one(SessionTree).show_sessions(self.engine.sessions(), self.current)

    def on_tree_node_selected(self, event: Tree.NodeSelected[str]) -> None:
        if event.node.data and event.node.data != self.current:
            self.open_session(event.node.data)

    def action_reload(self) -> None:
        self.run_worker(self._load_sessions, thread=True, group="sessions")
        if self.current:
            self.open_session(self.current)

    # -- the open session --------------------------------------------------------------------

    def open_session(self, session_id: str) -> None:
        self.current = session_id
        self.turns, self.has_more, self.source_title = [], False, None
        self._update_title()
        tree = self.query_one(SessionTree)
        node = tree.node_for(session_id)
        if node is not None:
            tree.show_cursor_on(node)
        self._load_page(session_id, 0)

    def _load_page(self, session_id: str, after: int) -> None:
        self.run_worker(lambda: self._fetch_page(session_id, after), thread=True)

    def _fetch_page(self, session_id: str, after: int) -> None:
        try:
            page = self.engine.request(
                "session.timeline",
                {"agentSessionId": session_id, "afterSequence": after, "limit": self.page_size},
            )
        except (ApiError, TimeoutError) as exc:
            self.call_from_thread(self.notify, f"cannot load turns: {exc}", severity="error")
            return
        title = self._fetch_source_title(session_id)
        self.call_from_thread(self._page_loaded, session_id, after, page, title)  # type: ignore[arg-type]

    def _fetch_source_title(self, session_id: str) -> str | None:
        session = self.engine.session(session_id) or {}
        lineage = session.get("forkedFrom")
        if not isinstance(lineage, Mapping):
            return None
        source_id = str(lineage["sourceAgentSessionId"])
        cached = self.engine.session(source_id)
        if cached is not None:
            return str(cached["title"])
        try:
            return str(
                self.engine.request("session.get", {"agentSessionId": source_id})["session"][
                    "title"
                ]
            )
        except (ApiError, TimeoutError):
            return None  # the source is gone: the divider names its id instead

    async def _page_loaded(
        self, session_id: str, after: int, page: Mapping[str, Any], source_title: str | None
    ) -> None:
        if session_id != self.current:
            return
        known = {t["turnId"] for t in self.turns} if after else set()
        fresh = [dict(t) for t in page["turns"] if t["turnId"] not in known]
        self.turns = (self.turns if after else []) + fresh
        self.has_more = page.get("nextSequence") is not None
        self.source_title = source_title
        await self._render()

    def on_load_more_requested(self, _: LoadMoreRequested) -> None:
        if self.current and self.turns:
            self._load_page(self.current, int(self.turns[-1]["sequence"]))

    def _update_title(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        widget = self.query_one("#session-title", Static)
        if session is None:
            widget.update("Select a session" if not self.current else "(session not available)")
            return
        can = session["lifecycleCapabilities"]["forkThroughTurn"]
        text = Text(str(session["title"]))
        text.append(
            f"   {session['provider']} · fork through turn: {'yes' if can else 'no'}",
            style="dim",
        )
        widget.update(text)

    def action_for(self, turn: Mapping[str, Any]) -> ForkAction:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            return ForkAction.HIDDEN
        pending = self.engine.is_fork_pending(self.current or "", str(turn["turnId"]))
        return fork_action(session, turn, pending)

    async def _render(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            return
        await self.query_one(TranscriptView).show(
            session,
            self.turns,
            action_for=self.action_for,
            source_title=self.source_title,
            has_more=self.has_more,
        )

    # -- fork --------------------------------------------------------------------------------

    async def on_fork_requested(self, message: ForkRequested) -> None:
        key = (message.session_id, message.turn_id)
        self.engine.fork(*key)  # never blocks; a click while in flight sends nothing
        self._clicked.add(key)
        self._after_mutation(key)
        if key[0] == self.current:
            await self._refresh_actions()

    async def _refresh_actions(self) -> None:
        await self.query_one(TranscriptView).set_actions(self.action_for)

    def _after_mutation(self, key: tuple[str, str]) -> None:
        record = self.engine.mutation(*key)
        if key not in self._clicked or record is None:
            return
        if record.status is MutationStatus.SUCCEEDED and record.child_session_id:
            self._clicked.discard(key)
            self._refresh_tree()
            self.open_session(record.child_session_id)
        elif record.status in (MutationStatus.FAILED, MutationStatus.UNKNOWN):
            self._clicked.discard(key)
            hint = (
                " (retry reuses the same identity)"
                if record.status is MutationStatus.UNKNOWN
                else ""
            )
            self.notify(f"fork {record.status.value}: {record.error}{hint}", severity="error")

    # -- live updates ------------------------------------------------------------------------

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
        elif change.kind is ChangeKind.SESSION:
            if self.sessions_loaded and not self._tree_dirty:
                self._tree_dirty = True
                self.call_after_refresh(self._refresh_tree)
            if change.session_id == self.current:
                self._update_title()
                await self._render()  # capabilities may have changed
        elif change.kind is ChangeKind.EVENT and change.event is not None:
            await self._on_daemon_event(change.event)

    async def _on_daemon_event(self, event: Mapping[str, Any]) -> None:
        if event.get("type") == "turn.updated":
            await self.merge_turn(str(event.get("agentSessionId")), event["turn"])

    async def merge_turn(self, session_id: str, turn: Mapping[str, Any]) -> None:
        """Apply a fresher copy of one Turn (event or submit reply) to the open transcript."""
        if session_id != self.current:
            return
        turn = dict(turn)
        for index, known in enumerate(self.turns):
            if known["turnId"] == turn["turnId"]:
                if _staler(turn, known):
                    return  # e.g. a submit reply that arrives after the settled event
                self.turns[index] = turn
                break
        else:
            if self.has_more:
                return  # beyond the loaded pages: it shows up when they are loaded
            self.turns.append(turn)
            self.turns.sort(key=lambda t: int(t["sequence"]))
        await self._render()

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
                "turn.submit",
                {
                    "agentSessionId": session_id,
                    "requestId": str(uuid.uuid4()),
                    "input": [{"type": "text", "text": text}],
                },
            )
        except (ApiError, TimeoutError) as exc:
            self.call_from_thread(self.notify, f"cannot send: {exc}", severity="error")
            return
        self.call_from_thread(self.merge_turn, session_id, result["turn"])  # type: ignore[arg-type]


def _staler(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    if old.get("phase") == "settled":
        return new.get("phase") != "settled"
    if new.get("phase") == "settled":
        return False
    return len(new.get("messages") or []) < len(old.get("messages") or [])


def run_gui(
    api_endpoint: str,
    events_endpoint: str | None,
    workspace_id: str,
    *,
    curve: ClientCurve | None = None,
) -> int:
    """`agenthost gui`: run the app until the user quits; `curve` for a tcp connection file."""
    engine = Engine.connect(api_endpoint, events_endpoint, workspace_id, curve=curve)
    app = AgentHostApp(engine, own_engine=True)
    try:
        app.run()
    finally:
        engine.close()
    return 0
