"""How the API answers a request, whatever its method: dispatch by name, the reader pool, a
point read on the transport thread from the read-only connection, a message routed
to its Session actor with the reply projected on the actor's thread (the Session's existence
checked on the transport thread too, so no reader-pool hop before the actor), and every
failure turned into a typed reply (law 7). The methods themselves are `agenthost.api`'s,
whose `Api` owns one `RequestPlumbing`.

One Session's request order between its actor and the writes that skip it (`SessionLanes`): a
write no actor needs to order (a rename: the fork fence never refuses it, no actor reads it
back) runs straight on the store from the writer threads, so it never waits in the Session
actor's inbox behind a Turn's writes. Requests of one Session still take effect in the order
they arrived: such a write goes through the actor as before while an earlier request of the
Session is still with the actor; a request for the actor that arrives while earlier writes
wait in the lane is routed once they are done; and the lane runs its writes one after
another."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

import pykka

from actors.host_actor import HostActor, SessionRoutes, route
from agenthost import activity
from agenthost.reply_cache import ReplyCache
from domain.errors import (
    HostError,
    InvalidRequest,
    SessionNotFound,
    Unavailable,
)
from domain.wake_one import WakeOneThreads
from protocol.envelope import Request, pack_result
from storage.base import ReadView
from storage.models import ChangeEvent, ForkOperation, Session, SessionChanged
from storage.sqlite import TRANSIENT_ERRORS, host_error_of
from storage.store import Store
from transport.server import OneShotResponder, Responder

log = logging.getLogger(__name__)

WORKSPACE_MAX = 128
LIVE_SESSIONS_REMEMBERED = 65_536
"""Sessions `RequestPlumbing` remembers as live for routing; past it the memory starts over."""
Handler = Callable[[dict[str, object], Responder], None]
"""A method's handler as the dispatcher calls it: the request's params map, unchecked."""

R = TypeVar("R", bound=Mapping[str, object])
R_contra = TypeVar("R_contra", bound=Mapping[str, object], contravariant=True)


class Refuser(Protocol):
    """What answers a request with an error only (every `Answer` is one)."""

    def error(self, error: HostError) -> bool: ...


class Answer(Refuser, Protocol[R_contra]):
    """The responder of one method as its handler sees it: its success reply is the
    method's result type (`Method[P, R]`'s `R`), which mypy checks at every `result` call.
    The transport's `Responder` is one for every result type."""

    def result(self, status: int, result: R_contra) -> bool: ...


class PointReader(Protocol):
    """What a point read needs: a `ReadView` (its own thread) and a `StorePointReader` (any
    thread) both are."""

    def get_session(self, ws: str, sid: str) -> Session: ...

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation: ...


