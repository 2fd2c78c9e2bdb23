"""The app-server: newline-delimited JSON-RPC on stdio in the Codex app-server shapes.

Owns the envelope (requests, responses, notifications, server-to-client requests), the
method table and the set of loaded threads; semantics live in fork.py, turns.py, store.py."""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from tutti_agent import __version__
from tutti_agent.errors import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    AppServerError,
    InternalError,
    InvalidParams,
    NoRolloutFound,
    ThreadBusy,
    ThreadNotFound,
    ThreadNotLoaded,
)
from tutti_agent.fork import (
    BeforeTurn,
    ForkHooks,
    ForkOptions,
    ForkPersistence,
    ForkService,
    Latest,
    ThroughTurn,
    parse_snapshot,
)
from tutti_agent.history import InterruptedMarker, TurnRecord
from tutti_agent.ids import parse_thread_id, uuid7
from tutti_agent.model import Model
from tutti_agent.rollout import gc_paused, now_iso
from tutti_agent.store import ThreadHead, ThreadHistory, ThreadStore
from tutti_agent.turns import LiveThread
from tutti_agent.wire import (
    encode_message,
    encode_notification,
    head_to_wire,
    thread_to_wire,
    turn_columns,
    turn_to_wire,
)

Handler = Callable[[Mapping[str, Any]], "Reply"]


class Reply:
    """A handler's result plus an optional action to run once the response is written."""

    __slots__ = ("result", "then")

    def __init__(self, result: Mapping[str, Any], then: Callable[[], None] | None = None):
        self.result = result
        self.then = then


