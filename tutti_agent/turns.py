"""A loaded thread and the execution of its turns: persistence first, then streaming.

Every item is appended (fsynced) to the rollout before its notification is sent, so a
client never sees an item that a crash could lose; one active turn per thread. This module
is the thread's lifecycle and a turn's frame (start, the model's run, the end: completed,
failed or interrupted); what happens inside a turn, step by step, is `tutti_agent.turn_io`."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tutti_agent.errors import ModelError, NoActiveTurn, RolloutUnwritten, ThreadBusy
from tutti_agent.history import (
    InterruptedMarker,
    TurnStatus,
    answer_calls,
    interrupted_marker_item,
    model_context,
    turn_aborted_item,
    unanswered_calls,
)
from tutti_agent.ids import uuid7
from tutti_agent.model import Model, TurnCancelled
from tutti_agent.rollout import LineType, RolloutItem, RolloutWriter
from tutti_agent.store import ThreadHistory, ThreadStore
from tutti_agent.turn_io import ActiveTurn, LiveTurnIO, Peer

# The names under which others knew these (tests wrap `_TurnIO` methods in a daemon's app-server).
_TurnIO = LiveTurnIO
__all__ = ["ENV_CONTEXT_PREFIX", "ActiveTurn", "LiveThread", "Peer", "_TurnIO"]

ENV_CONTEXT_PREFIX = "<environment_context>"


class TurnThreads:
    """The threads that run Turns: one per Turn running, each kept parked for the next Turn
    once its Turn ended (up to `idle_s`, then it ends). A Turn used to start a thread of its
    own: a `clone3`, a stack mapped and the thread's bootstrap, ~60 µs of CPU where a parked
    thread's hand-off is ~13 (a built-in Turn is ~1.2 ms in all). A Turn still has a thread
    of its own while it runs (it may block on an approval or a question for minutes), so no
    Turn ever waits for another's; a Turn's thread is named after it while it runs."""

    def __init__(self, idle_s: float = 60.0) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._parked: list[queue.SimpleQueue[Callable[[], None]]] = []
        self.started = 0
        """Threads started so far (a count a test reads)."""

    def run(self, work: Callable[[], None], name: str) -> None:
        """Run `work` on a parked thread, or on a new one when none is parked."""
        with self._lock:
            inbox = self._parked.pop() if self._parked else None
            if inbox is None:
                self.started += 1
        if inbox is not None:
            inbox.put(lambda: _named(name, work))
            return
        threading.Thread(target=self._serve, args=(work, name), name=name, daemon=True).start()

    def _serve(self, work: Callable[[], None], name: str) -> None:
        inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        job: Callable[[], None] | None = lambda: _named(name, work)  # noqa: E731
        while job is not None:
            try:
                job()
            except BaseException:  # noqa: BLE001 - _run_turn keeps its own; the thread lives on
                import traceback

                traceback.print_exc()
            job = None
            with self._lock:
                self._parked.append(inbox)
            try:
                job = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._parked:
                        self._parked.remove(inbox)  # nobody can hand it work now: end
                        return
                job = inbox.get()  # handed work as the wait ended: it is on its way


def _named(name: str, work: Callable[[], None]) -> None:
    threading.current_thread().name = name
    work()


TURN_THREADS = TurnThreads()


class LiveThread:
    """A thread loaded in this server: its writer, settings and at most one active turn."""

    def __init__(
        self,
        store: ThreadStore,
        history: ThreadHistory,
        writer: RolloutWriter,
        peer: Peer,
        model: Model,
    ) -> None:
        self.store = store
        self.thread_id = history.thread_id
        self.path = history.path
        self.writer = writer
        self.peer = peer
        self.model = model
        self._lock = threading.Lock()
        self.active: ActiveTurn | None = None
        self._last: ActiveTurn | None = None
        """The latest turn started: `active` is cleared before its last notifications are
        written, its `done` only after them (`wait_idle`)."""
        self._has_env_context = any(_is_env_context(line.item) for line in history.lines)
        self._context: list[Mapping[str, Any]] | None = None
        """What the model sees (`model_context` of the history), read from the file by the
        first Turn that asks, then kept as the writer appends: this server's writer is the
        rollout's only one while the thread is loaded, so what was read plus every line
        appended since is the file's. Each Turn reading it back instead parsed the whole
        rollout again (it grew by the last Turn's lines): work that grows with the thread, on
        every Turn. Not made at load (a fork loads its child, which may never run a Turn, and
        a 10,000-Turn history is a 60,000-line pass); None again once an append failed (what
        reached the file is then unknown): the next Turn reads the file again."""
        self._unanswered: set[str] = set()
        """The `call_id`s of the context's `function_call`s no output answers yet, kept with
        `_context` (found when it is read from the file, then as lines append): a request
        gives each an aborted output (`answer_calls`); none, the usual case, costs nothing."""
        settings = store.settings(history)  # one pass over the history's lines, kept with it
        self.cwd = str(settings.get("cwd") or ".")
        # The Session's own model (thread/start `model`), which an HTTP model sends.
        model_name = settings.get("model")
        self.model_name = str(model_name) if model_name else None

    # -- lifecycle --------------------------------------------------------------------
    def status(self) -> str:
        return "active" if self.active is not None else "idle"

    def close(self) -> None:
        self.writer.close()

    def append(self, item: RolloutItem) -> None:
        try:
            self.writer.append(item)
        except OSError as exc:
            self._context = None
            raise RolloutUnwritten(exc) from exc
        except BaseException:
            self._context = None
            raise
        if self._context is not None:
            visible = model_context((item,))  # the same test, one item
            if visible:
                self._context.extend(visible)
                kind, call_id = item.payload.get("type"), item.payload.get("call_id")
                if kind == "function_call" and isinstance(call_id, str):
                    self._unanswered.add(call_id)
                elif kind == "function_call_output":
                    self._unanswered.discard(call_id)  # type: ignore[arg-type]

    def model_input(self) -> list[Mapping[str, Any]]:
        """The model's input for the next request: `model_context` of the thread's history
        as the rollout holds it (a copy: the caller may keep it while later lines append),
        each tool call no output answers given an aborted one (a crash, a full disk or an
        interrupt came between the two lines: the model APIs refuse an unanswered call)."""
        context = self._context
        if context is None:
            context = model_context(self.store.load(self.thread_id).items)
            self._unanswered = unanswered_calls(context)
            self._context = context
        if self._unanswered:
            return answer_calls(context, self._unanswered)
        return list(context)

    def start_turn(self, text: str) -> tuple[dict[str, Any], Callable[[], None]]:
        """Reserve the turn now; the returned starter runs it after the response is sent."""
        with self._lock:
            if self.active is not None:
                raise ThreadBusy(
                    f"thread {self.thread_id} already has an active turn {self.active.turn_id}"
                )
            turn = ActiveTurn(uuid7())
            self.active = self._last = turn
        wire: dict[str, Any] = {
            "id": turn.turn_id,
            "rootTurnId": turn.turn_id,
            "items": [],
            "itemsView": "notLoaded",
            "status": "inProgress",
            "error": None,
            "startedAt": None,
            "completedAt": None,
            "durationMs": None,
        }

        def starter() -> None:
            TURN_THREADS.run(lambda: self._run_turn(turn, text), f"turn-{turn.turn_id}")

        return wire, starter

    def interrupt(self, turn_id: str) -> None:
        with self._lock:
            active = self.active
        if active is None:
            raise NoActiveTurn()
        if active.turn_id != turn_id:
            raise NoActiveTurn()
        active.cancel()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Whether the thread's turns all ended, their notifications written, within
        `timeout_s`: a server that exits once its client closed stdin must not leave a turn's
        daemon thread still writing `turn/completed` to stdout (the interpreter's shutdown
        then aborts on the stream's lock)."""
        with self._lock:
            last = self.active or self._last
        return True if last is None else last.done.wait(timeout_s)

    # -- turn execution ---------------------------------------------------------------
    def _run_turn(self, turn: ActiveTurn, text: str) -> None:
        io = LiveTurnIO(self, turn)
        started_at = int(time.time())
        t0 = time.monotonic()
        status = TurnStatus.COMPLETED
        error: str | None = None
        try:
            try:
                self.append(
                    RolloutItem(
                        LineType.EVENT_MSG,
                        {"type": "task_started", "turn_id": turn.turn_id, "started_at": started_at},
                    )
                )
                self.peer.notify(
                    "thread/status/changed",
                    {"threadId": self.thread_id, "status": {"type": "active", "activeFlags": []}},
                )
                self.peer.notify(
                    "turn/started",
                    {
                        "threadId": self.thread_id,
                        "turn": _turn_wire(
                            turn.turn_id, [], "inProgress", None, started_at, None, None
                        ),
                    },
                )
                if not self._has_env_context:
                    # Like Codex: the first turn carries the environment context, model-visible but
                    # never a user turn (it must not count for Nth-user truncation).
                    self.append(_env_context_item(self.cwd))
                    self._has_env_context = True
                self.append(_message_item("user", "input_text", text))
                io.emit_item(
                    {
                        "type": "userMessage",
                        "id": uuid7(),
                        "clientId": None,
                        "content": [{"type": "text", "text": text, "text_elements": []}],
                    }
                )
            except RolloutUnwritten as exc:
                # The rollout cannot be written (a full disk, a failing one): the model is not
                # asked, and the turn still ends, or its client would wait for an end that never
                # comes (the host until its inactivity limit, the Session refusing turns).
                status, error = TurnStatus.FAILED, exc.message
            else:
                try:
                    self.model.run(text, io)
                except TurnCancelled:
                    status = TurnStatus.INTERRUPTED
                except (ModelError, RolloutUnwritten) as exc:
                    status, error = TurnStatus.FAILED, str(exc)
                except Exception as exc:  # noqa: BLE001 - any model crash fails only this turn
                    status, error = TurnStatus.FAILED, f"{type(exc).__name__}: {exc}"
            if status == TurnStatus.COMPLETED and turn.cancelled.is_set():
                status = TurnStatus.INTERRUPTED
            completed_at = int(time.time())
            duration_ms = int((time.monotonic() - t0) * 1000)
            try:
                if status == TurnStatus.INTERRUPTED:
                    marker = interrupted_marker_item(InterruptedMarker.CONTEXTUAL_USER)
                    if marker is not None:
                        self.append(marker)
                    self.append(
                        turn_aborted_item(
                            turn.turn_id,
                            started_at,
                            completed_at=completed_at,
                            duration_ms=duration_ms,
                        )
                    )
                else:
                    if error is not None:
                        self.append(
                            RolloutItem(
                                LineType.EVENT_MSG,
                                {"type": "error", "turn_id": turn.turn_id, "message": error},
                            )
                        )
                    self.append(
                        RolloutItem(
                            LineType.EVENT_MSG,
                            {
                                "type": "task_complete",
                                "turn_id": turn.turn_id,
                                "last_agent_message": io.last_agent_message,
                                "started_at": started_at,
                                "completed_at": completed_at,
                                "duration_ms": duration_ms,
                            },
                        )
                    )
            except RolloutUnwritten as exc:
                # Its end is not in the rollout: the turn failed, whatever it had come to.
                status, error = TurnStatus.FAILED, error or exc.message
            with self._lock:
                self.active = None
            self.peer.notify(
                "thread/status/changed", {"threadId": self.thread_id, "status": {"type": "idle"}}
            )
            self.peer.notify(
                "turn/completed",
                {
                    "threadId": self.thread_id,
                    "turn": _turn_wire(
                        turn.turn_id,
                        io.items,
                        str(status),
                        {"message": error} if error is not None else None,
                        started_at,
                        completed_at,
                        duration_ms,
                    ),
                },
            )
        finally:
            with self._lock:
                if self.active is turn:
                    self.active = None
            turn.done.set()


def _turn_wire(
    turn_id: str,
    items: list[dict[str, Any]],
    status: str,
    error: Mapping[str, Any] | None,
    started_at: int | None,
    completed_at: int | None,
    duration_ms: int | None,
) -> dict[str, Any]:
    return {
        "id": turn_id,
        "rootTurnId": turn_id,
        "items": items,
        "itemsView": "full" if items else "notLoaded",
        "status": status,
        "error": dict(error) if error is not None else None,
        "startedAt": started_at,
        "completedAt": completed_at,
        "durationMs": duration_ms,
    }


def _message_item(role: str, content_type: str, text: str) -> RolloutItem:
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {"type": "message", "role": role, "content": [{"type": content_type, "text": text}]},
    )


def _env_context_item(cwd: str) -> RolloutItem:
    text = f"{ENV_CONTEXT_PREFIX}\n  <cwd>{cwd}</cwd>\n</environment_context>"
    return _message_item("user", "input_text", text)


def _is_env_context(item: RolloutItem) -> bool:
    if item.type != LineType.RESPONSE_ITEM or item.payload.get("role") != "user":
        return False
    content = item.payload.get("content") or []
    return any(
        isinstance(c, Mapping) and str(c.get("text", "")).startswith(ENV_CONTEXT_PREFIX)
        for c in content
    )