class StorePointReader:
    """A point read through the `Store`'s parts (the reader pool's fallback to the view)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def get_session(self, ws: str, sid: str) -> Session:
        return self._store.sessions.get_session(ws, sid)

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation:
        return self._store.fork_queries.get_fork_operation(ws, op_id)


class RequestPlumbing:
    """The request plumbing every method handler uses: `agenthost.api.Api` owns one, built
    with its method table, and answers each request through it."""

    def __init__(
        self,
        *,
        store: Store,
        host: pykka.ActorRef[HostActor],
        methods: Mapping[str, Handler],
        routes: SessionRoutes | None = None,
        readers: int = 4,
        writers: int = 8,
        reply_cache: ReplyCache | None = None,
    ) -> None:
        self.store = store
        self.host = host
        # `serve -v` (decided before the daemon is built): one line per request, when it is
        # answered. A quiet daemon runs nothing of `agenthost.activity` for a request.
        self._log_requests = activity.enabled()
        # The live Session actors (`actors.host_actor.SessionRoutes`): a request for one goes
        # straight to it; the rest through the HostActor (which starts them).
        self.routes = routes if routes is not None else SessionRoutes()
        # The reader pool and the writers' are `domain.wake_one.WakeOneThreads`, not
        # `ThreadPoolExecutor`s: nothing reads a request's `Future` (each answers through its
        # responder), and on the executor's `SimpleQueue` every idle thread waited on one lock
        # that its `get` hands on as it returns, so with two threads idle a request woke both;
        # here it wakes one, the one idle last (`tests/daemon/test_api_pools.py`).
        self._pool = WakeOneThreads(readers, "agenthost-read")
        # Writes no actor orders run on threads of their own (`write`), one lane per Session
        # (`SessionLanes`): one waiting for the store's writer never holds a
        # reader's thread, and several Sessions' queued writes share a group commit.
        self._writers = WakeOneThreads(writers, "agenthost-write")
        self.lanes = SessionLanes(self._writers)
        # The point reads' own connection, used only by the first thread that dispatches (the
        # transport thread); a call from any other thread reads through the pool.
        self._view = ReadView(store.path, projections=store.db.projections)
        self._view_thread: int | None = None
        self.inline_reads = 0
        """Point reads answered on the dispatching thread (tests pin the read path on it)."""
        self.routed_now = 0
        """Actor-bound requests routed from the dispatching thread, no reader-pool hop."""
        self.reply_cache = ReplyCache() if reply_cache is None else reply_cache
        """The point reads' encoded replies (`agenthost.reply_cache`), transport thread only."""
        self.live_sessions: set[tuple[str, str]] = set()
        """Sessions `_route_now` found live: a mutation of one of them is
        routed without reading the store again. A Session leaves when its delete commits
        (`_on_change`, before the delete is answered); none ever comes back (a delete is
        final and ids are never reused), so a Session found here is live or being deleted,
        and its actor's own write refuses a deleted one as the read would have (a
        `fork.create`, which may answer a replay on a deleted source, then asks its `gone`)."""
        # Deletes seen (a fresh number each): a check that raced one remembers nothing.
        self._delete_seq = itertools.count(1)
        self._deletes = 0
        self._unsubscribe = store.db.subscribe(self._on_change)
        self._methods: dict[str, Handler] = dict(methods)

    def close(self) -> None:
        self._unsubscribe()
        # What is still queued is dropped, unanswered, as the executors' `cancel_futures` did.
        self._writers.shutdown(wait=True, drop=True)
        self._pool.shutdown(wait=True, drop=True)
        self._view.close()

    # -- dispatch --------------------------------------------------------------------------

    def __call__(self, request: Request, responder: Responder) -> None:
        if self._log_requests:
            responder = activity.LoggedResponder(responder, request)
        handler = self._methods.get(request.method)
        try:
            if handler is None:
                raise InvalidRequest(f"unknown method {request.method!r}", reason="unknown_method")
            handler(request.params, responder)
        except HostError as exc:
            responder.error(exc)
        except Exception as exc:  # noqa: BLE001 - law 7: a read on this thread (a damaged store)
            responder.error(host_error_of(exc, f"dispatching {request.method}", logger=log))

    def read(self, responder: Answer[R], fn: Callable[[], R], status: int = 200) -> None:
        """Run a read (or a write that needs no actor) on the pool."""

        def _run() -> None:
            try:
                responder.result(status, fn())
            except HostError as exc:
                responder.error(exc)
            except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
                responder.error(host_error_of(exc, "read", logger=log))

        self.on_pool(responder, _run)

    def write(
        self,
        responder: Answer[R],
        ws: str,
        sid: str,
        fn: Callable[[], Any],
        make: Callable[[Callable[[Any], None]], Any],
        project: Callable[[Any], tuple[int, R]],
    ) -> None:
        """A write of one Session that no actor needs to order (the fork fence never refuses
        it; no actor reads it back): `fn` runs straight on the store, in the Session's lane
        (`SessionLanes`), and is answered with `project` of what it returned once
        its COMMIT is durable; the write itself refuses a missing or deleted Session. While
        an earlier request of the Session is still with its actor, it is routed there
        instead, as the message `make` builds, so it keeps its place after that request."""

        def _run() -> None:
            try:
                status, result = project(fn())
            except HostError as exc:
                responder.error(exc)
                return
            except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
                responder.error(host_error_of(exc, "write", logger=log))
                return
            responder.result(status, result)

        if self._known_gone(ws, sid):
            # A garbage or deleted id never takes a turn of the store's one writer.
            responder.error(SessionNotFound(f"session {sid} not found"))
            return
        if not self.lanes.write_or_route((ws, sid), _run):
            self.route(responder, ws, sid, make, project)

    def _known_gone(self, ws: str, sid: str) -> bool:
        """Whether the read connection shows no live Session `sid` (a Session remembered live
        is not read; off the transport thread, or busy, nothing is known: False)."""
        if (ws, sid) in self.live_sessions or threading.get_ident() != self._view_thread:
            return False
        try:
            return not self._view.session_exists(ws, sid)
        except TRANSIENT_ERRORS:
            return False

    def on_pool(self, responder: Refuser, fn: Callable[[], None]) -> None:
        """Run `fn` on the reader pool; once the pool is shut down (the daemon is stopping)
        the request is answered `shutting_down` instead."""
        try:
            self._pool.submit(fn)
        except RuntimeError:
            responder.error(Unavailable("daemon is shutting down", reason="shutting_down"))

    def read_now(
        self,
        responder: Answer[R],
        key: tuple[str, str, str],
        read: Callable[[PointReader], R | None],
    ) -> None:
        """A point read of committed state: `read(reader)` returns the 200 reply's result, or
        None when it has arranged the answer itself. It runs here, on the transport thread,
        with the read-only connection, and its result is kept in the reply cache under `key`
        (`agenthost.reply_cache`: answered from there while nothing was committed since); on
        the reader pool with the `Store` if this is not the thread that owns the connection
        or if SQLite reports that connection busy. Whatever it raises becomes the typed error
        reply."""
        me = threading.get_ident()
        if self._view_thread is None:
            self._view_thread = me
        if me == self._view_thread:
            try:
                self._read_on_view(responder, key, read)
                self.inline_reads += 1
                return
            except TRANSIENT_ERRORS:
                pass  # answered below, on the pool
            except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
                responder.error(read_error(exc, "read"))
                return

        def _run() -> None:
            try:
                result = read(StorePointReader(self.store))
                if result is not None:
                    responder.result(200, result)
            except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
                responder.error(read_error(exc, "read"))

        self.on_pool(responder, _run)

    def _read_on_view(
        self,
        responder: Answer[R],
        key: tuple[str, str, str],
        read: Callable[[PointReader], R | None],
    ) -> None:
        view, cache = self._view, self.reply_cache
        if not isinstance(responder, OneShotResponder):
            # A wrapped responder (`serve -v` logs each result map): no cache on this path.
            result = read(view)
            if result is not None:
                responder.result(200, result)
            return
        # The generation before the read: a commit during it can only make the entry stale
        # for the next lookup, never kept as current (`storage.base.ReadView`).
        generation = view.generation()
        packed = cache.get(generation, key)
        if packed is None:
            result = read(view)
            if result is None:
                return
            packed = pack_result(result)
            cache.put(generation, key, packed)
        responder.result_packed(200, packed)

    def route(
        self,
        responder: Answer[R],
        ws: str,
        sid: str,
        make: Callable[[Callable[[Any], None]], Any],
        project: Callable[[Any], tuple[int, R]],
        gone: Callable[[], tuple[int, R] | None] | None = None,
    ) -> None:
        """Check the Session exists (so garbage ids never start actors), then hand the
        message to its actor; the reply is projected on the actor's thread. When the Session
        does not exist, `gone` may still answer from durable state (else the 404 stands).
        The check runs on the transport thread when it can (`_route_now`), else on the pool.
        The request counts as with the actor until it is answered, and waits for the writes
        already in the Session's lane (`write`)."""
        responder = _Counted(responder, self.lanes.begin_routed((ws, sid)))

        def answer_gone(refusal: HostError) -> None:
            assert gone is not None
            try:
                answer = gone()
            except HostError as exc:
                responder.error(exc)
                return
            except Exception as exc:  # noqa: BLE001 - every request gets a typed reply
                responder.error(host_error_of(exc, f"routing {sid}", logger=log))
                return
            if answer is None:
                responder.error(refusal)
            else:
                responder.result(*answer)

        def reply(outcome: Any) -> None:
            if isinstance(outcome, SessionNotFound) and gone is not None:
                # The actor found the Session gone (deleted after it was found live, or while
                # remembered live): what `gone` answers from durable state, as the pool's
                # check would have (else the 404 stands) — on the pool, off the actor.
                self.on_pool(responder, lambda: answer_gone(outcome))
                return
            if isinstance(outcome, HostError):
                responder.error(outcome)
                return
            if isinstance(outcome, BaseException):
                responder.error(host_error_of(outcome, "request", logger=log))
                return
            try:
                status, result = project(outcome)
            except HostError as exc:
                responder.error(exc)
                return
            except Exception as exc:  # noqa: BLE001
                responder.error(host_error_of(exc, "projection", logger=log))
                return
            responder.result(status, result)

        def _check_and_route() -> None:
            try:
                try:
                    self.store.sessions.require_session_live(ws, sid)
                except SessionNotFound as missing:
                    if gone is None:
                        raise
                    answer_gone(missing)
                    return
                route(self.routes, self.host, ws, sid, make(reply))
            except HostError as exc:
                responder.error(exc)
            except pykka.ActorDeadError:
                responder.error(Unavailable("daemon is shutting down", reason="shutting_down"))
            except Exception as exc:  # noqa: BLE001 - every request gets a typed reply
                responder.error(host_error_of(exc, f"routing {sid}", logger=log))

        def _now() -> None:
            if not self._route_now(responder, ws, sid, lambda: make(reply), gone):
                self.on_pool(responder, _check_and_route)

        self.lanes.route((ws, sid), _now, _check_and_route)

    def _route_now(
        self,
        responder: Refuser,
        ws: str,
        sid: str,
        message: Callable[[], Any],
        gone: Callable[[], object] | None,
    ) -> bool:
        """`route` on the transport thread (the fork fast path): the Session's existence
        is a point read of committed state on the read-only connection (no Session built),
        then the message goes from here to the Session's live actor (or to the HostActor,
        which starts one) — no reader-pool hop before the actor, and requests are routed in
        the order they arrived. False (nothing answered)
        when this is not the thread that owns the read connection, when SQLite reports it
        busy, or when the Session is gone and `gone` may still answer from the store: the
        pool path does it then."""
        me = threading.get_ident()
        if self._view_thread is None:
            self._view_thread = me
        if me != self._view_thread:
            return False
        key = (ws, sid)
        # A Session remembered live is not read: its actor refuses a deleted one by itself,
        # and a method that may answer a gone Session otherwise (`gone`: a fork replay) asks
        # `gone` on that refusal (`route`'s reply), as it does here on a Session found gone.
        if key not in self.live_sessions:
            deletes = self._deletes
            try:
                exists = self._view.session_exists(ws, sid)
            except TRANSIENT_ERRORS:
                return False
            except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
                responder.error(read_error(exc, f"routing {sid}"))
                return True
            if not exists:
                if gone is not None:
                    return False  # a replay may still answer (seed 000 §8): on the pool
                responder.error(SessionNotFound(f"session {sid} not found"))
                return True
            if len(self.live_sessions) >= LIVE_SESSIONS_REMEMBERED:
                self.live_sessions.clear()
            # Remembered only if no delete committed meanwhile: the read may predate it.
            if self._deletes == deletes:
                self.live_sessions.add(key)
        self.routed_now += 1
        try:
            route(self.routes, self.host, ws, sid, message())
        except pykka.ActorDeadError:
            responder.error(Unavailable("daemon is shutting down", reason="shutting_down"))
        except HostError as exc:
            responder.error(exc)
        except Exception as exc:  # noqa: BLE001 - every request gets a typed reply
            responder.error(host_error_of(exc, f"routing {sid}", logger=log))
        return True

    def _on_change(self, change: ChangeEvent) -> None:
        """The store's subscriber (the writer's thread, after the COMMIT): a deleted Session
        is no longer routed from memory."""
        if isinstance(change, SessionChanged) and change.removed:
            self._deletes = next(self._delete_seq)
            self.live_sessions.discard((change.workspace_id, change.session_id))


