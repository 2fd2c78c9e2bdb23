"""The Engine itself: the object that owns its parts (change feed, records, session cache, the
index of `unknown` operations, ACKs, reconciliation, fork requests), wires them in its
constructor, answers the public API by delegating to them, and is built over its own transport
Client and events pump (`connect`, `attach_events`) and closed (every timer, the pump, the
scheduler and Client it owns).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from client.engine.acks import Acknowledgements
from client.engine.cache import SessionCache
from client.engine.calls import WorkspaceCalls
from client.engine.changes import ChangeFeed
from client.engine.forks import ForkRequests
from client.engine.ports import ApiPort, Scheduler, ThreadScheduler, _EventPump
from client.engine.reconcile import Reconciliation
from client.engine.records import MutationRecords
from client.engine.unknown import UnknownOperations
from client.engine.values import (
    ACK_BACKOFF_S,
    ACK_DEADLINE_S,
    CREATE_DEADLINE_S,
    GET_DEADLINE_S,
    MAX_SETTLED,
    POLL_INTERVAL_S,
    REQUEST_TIMEOUT_S,
    ForkMutation,
    Listener,
    MutationStatus,
)
from protocol.events import ClientEvent
from protocol.methods import (
    SESSION_WORKSPACE_DIFF,
    ForkResolveResult,
    Method,
    WorkspaceDiffParams,
    WorkspaceDiffResult,
)
from protocol.objects import JsonObject, Operation, Session
from transport.security import ClientCurve

P = TypeVar("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from transport.client import Client


class Engine:
    """Owns every fork mutation of one workspace for one client (see `client.engine`).

    Thread-safe. Network calls are non-blocking (`ApiPort.submit`); replies are handled on the
    client's socket thread and timers on the scheduler, so no method blocks except
    `request`/`load_sessions`/`resolve`/`wait_for`, which must not run on the client's socket
    thread. All parts share one lock, the `ChangeFeed`'s, and publish their changes on it.
    """

    def __init__(
        self,
        api: ApiPort,
        workspace_id: str,
        *,
        scheduler: Scheduler | None = None,
        ack_deadline: float = ACK_DEADLINE_S,
        ack_backoff: tuple[float, ...] = ACK_BACKOFF_S,
        create_deadline: float = CREATE_DEADLINE_S,
        poll_interval: float = POLL_INTERVAL_S,
        get_deadline: float = GET_DEADLINE_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
        max_settled: int = MAX_SETTLED,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self._own_scheduler = scheduler is None
        self.request_timeout = request_timeout
        self.scheduler: Scheduler = scheduler if scheduler is not None else ThreadScheduler()
        self._feed = ChangeFeed()
        self._calls = WorkspaceCalls(api, workspace_id)
        self._records = MutationRecords(self._feed, max_settled)
        self._sessions = SessionCache(self._feed, self._calls)
        self._unknown = UnknownOperations(self._feed)
        self._acks = Acknowledgements(
            self._feed,
            self._records,
            self._calls,
            self.scheduler,
            deadline=ack_deadline,
            backoff=ack_backoff,
        )
        self._reconciliation = Reconciliation(
            self._feed,
            self._records,
            self._sessions,
            self._unknown,
            self._acks,
            self._calls,
            self.scheduler,
            poll_interval=poll_interval,
            get_deadline=get_deadline,
        )
        self._forks = ForkRequests(
            self._feed,
            self._records,
            self._unknown,
            self._reconciliation,
            self._calls,
            self.scheduler,
            create_deadline=create_deadline,
            new_id=new_id,
        )
        self._pump: _EventPump | None = None
        self._owned_client: Client | None = None

    # -- construction helpers ----------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        api_endpoint: str,
        events_endpoint: str | None,
        workspace_id: str,
        *,
        timeout: float = 10.0,
        curve: ClientCurve | None = None,
        events_exact: bool = False,
        **kwargs: Any,
    ) -> Engine:
        """An Engine that owns its Client and, if `events_endpoint` is given, an event pump.
        `curve`: the keys of a connection file, for tcp endpoints; `events_exact`: the
        endpoint is the daemon's terminated-topic one (`eventsExact`)."""
        from transport.client import Client

        client = Client(api_endpoint, timeout=timeout, curve=curve)
        engine = cls(client, workspace_id, **kwargs)
        engine._owned_client = client
        if events_endpoint:
            engine.attach_events(events_endpoint, curve=curve, exact=events_exact)
        return engine

    def attach_events(
        self, events_endpoint: str, *, curve: ClientCurve | None = None, exact: bool = False
    ) -> None:
        """Follow the daemon's events (`fork.operation`, `session.*`, `turn.updated`);
        `exact`: `events_endpoint` is the terminated-topic endpoint (`eventsExact`)."""
        with self._feed.lock:
            if self._pump is None:
                self._pump = _EventPump(
                    events_endpoint, self.workspace_id, self.handle_event, curve=curve, exact=exact
                )

    # -- configuration -----------------------------------------------------------------------

    @property
    def api(self) -> ApiPort:
        return self._calls.api

    @property
    def workspace_id(self) -> str:
        return self._calls.workspace_id

    @property
    def ack_deadline(self) -> float:
        return self._acks.deadline

    @property
    def ack_backoff(self) -> tuple[float, ...]:
        return self._acks.backoff

    @property
    def create_deadline(self) -> float:
        return self._forks.create_deadline

    @property
    def poll_interval(self) -> float:
        return self._reconciliation.poll_interval

    @property
    def get_deadline(self) -> float:
        return self._reconciliation.get_deadline

    @property
    def max_settled(self) -> int:
        return self._records.max_settled

    # -- fork mutations ----------------------------------------------------------------------

    def fork(self, source_session_id: str, turn_id: str, workspace: str = "shared") -> ForkMutation:
        """The Fork click on one boundary (`ForkRequests.fork`); never blocks. `workspace`:
        `shared` (the same folder) or `worktree` (a new worktree of the Turn's files)."""
        return self._forks.fork(source_session_id, turn_id, workspace)

    def fork_latest(self, source_session_id: str, workspace: str = "shared") -> ForkMutation:
        """The Session-level Fork, on the key `(source, LATEST_SETTLED)`
        (`ForkRequests.fork_latest`); never blocks."""
        return self._forks.fork_latest(source_session_id, workspace)

    def resolve(
        self,
        operation_id: str,
        action: str,
        *,
        request_id: str | None = None,
        timeout: float = 30.0,
    ) -> ForkResolveResult:
        """`fork.resolve` (`inspect`/`adopt`/`abandon`), blocking (`ForkRequests.resolve`)."""
        return self._forks.resolve(operation_id, action, request_id=request_id, timeout=timeout)

    def mutation(self, source_session_id: str, turn_id: str) -> ForkMutation | None:
        with self._feed.lock:
            return self._records.get((source_session_id, turn_id))

    def mutations(self) -> list[ForkMutation]:
        with self._feed.lock:
            return self._records.all()

    def is_fork_pending(self, source_session_id: str, turn_id: str) -> bool:
        """The GUI's pending selector: true while that exact Turn's fork is in flight."""
        record = self.mutation(source_session_id, turn_id)
        return record is not None and record.status is MutationStatus.IN_FLIGHT

    def unknown_operations(self, source_session_id: str) -> dict[str, Operation]:
        """The `unknown` fork operations of a source this Engine has seen, by boundary Turn id:
        the Turns a view marks and offers Inspect / Adopt / Abandon for."""
        return self._unknown.of_source(source_session_id)

    def next_ack_retry_delay(self, source_session_id: str, turn_id: str) -> float | None:
        """The backoff the next ACK failure of this record would wait (for tests and views)."""
        return self._acks.next_retry_delay((source_session_id, turn_id))

    # -- sessions, events, requests ----------------------------------------------------------

    def session(self, session_id: str) -> Session | None:
        return self._sessions.session(session_id)

    def sessions(self) -> list[Session]:
        return self._sessions.sessions()

    def load_sessions(self) -> list[Session]:
        """Fill the session cache from `session.list` (every page)."""
        return self._sessions.load()

    def upsert_session(self, session: Session) -> None:
        self._sessions.upsert(session)

    def handle_event(self, event: ClientEvent) -> None:
        """Apply one daemon event, decoded (the event pump calls this; tests may too)."""
        self._reconciliation.handle_event(event)

    @overload
    def request(self, method: Method[P, R], params: P, *, timeout: float | None = None) -> R: ...

    @overload
    def request(
        self, method: str, params: JsonObject | None = None, *, timeout: float | None = None
    ) -> JsonObject: ...

    def request(
        self, method: Method[Any, Any] | str, params: Any = None, *, timeout: float | None = None
    ) -> Any:
        """One request in this workspace, its params and result typed by `method` (a bare
        name, for tests and probes, is looked up in the protocol's table); raises `ApiError`,
        or `TimeoutError` without a reply (after `timeout`, by default the Engine's
        `request_timeout`)."""
        limit = self.request_timeout if timeout is None else timeout
        return self._calls.request(method, params, timeout=limit)

    def workspace_diff(
        self,
        session_id: str,
        turn_id: str | None = None,
        *,
        max_bytes: int | None = None,
        timeout: float = 30.0,
    ) -> WorkspaceDiffResult:
        """`session.workspaceDiff`: what a Turn (default: the newest settled one) changed in
        its `cwd`, blocking; a Turn without a usable checkpoint raises `ApiError`
        `workspace_checkpoint_missing`, whose message says why."""
        params = WorkspaceDiffParams(workspaceId=self.workspace_id, agentSessionId=session_id)
        if turn_id is not None:
            params["turnId"] = turn_id
        if max_bytes is not None:
            params["maxBytes"] = max_bytes
        return self._calls.request(SESSION_WORKSPACE_DIFF, params, timeout=timeout)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self._feed.subscribe(listener)

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Block until `predicate()` is truthy (re-checked on every Engine change)."""
        return self._feed.wait_for(predicate, timeout)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every timer (ACK retries included) and the event pump; idempotent."""
        with self._feed.lock:
            if self._feed.closed:
                return
            self._records.cancel_timers()
            pump, self._pump = self._pump, None
            self._feed.close()
        if pump is not None:
            pump.close()
        if self._own_scheduler and isinstance(self.scheduler, ThreadScheduler):
            self.scheduler.close()
        if self._owned_client is not None:
            self._owned_client.close()

    @property
    def closed(self) -> bool:
        return self._feed.closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