class Connection:
    """Serialized writes to the client and the table of pending server->client requests."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int | str, tuple[threading.Event, list[Any]]] = {}

    def send(self, message: Mapping[str, Any]) -> None:
        self._write(encode_message(message) + "\n")

    def _write(self, data: str) -> None:
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the client is gone; turns still finish and persist

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self._write(encode_notification(method, params) + "\n")

    def request(
        self, method: str, params: Mapping[str, Any], cancelled: threading.Event
    ) -> tuple[int | str, Mapping[str, Any] | None]:
        done = threading.Event()
        slot: list[Any] = []
        with self._lock:
            request_id: int | str = self._next_id
            self._next_id += 1
            self._pending[request_id] = (done, slot)
        self.send({"id": request_id, "method": method, "params": dict(params)})
        try:
            while not done.wait(0.05):
                if cancelled.is_set():
                    return request_id, None
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
        result = slot[0] if slot else None
        return request_id, result if isinstance(result, Mapping) else None

    def resolve(self, request_id: int | str, result: object) -> None:
        with self._lock:
            entry = self._pending.get(request_id)
        if entry is not None:
            entry[1].append(result)
            entry[0].set()


class AppServer:
    """One app-server session over a pair of text streams."""

    def __init__(
        self,
        store: ThreadStore,
        model: Model,
        out: IO[str],
        *,
        hooks: ForkHooks | None = None,
    ) -> None:
        self.store = store
        self.model = model
        self.conn = Connection(out)
        self.forks = ForkService(store, hooks)
        self.threads: dict[str, LiveThread] = {}
        self._threads_lock = threading.Lock()
        self._unloadable: dict[str, AppServerError] = {}
        """Threads whose deferred load after a resume failed, with the failure."""
        self._initialized = False
        self.methods: dict[str, Handler] = {
            "initialize": self.initialize,
            "thread/start": self.thread_start,
            "thread/resume": self.thread_resume,
            "thread/read": self.thread_read,
            "thread/turns/list": self.thread_turns_list,
            "thread/fork": self.thread_fork,
            "thread/unsubscribe": self.thread_unsubscribe,
            "thread/loaded/list": self.thread_loaded_list,
            "thread/delete": self.thread_delete,
            "turn/start": self.turn_start,
            "turn/interrupt": self.turn_interrupt,
        }

    # -- envelope ---------------------------------------------------------------------
    def serve(self, inp: IO[str]) -> None:
        for raw in inp:
            raw = raw.strip()
            if raw:
                self.handle_line(raw)
        self.shutdown()

    def shutdown(self) -> None:
        with self._threads_lock:
            threads = list(self.threads.values())
        for t in threads:
            if t.active is not None:
                t.active.cancel()
        for t in threads:
            t.wait_idle(10.0)
            t.close()

    def handle_line(self, raw: str) -> None:
        try:
            if not raw.isascii():
                raw.encode()  # a line holding bytes that are no UTF-8 (`cli`'s decoder kept
                # them as lone surrogates) is no JSON text: refused as one
            msg = json.loads(raw)
        except ValueError:
            self.conn.send({"id": None, "error": {"code": -32700, "message": "parse error"}})
            return
        if not isinstance(msg, dict):
            self.conn.send({"id": None, "error": {"code": -32600, "message": "invalid message"}})
            return
        method = msg.get("method")
        if method is None and "id" in msg:
            # A response to one of our server->client requests.
            self.conn.resolve(msg["id"], msg.get("result") if "result" in msg else None)
            return
        if "id" not in msg:
            return  # notifications (`initialized`, ...) need no answer
        self._dispatch(msg["id"], str(method), msg.get("params") or {})

    def _dispatch(self, request_id: object, method: str, params: object) -> None:
        handler = self.methods.get(method)
        try:
            if handler is None:
                err = {"code": METHOD_NOT_FOUND, "message": f"unknown method: {method}"}
                self.conn.send({"id": request_id, "error": err})
                return
            if not isinstance(params, Mapping):
                raise InvalidParams("params must be an object")
            if not self._initialized and method != "initialize":
                raise AppServerError("Not initialized")
            with gc_paused():  # a request may read or build a 10,000-Turn history
                reply = handler(params)
        except AppServerError as exc:
            self.conn.send({"id": request_id, "error": exc.to_wire()})
            return
        except Exception as exc:  # noqa: BLE001 - the server never dies on a request
            err = {"code": INTERNAL_ERROR, "message": f"internal error: {exc}"}
            self.conn.send({"id": request_id, "error": err})
            return
        self.conn.send({"id": request_id, "result": dict(reply.result)})
        if reply.then is not None:
            reply.then()

    # -- helpers ----------------------------------------------------------------------
    def _live(self, thread_id: str) -> LiveThread | None:
        with self._threads_lock:
            return self.threads.get(thread_id)

    def _load_live(self, history: ThreadHistory) -> LiveThread:
        self.model.warm()  # an HTTP model readies its client while the Session starts
        with self._threads_lock:
            self._unloadable.pop(history.thread_id, None)  # loaded now: that failure is past
            live = self.threads.get(history.thread_id)
            if live is None:
                writer = self.store.open_writer(history)
                live = LiveThread(self.store, history, writer, self.conn, self.model)
                self.threads[history.thread_id] = live
            return live

    def _thread_payload(
        self,
        history: ThreadHistory,
        *,
        include_turns: bool,
        turns: Sequence[TurnRecord] | None = None,
        with_items: bool = True,
        settings: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        live = self._live(history.thread_id)
        status = live.status() if live is not None else "notLoaded"
        if include_turns and turns is None:
            turns = self.store.turns(history, with_items=with_items)
        if settings is None:
            settings = self.store.settings(history)  # kept with the history's parse
        return thread_to_wire(
            history,
            status=status,
            include_turns=include_turns,
            turns=turns,
            with_items=with_items,
            settings=settings,
        )

    def _session_result(
        self,
        history: ThreadHistory,
        *,
        include_turns: bool,
        turns: Sequence[TurnRecord] | None = None,
        with_items: bool = True,
        settings: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`settings`: the history's `effective_settings()`, when the caller knows them."""
        if settings is None:
            settings = self.store.settings(history)  # kept with the history's parse
        return {
            "thread": self._thread_payload(
                history,
                include_turns=include_turns,
                turns=turns,
                with_items=with_items,
                settings=settings,
            ),
            "model": settings.get("model"),
            "modelProvider": settings.get("model_provider"),
            "cwd": settings.get("cwd"),
            "approvalPolicy": "onRequest",
            "sandbox": {"type": "readOnly", "networkAccess": False},
        }

    @staticmethod
    def _turn_items(params: Mapping[str, Any]) -> bool:
        """`turnItems` (ours; default true): false projects each turn without its items
        (`items: []`, `itemsView: "notLoaded"`), for a caller that reads only the turns' ids
        and statuses (a 10,000-Turn thread's items are a 5 MB answer)."""
        value = params.get("turnItems", True)
        if not isinstance(value, bool):
            raise InvalidParams("turnItems must be a boolean")
        return value

    @staticmethod
    def _turn_columns(params: Mapping[str, Any]) -> bool:
        """`turnColumns` (ours; default false): true answers the turns as `thread.turnIds` and
        `thread.turnStatuses` (`turn_columns`), `thread.turns: []`, for a caller that reads only
        their ids and statuses (the host's fork: a 10,000-Turn thread's turns are 2.3 MB as
        objects, ~0.2 MB as columns)."""
        value = params.get("turnColumns", False)
        if not isinstance(value, bool):
            raise InvalidParams("turnColumns must be a boolean")
        return value

    @staticmethod
    def _thread_id(params: Mapping[str, Any], key: str = "threadId") -> str:
        if key not in params:
            raise InvalidParams(f"missing field `{key}`")
        return parse_thread_id(params[key])

    # -- methods ----------------------------------------------------------------------
    def initialize(self, params: Mapping[str, Any]) -> Reply:
        if self._initialized:
            raise AppServerError("Already initialized")
        self._initialized = True
        machine = platform.machine() or "unknown"
        return Reply(
            {
                "userAgent": f"tutti_agent/{__version__} ({platform.system()}; {machine})",
                "tuttiAgentHome": str(self.store.home),
                "platformFamily": "unix" if sys.platform != "win32" else "windows",
                "platformOs": sys.platform,
            }
        )

    def thread_start(self, params: Mapping[str, Any]) -> Reply:
        cwd = params.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise InvalidParams("cwd must be a string")
        thread_id = uuid7()
        meta = {
            "id": thread_id,
            "session_id": thread_id,
            "timestamp": now_iso(),
            "cwd": cwd or ".",
            "originator": "tutti_agent",
            "cli_version": __version__,
            "source": "appServer",
            "model_provider": self.model.provider,
            "model": params.get("model") or self.model.name,
        }
        writer = self.store.create_rollout(thread_id, meta)
        writer.close()
        history = self.store.load(thread_id)
        self._load_live(history)
        result = self._session_result(history, include_turns=True)
        started = {"thread": result["thread"]}
        return Reply(result, lambda: self.conn.notify("thread/started", started))

    def thread_resume(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        with_items = self._turn_items(params)
        if params.get("excludeTurns", False) and self._live(thread_id) is None:
            with self._threads_lock:
                failed = self._unloadable.pop(thread_id, None) is not None
            # A resume whose answer leaves the turns out answers from the rollout's head; the
            # history is loaded right after the answer has left, before the next request is
            # read (a host reads only the thread's id, and starts its fork meanwhile). One whose
            # deferred load failed is read whole again, and answers that failure.
            head = None if failed else self.store.head(thread_id)
            if head is not None:
                return Reply(self._head_result(head), lambda: self._load_resumed(thread_id))
        history = self.store.load(thread_id)
        self._load_live(history)
        return Reply(
            self._session_result(
                history,
                include_turns=not params.get("excludeTurns", False),
                with_items=with_items,
            )
        )

    def _head_result(
        self,
        head: ThreadHead,
        *,
        status: str = "idle",
        turns: Sequence[TurnRecord] | None = None,
        with_items: bool = True,
    ) -> dict[str, Any]:
        """`_session_result` from a thread's head alone: of a thread about to be loaded
        (idle), without its turns, or of a fork's unopened child with the prefix's turns."""
        settings = head.settings
        return {
            "thread": head_to_wire(head, status=status, turns=turns, with_items=with_items),
            "model": settings.get("model"),
            "modelProvider": settings.get("model_provider"),
            "cwd": settings.get("cwd"),
            "approvalPolicy": "onRequest",
            "sandbox": {"type": "readOnly", "networkAccess": False},
        }

    def _load_resumed(self, thread_id: str) -> None:
        """A resume's deferred load: the history loaded and the thread made live, as the
        resume would have before answering; then, on a thread of its own, its turns reduced
        without items and made the turns' columns (what a host reads of a source before it forks
        it, `turnColumns`: the `thread/read` that follows finds them made, or waits for the
        reduction). A history
        that fails to load leaves the thread unloaded; the next `turn/start` on it, and the
        next `thread/resume`, load it whole again (and answer the failure if it holds)."""
        try:
            with gc_paused():
                history = self.store.load(thread_id)
                self._load_live(history)
        except AppServerError as exc:
            with self._threads_lock:
                self._unloadable[thread_id] = exc
            return
        except Exception as exc:  # noqa: BLE001 - the server never dies on a request
            with self._threads_lock:
                self._unloadable[thread_id] = InternalError(f"internal error: {exc}")
            return

        def prewarm() -> None:
            with contextlib.suppress(Exception), gc_paused():
                turn_columns(self.store.turns(history, with_items=False))

        threading.Thread(target=prewarm, name=f"prewarm-{thread_id}", daemon=True).start()

    def _read_history(self, thread_id: str) -> ThreadHistory:
        try:
            return self.store.load(thread_id)
        except NoRolloutFound:
            raise ThreadNotLoaded(thread_id) from None

    def thread_read(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        history = self._read_history(thread_id)
        include = bool(params.get("includeTurns", False))
        with_items = self._turn_items(params)
        if include and self._turn_columns(params):
            thread = self._thread_payload(history, include_turns=False)
            thread.update(turn_columns(self.store.turns(history, with_items=False)))
            return Reply({"thread": thread})
        return Reply(
            {"thread": self._thread_payload(history, include_turns=include, with_items=with_items)}
        )

    def thread_turns_list(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        history = self._read_history(thread_id)
        records = self.store.turns(history)
        direction = params.get("sortDirection") or "desc"
        if direction not in ("asc", "desc"):
            raise InvalidParams(f"invalid sortDirection: {direction!r}")
        cursor = params.get("cursor")
        start = 0
        if cursor is not None:
            try:
                start = int(json.loads(cursor)["offset"])
            except (ValueError, KeyError, TypeError):
                raise InvalidParams(f"invalid cursor: {cursor!r}") from None
        limit = params.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidParams("limit must be a non-negative integer")
        count = len(records)
        end = count if not limit else min(count, start + limit)
        next_cursor = json.dumps({"offset": end}) if end < count else None
        back = json.dumps({"offset": max(0, start - (limit or start))}) if start > 0 else None
        # Only the page's turns are put on the wire: a caller pages a long thread to keep each
        # answer small, and each page would otherwise project every turn of the thread.
        if direction == "asc":
            indices = range(start, end)
        else:  # the page's turns counted from the newest
            indices = range(count - 1 - start, count - 1 - end, -1)
        data = [turn_to_wire(records[i], i) for i in indices]
        return Reply({"data": data, "nextCursor": next_cursor, "backwardsCursor": back})

    def thread_fork(self, params: Mapping[str, Any]) -> Reply:
        source_id = self._thread_id(params)
        last, before = params.get("lastTurnId"), params.get("beforeTurnId")
        if last is not None and before is not None:
            raise InvalidParams("lastTurnId and beforeTurnId are mutually exclusive")
        boundary: Latest | ThroughTurn | BeforeTurn
        if last is not None:
            boundary = ThroughTurn(str(last))
        elif before is not None:
            boundary = BeforeTurn(str(before))
        else:
            boundary = Latest()
        try:
            persistence = ForkPersistence(params.get("persistence") or "copied")
            marker = InterruptedMarker(params.get("interruptedMarker") or "contextualUser")
        except ValueError as exc:
            raise InvalidParams(str(exc)) from None
        loaded = params.get("loaded", True)
        if not isinstance(loaded, bool):
            raise InvalidParams("loaded must be a boolean")
        include_turns = not params.get("excludeTurns", False)
        columns = include_turns and self._turn_columns(params)
        options = ForkOptions(
            boundary=boundary,
            snapshot=parse_snapshot(params.get("snapshot")),
            persistence=persistence,
            marker=marker,
            cwd=params.get("cwd") if isinstance(params.get("cwd"), str) else None,
            model=params.get("model") if isinstance(params.get("model"), str) else None,
            # Columns are of the turns without their items (`turn_columns`).
            turn_items=self._turn_items(params) and not columns,
            keep_child_parse=loaded,
        )
        result = self.forks.fork(source_id, options)
        if result.child is None:
            assert result.head is not None and not loaded
            # An unopened child copied as bytes: answered from its head, its turns the prefix's.
            turns = result.turns if include_turns and not columns else None
            head = self._head_result(
                result.head, status="notLoaded", turns=turns, with_items=options.turn_items
            )
            if columns:
                head["thread"].update(turn_columns(result.turns or ()))
            return Reply(head)
        if loaded:
            self._load_live(result.child)
        payload = self._session_result(
            result.child,
            include_turns=include_turns and not columns,
            turns=result.turns,
            with_items=options.turn_items,
            settings=result.settings,
        )
        if columns:
            turns = result.turns
            if turns is None:
                turns = self.store.turns(result.child, with_items=False)
            payload["thread"].update(turn_columns(turns))
        if not loaded:
            # Written, durable and answered, never opened here: no `thread/started`, and
            # nothing for the caller to unsubscribe (`thread.status.type` is `notLoaded`).
            return Reply(payload)
        started = self._thread_payload(result.child, include_turns=False)
        return Reply(payload, lambda: self.conn.notify("thread/started", {"thread": started}))

    def thread_loaded_list(self, params: Mapping[str, Any]) -> Reply:
        """The threads this app-server holds loaded. Answered on the reader's thread, never
        behind a turn, so a host may ask it to tell a live app-server from a wedged one."""
        with self._threads_lock:
            return Reply({"data": sorted(self.threads), "nextCursor": None})

    def thread_unsubscribe(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        with self._threads_lock:
            live = self.threads.pop(thread_id, None)
        if live is None:
            return Reply({"status": "notLoaded"})
        if live.active is not None:
            live.active.cancel()
        live.wait_idle(30.0)
        live.close()
        return Reply(
            {"status": "unsubscribed"},
            lambda: self.conn.notify("thread/closed", {"threadId": thread_id}),
        )

    def thread_delete(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        wait_ms = params.get("waitMs", 0)
        if not isinstance(wait_ms, int) or wait_ms < 0:
            raise InvalidParams("waitMs must be a non-negative integer")
        live = self._live(thread_id)
        if live is not None and live.active is not None:
            raise ThreadBusy(f"cannot delete thread {thread_id}: a turn is in progress")
        self.store.delete(thread_id, wait_s=wait_ms / 1000.0)
        with self._threads_lock:
            live = self.threads.pop(thread_id, None)
        if live is not None:
            live.close()
        return Reply({}, lambda: self.conn.notify("thread/deleted", {"threadId": thread_id}))

    def turn_start(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        live = self._live(thread_id)
        if live is None:
            with self._threads_lock:
                failed = self._unloadable.pop(thread_id, None)
            if failed is None:
                raise ThreadNotFound(thread_id)
            # Its deferred load failed: loaded now, as the next resume would (a failure that
            # has passed — a rollout repaired, a descriptor free again — no longer answers
            # every Turn of the thread until this server exits), else that failure again.
            self._load_resumed(thread_id)
            live = self._live(thread_id)
            if live is None:
                with self._threads_lock:
                    failed = self._unloadable.get(thread_id, failed)
                raise failed
        text = _input_text(params.get("input"))
        turn, starter = live.start_turn(text)
        return Reply({"turn": turn}, starter)

    def turn_interrupt(self, params: Mapping[str, Any]) -> Reply:
        thread_id = self._thread_id(params)
        turn_id = params.get("turnId")
        if not isinstance(turn_id, str):
            raise InvalidParams("missing field `turnId`")
        live = self._live(thread_id)
        if live is None:
            raise ThreadNotFound(thread_id)
        live.interrupt(turn_id)
        return Reply({})


def _input_text(raw: object) -> str:
    if not isinstance(raw, list) or not raw:
        raise InvalidParams("input must be a non-empty list of user inputs")
    texts = []
    for part in raw:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise InvalidParams("only text inputs are supported")
        texts.append(str(part.get("text", "")))
    text = "\n".join(texts)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            # A lone surrogate (a JSON `\ud800` escape) the rollout's UTF-8 cannot hold: the
            # Turn's user message could never be written, and the Turn never ended.
            raise InvalidParams(
                "input text holds a lone surrogate, which is no Unicode text"
            ) from None
    return text