def read_error(exc: BaseException, what: str) -> HostError:
    """The reply of a failed read: typed as it is, the actors gone as `shutting_down`."""
    if isinstance(exc, pykka.ActorDeadError):
        return Unavailable("daemon is shutting down", reason="shutting_down")
    return host_error_of(exc, what, logger=log)


class _Counted:
    """A routed request's responder that tells its Session's lanes once it is answered."""

    __slots__ = ("_inner", "_answered")

    def __init__(self, inner: Answer[Any], answered: Callable[[], None]) -> None:
        self._inner = inner
        self._answered = answered

    def result(self, status: int, result: Any) -> bool:
        self._answered()
        return self._inner.result(status, result)

    def error(self, error: HostError) -> bool:
        self._answered()
        return self._inner.error(error)


# -- one Session's request order between its actor and the writes that skip it -------------

Key = tuple[str, str]


class SessionLanes:
    """The lanes (first in, first out) of the actor-free writes and the counts of the requests
    the actor still owes an answer, of every Session (any thread)."""

    def __init__(self, executor: Executor | WakeOneThreads) -> None:
        self._executor = executor
        self._lock = threading.Lock()
        self._lanes: dict[Key, deque[Callable[[], None]]] = {}
        self._routed: dict[Key, int] = {}
        self.direct_writes = 0
        """Writes run through a lane, not the actor (tests pin the path)."""

    def write_or_route(self, key: Key, write: Callable[[], None]) -> bool:
        """Queue `write` on the Session's lane and return True, or return False when an
        earlier request of the Session is still with its actor: the caller routes it there."""
        with self._lock:
            if self._routed.get(key, 0):
                return False
            lane = self._lanes.get(key)
            self.direct_writes += 1
            if lane is not None:
                lane.append(write)
                return True
            self._lanes[key] = deque((write,))
        try:
            self._executor.submit(functools.partial(self._drain, key))
        except RuntimeError:  # shut down: run it here, its answer says so if the store is gone
            self._drain(key)
        return True

    def with_actor(self, key: Key) -> int:
        """How many of the Session's requests its actor still owes an answer."""
        with self._lock:
            return self._routed.get(key, 0)

    def begin_routed(self, key: Key) -> Callable[[], None]:
        """Count a request for the Session's actor as in flight, before it is routed; returns
        what to call once it is answered (any number of times: it counts once)."""
        with self._lock:
            self._routed[key] = self._routed.get(key, 0) + 1
        done = threading.Lock()

        def answered() -> None:
            if not done.acquire(blocking=False):
                return
            with self._lock:
                left = self._routed.get(key, 0) - 1
                if left > 0:
                    self._routed[key] = left
                else:
                    self._routed.pop(key, None)

        return answered

    def route(self, key: Key, now: Callable[[], None], later: Callable[[], None]) -> None:
        """Route a request for the actor: `now` on this thread, or `later` on the lane's
        thread once the writes waiting in the Session's lane are done."""
        with self._lock:
            lane = self._lanes.get(key)
            if lane is not None:
                lane.append(later)
        if lane is None:
            now()

    def _drain(self, key: Key) -> None:
        while True:
            with self._lock:
                lane = self._lanes[key]
                if not lane:
                    del self._lanes[key]
                    return
                step = lane.popleft()
            try:
                step()
            except Exception:  # noqa: BLE001 - each step answers its own request
                log.exception("session lane step failed")
