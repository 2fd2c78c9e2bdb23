"""The Textual application: wires the Engine (fork mutations, session cache, daemon events) to
the session tree, the transcript and the composer, and opens a fork's child on success.

Network calls other than the Engine's non-blocking fork run in thread workers; their results
come back with `call_from_thread`, and Engine changes arrive as `EngineChanged` messages.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Static, Tree

from client.engine import LATEST_SETTLED, ChangeKind, Engine, EngineChange, MutationStatus
from client.gui.bridge import EngineChanged, bridge
from client.gui.composer import Composer
from client.gui.controls import (
    ANSWER_INPUT_ID,
    ConfirmScreen,
    InteractionBar,
    NewSessionScreen,
    RenameScreen,
)
from client.gui.resolve import ResolveScreen, resolved_words
from client.gui.session_list import SessionTree
from client.gui.transcript import (
    ForkRequested,
    InspectRequested,
    LoadMoreRequested,
    TranscriptView,
)
from client.lineage_view import LineageMark, lineage_marks
from client.session_client import (
    ForkAction,
    error_words,
    fork_action,
    fork_blocked,
    fork_refusal,
)
from transport.client import ApiError
from transport.client import merge_turn as merged_turn
from transport.security import ClientCurve

PAGE_SIZE = 200
FORK_SESSION_ID = "fork-session"


class AgentHostApp(App[int]):
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
        super().__init__()
        self.engine = engine
        self.page_size = page_size
        self.own_engine = own_engine
        self.current: str | None = None
        self.turns: list[dict[str, Any]] = []
        # Replies streaming in (message.delta) by (turn id, provider item id); not durable.
        self._streams: dict[tuple[str, str], str] = {}
        self.has_more = False
        self.source_title: str | None = None
        self._clicked: set[tuple[str, str]] = set()
        self._unbridge: Any = None
        self._tree_dirty = False
        self.sessions_loaded = False
        # session.lineage marks of the session list (ordinals, deleted ancestors), recomputed
        # only when the set of sessions or their lineage changes.
        self.marks: dict[str, LineageMark] = {}
        self._marks_for: frozenset[tuple[str, str | None]] | None = None

    # -- layout ------------------------------------------------------------------------------

    @property
    def _main(self) -> Any:
        """The main screen: its widgets are queried even while a dialog (resolve, rename, …) is
        on top, so an Engine change that arrives then still updates them."""
        return self.screen_stack[0] if self.screen_stack else self

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

    # -- sessions ----------------------------------------------------------------------------

    def _load_sessions(self) -> None:
        try:
            self.engine.load_sessions()
        except (ApiError, TimeoutError) as exc:
            self.call_from_thread(self.notify, error_words("list sessions", exc), severity="error")
            return
        self.call_from_thread(self._sessions_ready)

    def _sessions_ready(self) -> None:
        self.sessions_loaded = True
        self._refresh_tree()

    def _refresh_tree(self) -> None:
        self._tree_dirty = False
        sessions = self.engine.sessions()
        try:
            tree = self._main.query_one(SessionTree)
        except NoMatches:
            return  # shutting down (a refresh scheduled just before the screen went)
        tree.show_sessions(sessions, self.current, self.marks)
        shape = frozenset(
            (str(s["agentSessionId"]), (s.get("forkedFrom") or {}).get("operationId"))
            for s in sessions
        )
        if shape != self._marks_for:
            self._marks_for = shape
            self.run_worker(
                lambda: self._load_marks(sessions, shape),
                thread=True,
                group="lineage",
                exclusive=True,
                exit_on_error=False,  # marks are decoration: never take the GUI down
            )

    def _load_marks(
        self, sessions: list[dict[str, Any]], shape: frozenset[tuple[str, str | None]]
    ) -> None:
        def fetch(sid: str) -> dict[str, Any] | None:
            try:
                return self.engine.request("session.lineage", {"agentSessionId": sid})
            except (ApiError, TimeoutError):
                return None  # deleted meanwhile: the next refresh asks again

        marks = lineage_marks(sessions, fetch)
        with contextlib.suppress(RuntimeError):  # the app stopped meanwhile
            self.call_from_thread(self._marks_loaded, marks, shape)

    def _marks_loaded(
        self, marks: dict[str, LineageMark], shape: frozenset[tuple[str, str | None]]
    ) -> None:
        if shape != self._marks_for:
            return  # a newer list is being marked
        if marks != self.marks:
            self.marks = marks
            # The answer may arrive while the app shuts down: its widgets may be gone.
            with contextlib.suppress(NoMatches):
                self._main.query_one(SessionTree).show_sessions(
                    self.engine.sessions(), self.current, self.marks
                )

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
        tree = self._main.query_one(SessionTree)
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
            self.call_from_thread(self.notify, error_words("load turns", exc), severity="error")
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
        with contextlib.suppress(NoMatches):  # a page that arrives while the app shuts down
            await self._render()

    def on_load_more_requested(self, _: LoadMoreRequested) -> None:
        if self.current and self.turns:
            self._load_page(self.current, int(self.turns[-1]["sequence"]))

    def _update_title(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        widget = self._main.query_one("#session-title", Static)
        if session is None:
            widget.update("Select a session" if not self.current else "(session not available)")
            self._update_fork_session(None, None)
            return
        can = session["lifecycleCapabilities"]["forkThroughTurn"]
        text = Text(str(session["title"]))
        text.append(
            f"   {session['provider']} · fork through turn: {'yes' if can else 'no'}",
            style="dim",
        )
        full = bool(session["lifecycleCapabilities"].get("forkFullSession"))
        blocked = self.blocked_reason() if (can or full) else None
        if blocked:
            # Said here too, not only in the Fork tooltip: a keyboard user never hovers.
            text.append(f" (not now: {blocked})", style="dim italic")
        widget.update(text)
        self._update_fork_session(session, blocked)

    def _update_fork_session(self, session: Mapping[str, Any] | None, blocked: str | None) -> None:
        """The Session-level Fork (`latestSettled`, issue 21 §2): shown only when the Session's
        `lifecycleCapabilities.forkFullSession` is true; disabled while its fork is in flight
        or while the session is not quiet (the reason in the tooltip)."""
        button = self._main.query_one(f"#{FORK_SESSION_ID}", Button)
        caps = (session or {}).get("lifecycleCapabilities") or {}
        shown = session is not None and bool(caps.get("forkFullSession"))
        button.set_class(shown, "-shown")
        if not shown or session is None:
            return
        pending = self.engine.is_fork_pending(str(session["agentSessionId"]), LATEST_SETTLED)
        button.label = "Forking…" if pending else "Fork session"
        button.disabled = pending or blocked is not None
        if pending:
            button.tooltip = "A fork of this whole session is in progress"
        elif blocked is not None:
            button.tooltip = f"Cannot fork now: {blocked}"
        else:
            button.tooltip = "Fork the whole session from where it is now (its latest turn)"

    def action_for(self, turn: Mapping[str, Any]) -> ForkAction:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            return ForkAction.HIDDEN
        pending = self.engine.is_fork_pending(self.current or "", str(turn["turnId"]))
        return fork_action(session, turn, pending, self.blocked_reason() is not None)

    def unknown_for(self, turn: Mapping[str, Any]) -> dict[str, Any] | None:
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
        """Why the open session cannot be forked now (it is not quiet), or None."""
        active = self.active_turn_id()
        return fork_blocked({"activeTurnId": active}, self.turns) if active else None

    def pending_interaction(self) -> dict[str, Any] | None:
        for turn in self.turns:
            if turn.get("phase") == "settled":
                continue
            for interaction in turn.get("interactions") or []:
                if interaction.get("status") == "pending":
                    return dict(interaction)
        return None

    async def _render(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            return
        await self._main.query_one(TranscriptView).show(
            session,
            self._with_streams(self.turns),
            action_for=self.action_for,
            source_title=self.source_title,
            has_more=self.has_more,
            blocked=self.blocked_reason(),
            unknown_for=self.unknown_for,
        )
        await self._update_controls()

    async def _update_controls(self) -> None:
        self._update_title()
        self._main.query_one("#interrupt", Button).set_class(
            self.active_turn_id() is not None, "-shown"
        )
        await self._main.query_one(InteractionBar).show_interaction(self.pending_interaction())

    # -- fork --------------------------------------------------------------------------------

    async def on_fork_requested(self, message: ForkRequested) -> None:
        key = (message.session_id, message.turn_id)
        self.engine.fork(*key)  # never blocks; a click while in flight sends nothing
        self._clicked.add(key)
        self._after_mutation(key)
        if key[0] == self.current:
            await self._refresh_actions()

    async def _refresh_actions_later(self) -> None:
        """`_refresh_actions` from a worker: the screen may be gone by the time it runs."""
        with contextlib.suppress(NoMatches):
            await self._refresh_actions()

    async def _refresh_actions(self) -> None:
        await self._main.query_one(TranscriptView).set_actions(
            self.action_for, self.blocked_reason(), self.unknown_for
        )
        self._update_title()

    def action_fork_session(self) -> None:
        """The Session-level Fork: through the Engine's `latestSettled` entry (same identity,
        replay and ACK rules as a Turn's Fork)."""
        session = self.engine.session(self.current) if self.current else None
        caps = (session or {}).get("lifecycleCapabilities") or {}
        if session is None or not caps.get("forkFullSession"):
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

    # -- resolve an unknown fork (issue 21 §1) ------------------------------------------------

    def on_inspect_requested(self, message: InspectRequested) -> None:
        label = self._turn_label(message.turn_id)

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

    def _turn_label(self, turn_id: str) -> str:
        for turn in self.turns:
            if turn.get("turnId") == turn_id:
                return f"Turn {turn['sequence']}"
        return f"turn {turn_id[:8]}"

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
            if record.error_detail is not None:
                detail = record.error_detail
                text = fork_refusal(
                    str(detail.get("reason") or record.error),
                    detail.get("params"),
                    turn_id=record.turn_id,
                    turns=self.turns if key[0] == self.current else [],
                    session=self.engine.session(key[0]),
                    message=detail.get("message"),
                    latest=record.point != "throughTurn",
                )
            elif record.status is MutationStatus.UNKNOWN:
                text = (
                    f"the fork's result is unknown ({record.error}); "
                    "Fork again to retry with the same identity (it never forks twice)"
                )
            else:
                text = f"the fork failed: {record.error}"
            self.notify(text, title="Fork", severity="error", timeout=10)

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

    async def _on_daemon_event(self, event: Mapping[str, Any]) -> None:
        if event.get("type") == "turn.updated":
            await self.merge_turn(str(event.get("agentSessionId")), event["turn"])
        elif event.get("type") == "message.delta":
            await self._on_delta(event)

    async def _on_delta(self, event: Mapping[str, Any]) -> None:
        """A streamed piece of a reply: the open Turn's reply grows in place until its settled
        message (same provider item) replaces it."""
        if event.get("agentSessionId") != self.current or event.get("kind") != "assistant":
            return
        key = (str(event.get("turnId")), str(event.get("itemId")))
        self._streams[key] = self._streams.get(key, "") + str(event.get("delta") or "")
        await self._render()

    def _with_streams(self, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The loaded Turns, each active one with its replies streamed so far appended as
        provisional assistant messages (until a message of that provider item exists)."""
        if not self._streams:
            return turns
        out = []
        for turn in turns:
            streams = [(i, t) for (tid, i), t in self._streams.items() if tid == turn["turnId"]]
            if not streams:
                out.append(turn)
                continue
            if turn.get("phase") == "settled":
                for item, _ in streams:
                    self._streams.pop((str(turn["turnId"]), item), None)
                out.append(turn)
                continue
            have = {
                str((m.get("payload") or {}).get("providerItemId"))
                for m in turn.get("messages") or []
            }
            extra = [
                {
                    "messageId": f"stream-{item}",
                    "turnId": turn["turnId"],
                    "kind": "assistant",
                    "text": text,
                    "payload": {"providerItemId": item, "streaming": True},
                    "version": 0,
                }
                for item, text in streams
                if item not in have
            ]
            out.append({**turn, "messages": [*(turn.get("messages") or []), *extra]})
        return out

    async def merge_turn(self, session_id: str, turn: Mapping[str, Any]) -> None:
        """Apply a fresher copy of one Turn (event or submit reply) to the open transcript. An
        event carries only the messages added since the Turn's previous one: it is merged by
        message id, and a Turn it cannot complete (a missed event) is read back whole."""
        if session_id != self.current:
            return
        for index, known in enumerate(self.turns):
            if known["turnId"] == turn["turnId"]:
                if _staler(turn, known):
                    return  # e.g. a submit reply that arrives after the settled event
                merged = merged_turn(known, turn)
                if merged is None:
                    self._reload_turn(session_id, turn)
                    return
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
        await self._render()

    def _reload_turn(self, session_id: str, turn: Mapping[str, Any]) -> None:
        """Read one Turn whole (`session.timeline`) and merge it; for an event it missed."""
        params = {
            "agentSessionId": session_id,
            "afterSequence": int(turn["sequence"]) - 1,
            "limit": 1,
        }

        def work() -> None:
            try:
                page = self.engine.request("session.timeline", params)
            except (ApiError, TimeoutError):
                return  # the next event or a reload shows it
            for fresh in page["turns"]:
                if fresh["turnId"] == turn["turnId"]:
                    self.call_from_thread(self.merge_turn, session_id, fresh)  # type: ignore[arg-type]

        self.run_worker(work, thread=True, group="turns")

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
            self.call_from_thread(self.notify, error_words("send", exc), severity="error")
            return
        self.call_from_thread(self.merge_turn, session_id, result["turn"])  # type: ignore[arg-type]

    # -- everyday controls -------------------------------------------------------------------

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

    def _call(
        self,
        action: str,
        method: str,
        params: dict[str, Any],
        then: Callable[[dict[str, Any]], Any] | None = None,
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
            "turn.interrupt",
            {"agentSessionId": self.current, "turnId": turn_id},
            lambda result: self.merge_turn(str(self.current), result["turn"]),
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "interrupt":
            event.stop()
            self.action_interrupt()
        elif event.button.id == FORK_SESSION_ID:
            event.stop()
            self.action_fork_session()

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
            "interaction.respond",
            {
                "agentSessionId": session_id,
                "turnId": interaction["turnId"],
                "requestId": interaction["requestId"],
                "response": message.response,
            },
            lambda result: (
                self.merge_turn(session_id, result["turn"]) if "turn" in result else None
            ),
        )

    def action_new_session(self) -> None:
        def created(result: dict[str, Any]) -> None:
            session = result["session"]
            self.engine.upsert_session(session)
            self._refresh_tree()
            self.open_session(str(session["agentSessionId"]))

        def chosen(choice: tuple[str, str] | None) -> None:
            if choice is None:
                return
            provider, title = choice
            params: dict[str, Any] = {"provider": provider, "cwd": os.getcwd()}
            if title:
                params["title"] = title
            self._call("create the session", "session.create", params, created)

        self.push_screen(NewSessionScreen(), chosen)

    async def _clear_transcript(self) -> None:
        transcript = self._main.query_one(TranscriptView)
        await transcript.remove_children()
        transcript.session_id = None
        await self._update_controls()

    def action_rename_session(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            self.notify("open a session first", severity="warning")
            return
        session_id = str(session["agentSessionId"])

        def renamed(result: dict[str, Any]) -> None:
            self.engine.upsert_session(result["session"])
            self._refresh_tree()
            self._update_title()

        def chosen(title: str | None) -> None:
            if title:
                self._call(
                    "rename the session",
                    "session.updateTitle",
                    {"agentSessionId": session_id, "title": title},
                    renamed,
                )

        self.push_screen(RenameScreen(str(session["title"])), chosen)

    def action_delete_session(self) -> None:
        session = self.engine.session(self.current) if self.current else None
        if session is None:
            self.notify("open a session first", severity="warning")
            return
        session_id = str(session["agentSessionId"])

        def deleted(_: dict[str, Any]) -> None:
            self.engine.handle_event(
                {
                    "type": "session.removed",
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
            self.notify(f"deleted {session['title']}")

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._call(
                    "delete the session",
                    "session.delete",
                    {"agentSessionId": session_id},
                    deleted,
                )

        self.push_screen(
            ConfirmScreen(f"Delete session {session['title']!r}? This cannot be undone."),
            confirmed,
        )


def _staler(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    if old.get("phase") == "settled":
        return new.get("phase") != "settled"
    if new.get("phase") == "settled":
        return False
    return _message_count(new) < _message_count(old)


def _message_count(turn: Mapping[str, Any]) -> int:
    """The Turn's message count (an event that carries some of them says how many there are)."""
    count = turn.get("messageCount")
    return count if isinstance(count, int) else len(turn.get("messages") or [])


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
