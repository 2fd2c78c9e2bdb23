"""The method table of PROTOCOL.md: validates each request's params, hands the work to the
actors (writes) or a small reader pool (reads), and projects the outcome onto the wire.

Called on the transport thread, so nothing here blocks: every handler either raises a typed
error at once or answers later through the responder. The two point reads, `session.get` and
`fork.get` of a settled operation, are the exception: they are answered right here
from a read-only connection of their own (`storage.base.ReadView`), with no thread hop and no
actor — a primary-key lookup in SQLite's page cache, shorter than the hop it replaces. If that
connection is ever busy (SQLite's rare WAL recovery) the read goes to the reader pool instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import pykka

from actors.checkpoints import DirectoryLocks
from actors.fork_resolve import ACTIONS as RESOLVE_ACTIONS
from actors.fork_resolve import ForkResolve, ResolveReply
from actors.fork_saga import TERMINAL as _TERMINAL_FORK
from actors.host_actor import GetFork, HostActor, SessionRoutes
from actors.messages import ForkCreate, ForkReply, Interrupt, Mutate, Respond, Submit
from actors.ports import ProviderCatalog
from agenthost import projection, workspace_api
from agenthost.api_base import (
    WORKSPACE_MAX,
    Answer,
    Handler,
    PointReader,
    RequestPlumbing,
    log,
)
from agenthost.reply_cache import ReplyCache
from agenthost.worktree_delete import WORKTREE_CHOICES, Waiting, delete_fn
from domain.errors import (
    HostError,
    InvalidArgument,
    Unavailable,
)
from domain.interrupts import ANSWERED_BY, INTERRUPTED_BY, REASON_MAX, interrupt_error
from domain.wake_one import WakeOneThreads
from protocol.envelope import Request
from protocol.methods import (
    DEBUG_FAILPOINTS,
    FORK_ACKNOWLEDGE,
    FORK_CREATE,
    FORK_GET,
    FORK_RESOLVE,
    GOAL_CLEAR,
    GOAL_SET,
    HOST_STATUS,
    INTERACTION_RESPOND,
    SESSION_CREATE,
    SESSION_DELETE,
    SESSION_GET,
    SESSION_LINEAGE,
    SESSION_LIST,
    SESSION_PIN,
    SESSION_TIMELINE,
    SESSION_UPDATE_SETTINGS,
    SESSION_UPDATE_TITLE,
    SESSION_WORKSPACE_DIFF,
    TURN_INTERRUPT,
    TURN_SUBMIT,
    WORKSPACE_RESTORE,
    DeleteParams,
    DeleteResult,
    FailpointsParams,
    FailpointsResult,
    ForkCreateParams,
    ForkResolveParams,
    ForkResolveResult,
    GoalSetParams,
    HostStatusParams,
    HostStatusResult,
    InteractionRespondParams,
    InteractionResult,
    LineageParams,
    LineageResult,
    Method,
    OperationParams,
    OperationResult,
    PinParams,
    SessionCreateParams,
    SessionListParams,
    SessionListResult,
    SessionParams,
    SessionResult,
    TimelineParams,
    TimelineResult,
    TurnInterruptParams,
    TurnResult,
    TurnSubmitParams,
    UpdateSettingsParams,
    UpdateTitleParams,
    WorkspaceDiffParams,
    WorkspaceDiffResult,
    WorkspaceRestoreParams,
    WorkspaceRestoreResult,
)
from storage.lineage_tree import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_NODES,
    MAX_DEPTH_LIMIT,
    MAX_NODES_LIMIT,
)
from storage.models import Session
from storage.sqlite import host_error_of
from storage.store import Store
from transport.server import Responder
from transport.wire import (
    optional_bool,
    optional_enum,
    optional_int,
    optional_map,
    optional_str,
    optional_uuid,
    require_bool,
    require_enum,
    require_list,
    require_map,
    require_str,
    require_uuid,
)
from workspace.shadow import ShadowStore

P = TypeVar("P")
R = TypeVar("R", bound=Mapping[str, object])

LIST_PAGE_BYTES = 1 << 20
"""A `session.list` page ends before the Session that would take it past ~1 MiB (never before
its first): a page of Sessions with huge settings is a few of them and a `nextCursor`, not
hundreds of MB for a client that may never read it."""

TIMELINE_PAGE_CHARS = 1 << 20
"""A `session.timeline` page ends before the Turn that would take its stored text past ~1 MiB
(never before its first), `nextSequence` set: 1,000 Turns of 900 KiB were one ~1.8 GB reply."""
LINEAGE_SETTINGS_CHARS = 1 << 20
"""`session.lineage`'s ancestors carry their settings while those carried so far (nearest
first) stay within ~1 MiB of stored text; past it an ancestor's Session carries `settings: {}`
and `settingsOmitted: true`. A fork child takes its source's settings, so a chain of 10,000
forks of a Session with 900 KiB of settings answered ~9 GB."""
STATUS_THREADS = 2
"""`host.status`'s own threads (each status bounded: two keep a second answered while one
waits out a part's bound)."""


class Api:
    """PROTOCOL.md's methods, each validating its params and answering through the request
    plumbing it owns (`agenthost.api_base.RequestPlumbing`)."""

    def __init__(
        self,
        *,
        store: Store,
        host: pykka.ActorRef[HostActor],
        routes: SessionRoutes | None = None,
        catalog: ProviderCatalog,
        status: Callable[[], HostStatusResult],
        set_failpoints: Callable[[dict[str, str]], dict[str, str]] | None,
        default_cwd: str,
        readers: int = 4,
        check_provider: Callable[[str], None] | None = None,
        reply_cache: ReplyCache | None = None,
        checkpoints: ShadowStore | None = None,
        checkpoint_locks: DirectoryLocks | None = None,
        hit: Callable[[str], None] | None = None,
        retry_tree: Callable[[str, str, str, Waiting], None] | None = None,
        tree_user_gone: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        # A deleted child's tree git could not remove, tried again later (`RemovalRetries`).
        self._retry_tree = retry_tree
        # A deleted Session may free a tree the daemon keeps `removing` for it.
        self._tree_user_gone = tree_user_gone
        # The daemon's failpoints (`hit(name)`), for the steps a request runs outside an actor.
        self._hit = hit
        self.host = host
        self.catalog = catalog
        # The home's workspace checkpoints (`session.workspaceDiff`, `workspace.restore`).
        self.checkpoints = checkpoints
        self.checkpoint_locks = checkpoint_locks or DirectoryLocks()
        # Raises `provider_not_installed` for a provider whose program is missing.
        self._check_provider = check_provider
        self._status = status
        self._set_failpoints = set_failpoints
        self._default_cwd = default_cwd
        self.plumbing = RequestPlumbing(
            store=store,
            host=host,
            methods=self.method_table(),
            routes=routes,
            readers=readers,
            reply_cache=reply_cache,
        )
        # `host.status` runs on threads of its own, never queued on the reader pool behind
        # reads that wait (a `session.create` on a store whose writer is held, for its busy
        # timeout each): it answers within its bound whatever the other requests wait for.
        self._status_threads = WakeOneThreads(STATUS_THREADS, "agenthost-status")

    def __call__(self, request: Request, responder: Responder) -> None:
        self.plumbing(request, responder)

    def close(self) -> None:
        self.plumbing.close()
        self._status_threads.shutdown(wait=True, drop=True)

    def method_table(self) -> dict[str, Handler]:
        return {method.name: handler for method, handler in self.handlers().items()}

    def handlers(self) -> dict[Method[Any, Any], Handler]:
        """Each protocol method's handler, typed by its params (`bind` checks the pair)."""
        pairs = [
            bind(HOST_STATUS, self.host_status),
            bind(SESSION_CREATE, self.session_create),
            bind(SESSION_GET, self.session_get),
            bind(SESSION_LIST, self.session_list),
            bind(SESSION_TIMELINE, self.session_timeline),
            bind(SESSION_LINEAGE, self.session_lineage),
            bind(SESSION_UPDATE_SETTINGS, self.session_update_settings),
            bind(SESSION_UPDATE_TITLE, self.session_update_title),
            bind(SESSION_PIN, self.session_pin),
            bind(SESSION_DELETE, self.session_delete),
            bind(TURN_SUBMIT, self.turn_submit),
            bind(TURN_INTERRUPT, self.turn_interrupt),
            bind(INTERACTION_RESPOND, self.interaction_respond),
            bind(GOAL_SET, self.goal_set),
            bind(GOAL_CLEAR, self.goal_clear),
            bind(FORK_CREATE, self.fork_create),
            bind(FORK_GET, self.fork_get),
            bind(FORK_ACKNOWLEDGE, self.fork_acknowledge),
            bind(FORK_RESOLVE, self.fork_resolve),
            bind(SESSION_WORKSPACE_DIFF, self.session_workspace_diff),
            bind(WORKSPACE_RESTORE, self.workspace_restore),
        ]
        if self._set_failpoints is not None:
            pairs.append(bind(DEBUG_FAILPOINTS, self.debug_failpoints))
        return dict(pairs)

    # -- methods ---------------------------------------------------------------------------

    def host_status(self, params: HostStatusParams, responder: Answer[HostStatusResult]) -> None:
        status = self._status

        def _run() -> None:
            try:
                responder.result(200, status())
            except HostError as exc:
                responder.error(exc)
            except Exception as exc:  # noqa: BLE001 - law 7: never a bare exception
                responder.error(host_error_of(exc, HOST_STATUS.name, logger=log))

        try:
            self._status_threads.submit(_run)
        except RuntimeError:
            responder.error(Unavailable("daemon is shutting down", reason="shutting_down"))

    def session_create(self, params: SessionCreateParams, responder: Answer[SessionResult]) -> None:
        ws = _workspace(params)
        sid = optional_uuid(params, "agentSessionId") or str(uuid.uuid4())
        provider = require_enum(params, "provider", self.catalog.providers())
        title = optional_str(params, "title", default="New session", max_len=512) or "New session"
        cwd = optional_str(params, "cwd", default=self._default_cwd, min_len=1, max_len=4096)
        if cwd is not None and "\0" in cwd:
            raise InvalidArgument("cwd", "'cwd' must not contain NUL (U+0000)")
        settings = optional_map(params, "settings", default={}) or {}
        model = optional_str(params, "model", min_len=1, max_len=256)

        def _create() -> SessionResult:
            if self._check_provider is not None:
                self._check_provider(provider)
            session = self.store.sessions.create_session(
                ws,
                session_id=sid,
                provider=provider,
                title=title,
                cwd=cwd or self._default_cwd,
                settings=settings,
                model=model,
            )
            return {"session": projection.session(session, self.catalog)}

        self.plumbing.read(responder, _create)

    def session_get(self, params: SessionParams, responder: Answer[SessionResult]) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")

        def _get(reader: PointReader) -> SessionResult:
            return {"session": projection.session(reader.get_session(ws, sid), self.catalog)}

        self.plumbing.read_now(responder, (SESSION_GET.name, ws, sid), _get)

    def session_list(self, params: SessionListParams, responder: Answer[SessionListResult]) -> None:
        ws = _workspace(params)
        cursor = optional_str(params, "cursor", max_len=512)
        limit = optional_int(params, "limit", default=50, min_value=1, max_value=200) or 50

        def _list() -> SessionListResult:
            sessions, next_cursor = self.store.sessions.list_sessions(
                ws, cursor=cursor, limit=limit, max_bytes=LIST_PAGE_BYTES
            )
            return {
                "sessions": [projection.session(s, self.catalog) for s in sessions],
                "nextCursor": next_cursor,
            }

        self.plumbing.read(responder, _list)

    def session_timeline(self, params: TimelineParams, responder: Answer[TimelineResult]) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        # Bounded well inside SQLite's int64 so a huge value is a 400, never a 500.
        after = optional_int(params, "afterSequence", default=0, min_value=0, max_value=2**53) or 0
        limit = optional_int(params, "limit", default=100, min_value=1, max_value=1000) or 100

        def _timeline() -> TimelineResult:
            return timeline_result(self.store, self.catalog, ws, sid, after, limit)

        self.plumbing.read(responder, _timeline)

    def session_lineage(self, params: LineageParams, responder: Answer[LineageResult]) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        # One read lists a bounded part of a tree of any size (`truncated` says where it
        # stopped; a read rooted at a truncated node, or a later `afterOrdinal`, goes on).
        depth = optional_int(
            params, "maxDepth", default=DEFAULT_MAX_DEPTH, min_value=1, max_value=MAX_DEPTH_LIMIT
        )
        nodes = optional_int(
            params, "maxNodes", default=DEFAULT_MAX_NODES, min_value=1, max_value=MAX_NODES_LIMIT
        )
        after = optional_int(params, "afterOrdinal", default=0, min_value=0, max_value=2**53)
        self.plumbing.read(
            responder,
            lambda: projection.lineage_tree(
                self.store.lineage.lineage_tree(
                    ws,
                    sid,
                    max_depth=depth or DEFAULT_MAX_DEPTH,
                    max_nodes=nodes or DEFAULT_MAX_NODES,
                    after_ordinal=after or 0,
                    settings_chars=LINEAGE_SETTINGS_CHARS,
                ),
                self.catalog,
            ),
        )

    def _mutate(
        self,
        params: SessionParams,
        responder: Answer[R],
        fn: Callable[[Store, str, str], Any],
        result: Callable[[Any], tuple[int, R]],
        *,
        stop_runtime: bool = False,
    ) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        self.plumbing.route(
            responder,
            ws,
            sid,
            lambda reply: Mutate(lambda: fn(self.store, ws, sid), reply, stop_runtime),
            result,
        )

    def _mutate_session(
        self,
        params: SessionParams,
        responder: Answer[SessionResult],
        fn: Callable[[Store, str, str], Any],
    ) -> None:
        """A write whose reply is the Session it leaves."""
        self._mutate(params, responder, fn, self._session_result)

    def session_update_settings(
        self, params: UpdateSettingsParams, responder: Answer[SessionResult]
    ) -> None:
        settings = require_map(params, "settings")
        self._mutate_session(
            params, responder, lambda s, ws, sid: s.sessions.update_settings(ws, sid, settings)
        )

    def session_update_title(
        self, params: UpdateTitleParams, responder: Answer[SessionResult]
    ) -> None:
        title = require_str(params, "title", max_len=512)
        # Not fenced, nothing of an actor's depends on it: straight to the store, in order
        # with the Session's other requests (`RequestPlumbing.write`).
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")

        def write() -> Session:
            return self.store.sessions.update_title(ws, sid, title)

        self.plumbing.write(
            responder, ws, sid, write, lambda reply: Mutate(write, reply), self._session_result
        )

    def session_pin(self, params: PinParams, responder: Answer[SessionResult]) -> None:
        pinned = require_bool(params, "pinned")
        self._mutate_session(
            params, responder, lambda s, ws, sid: s.sessions.set_pinned(ws, sid, pinned)
        )

    def session_delete(self, params: DeleteParams, responder: Answer[DeleteResult]) -> None:
        worktree = optional_enum(params, "worktree", WORKTREE_CHOICES, default="keep")
        force = optional_bool(params, "force", default=False)
        delete = delete_fn(
            self.checkpoints,
            self.checkpoint_locks,
            worktree=str(worktree),
            force=bool(force),
            hit=self._hit,
            retry=self._retry_tree,
        )
        gone = self._tree_user_gone

        def delete_then_free(store: Store, ws: str, sid: str) -> DeleteResult:
            done = delete(store, ws, sid)
            if gone is not None:
                gone(sid)
            return done

        self._mutate(
            params,
            responder,
            delete_then_free,
            lambda done: (200, done),
            stop_runtime=True,
        )

    def _shadow(self) -> ShadowStore:
        if self.checkpoints is None:
            raise Unavailable(
                "this daemon keeps no workspace checkpoints", reason="workspace_unavailable"
            )
        return self.checkpoints

    def session_workspace_diff(
        self, params: WorkspaceDiffParams, responder: Answer[WorkspaceDiffResult]
    ) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        turn_id = optional_str(params, "turnId", min_len=1, max_len=128)
        from_turn_id = optional_str(params, "fromTurnId", min_len=1, max_len=128)
        max_bytes = optional_int(
            params,
            "maxBytes",
            default=workspace_api.DIFF_MAX_BYTES,
            min_value=0,
            max_value=workspace_api.DIFF_MAX_BYTES_LIMIT,
        )
        shadow = self._shadow()
        self.plumbing.read(
            responder,
            lambda: workspace_api.workspace_diff(
                self.store,
                shadow,
                ws,
                sid,
                turn_id,
                from_turn_id,
                workspace_api.DIFF_MAX_BYTES if max_bytes is None else max_bytes,
            ),
        )

    def workspace_restore(
        self, params: WorkspaceRestoreParams, responder: Answer[WorkspaceRestoreResult]
    ) -> None:
        turn_id = optional_str(params, "turnId", min_len=1, max_len=128)
        tree = optional_str(params, "tree", min_len=1, max_len=64)
        if (turn_id is None) == (tree is None):
            raise InvalidArgument("turnId", "give exactly one of turnId (with which) or tree")
        which = optional_enum(params, "which", ("before", "after")) or "after"
        force = bool(params.get("force", False))
        if not isinstance(params.get("force", False), bool):
            raise InvalidArgument("force", "force must be a boolean")
        restore = workspace_api.restore_fn(
            self._shadow(),
            self.checkpoint_locks,
            turn_id=turn_id,
            which=which,
            tree=None if tree is None else workspace_api.check_tree(tree),
            force=force,
        )
        self._mutate(params, responder, restore, lambda r: (200, r))

    def goal_set(self, params: GoalSetParams, responder: Answer[SessionResult]) -> None:
        goal = require_str(params, "goal", max_len=16_384)
        self._mutate_session(params, responder, lambda s, ws, sid: s.goals.set_goal(ws, sid, goal))

    def goal_clear(self, params: SessionParams, responder: Answer[SessionResult]) -> None:
        self._mutate_session(params, responder, lambda s, ws, sid: s.goals.clear_goal(ws, sid))

    def turn_submit(self, params: TurnSubmitParams, responder: Answer[TurnResult]) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        request_id = require_str(params, "requestId", max_len=128)
        text = _input_text(params)
        self.plumbing.route(
            responder,
            ws,
            sid,
            lambda reply: Submit(request_id, text, reply),
            self._turn_result(ws, sid, 202),
        )

    def turn_interrupt(self, params: TurnInterruptParams, responder: Answer[TurnResult]) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        turn_id = require_str(params, "turnId", max_len=128)
        by = optional_enum(params, "by", INTERRUPTED_BY)
        reason = optional_str(params, "reason", max_len=REASON_MAX)
        why = interrupt_error(by, reason or None)
        self.plumbing.route(
            responder,
            ws,
            sid,
            lambda reply: Interrupt(turn_id, reply, why),
            self._turn_result(ws, sid, 200),
        )

    def interaction_respond(
        self, params: InteractionRespondParams, responder: Answer[InteractionResult]
    ) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        turn_id = require_str(params, "turnId", max_len=128)
        request_id = require_str(params, "requestId", max_len=256)
        response = require_map(params, "response")
        if "decision" in response:
            if response["decision"] not in ("approve", "decline"):
                raise InvalidArgument("response", "'response.decision' must be approve or decline")
        elif not isinstance(response.get("text"), str):
            raise InvalidArgument("response", "'response' needs 'text' or 'decision'")
        by = optional_enum(params, "by", ANSWERED_BY)
        self.plumbing.route(
            responder,
            ws,
            sid,
            lambda reply: Respond(turn_id, request_id, response, reply, by),
            lambda i: (200, {"interaction": projection.interaction(i)}),
        )

    def fork_create(self, params: ForkCreateParams, responder: Answer[OperationResult]) -> None:
        ws, sid = _workspace(params), require_uuid(params, "agentSessionId")
        request_id = require_str(params, "requestId", max_len=128)
        target = require_uuid(params, "targetAgentSessionId")
        point = require_map(params, "point")
        if point.get("type") == "latestSettled":
            # The whole Session: no turnId; resolved and frozen at prepare.
            if "turnId" in point:
                raise InvalidArgument("point", "'latestSettled' takes no 'point.turnId'")
            turn_id, kind = "", "latest_settled"
        elif point.get("type") == "throughTurn":
            given = point.get("turnId")
            if not isinstance(given, str) or not 1 <= len(given) <= 128:
                raise InvalidArgument("point", "'point.turnId' must be a 1..128 character string")
            turn_id, kind = given, "through_turn"
        else:
            raise InvalidArgument("point", "'point.type' must be 'throughTurn' or 'latestSettled'")
        workspace = params.get("workspace", "shared")
        if workspace not in ("shared", "worktree"):
            raise InvalidArgument("workspace", "'workspace' must be 'shared' or 'worktree'")

        def replay_after_delete() -> tuple[int, OperationResult] | None:
            # Seed 000 §8: a replay (same requestId, or a new identity on the held barrier)
            # answers the durable operation even after the source was deleted, so the client
            # can adopt a committed child and ACK it. Nothing new is ever created here.
            op = self.store.fork_prepare.existing_fork(
                ws,
                source_session_id=sid,
                request_id=request_id,
                target_session_id=target,
                turn_id=turn_id,
                point_kind=kind,
                workspace=workspace,
            )
            if op is None:
                return None
            return self._fork_result(ForkReply(op, op.status in _TERMINAL_FORK))

        self.plumbing.route(
            responder,
            ws,
            sid,
            lambda reply: ForkCreate(request_id, target, turn_id, reply, kind, workspace),
            self._fork_result,
            gone=replay_after_delete,
        )

    def fork_get(self, params: OperationParams, responder: Answer[OperationResult]) -> None:
        ws = _workspace(params)
        op_id = require_str(params, "operationId", max_len=128)

        def reply(outcome: Any) -> None:
            if isinstance(outcome, HostError):
                responder.error(outcome)
            elif isinstance(outcome, ForkReply):
                responder.result(
                    200, {"operation": projection.operation(outcome.operation, self.catalog)}
                )
            else:
                responder.error(host_error_of(outcome, "fork.get: unexpected reply", logger=log))

        def _get(reader: PointReader) -> OperationResult | None:
            # A settled operation is answered from committed state (on the transport thread);
            # only an active one goes through the HostActor, which may advance it (leftover
            # recovery) and answers through `reply` (never cached).
            op = reader.get_fork_operation(ws, op_id)
            if op.is_active:
                self.host.tell(GetFork(ws, op_id, reply))
                return None
            return {"operation": projection.operation(op, self.catalog)}

        self.plumbing.read_now(responder, (FORK_GET.name, ws, op_id), _get)

    def fork_acknowledge(self, params: OperationParams, responder: Answer[OperationResult]) -> None:
        ws = _workspace(params)
        op_id = require_str(params, "operationId", max_len=128)

        def _ack() -> OperationResult:
            op, _ = self.store.fork_transitions.acknowledge_fork(ws, op_id)
            return {"operation": projection.operation(op, self.catalog)}

        self.plumbing.read(responder, _ack)

    def fork_resolve(self, params: ForkResolveParams, responder: Answer[ForkResolveResult]) -> None:
        """Inspect / adopt / abandon an `unknown` operation, in its source's actor."""
        ws = _workspace(params)
        op_id = require_str(params, "operationId", max_len=128)
        request_id = require_str(params, "requestId", max_len=128)
        action = require_enum(params, "action", RESOLVE_ACTIONS)

        def project(outcome: Any) -> tuple[int, ForkResolveResult]:
            if not isinstance(outcome, ResolveReply):
                raise HostError("unexpected fork.resolve reply")
            return 200, {
                "operation": projection.operation(outcome.operation, self.catalog),
                "evidence": None
                if outcome.evidence is None
                else projection.evidence(outcome.evidence),
            }

        def _go() -> None:
            try:
                op = self.store.fork_queries.get_fork_operation(ws, op_id)
            except HostError as exc:
                responder.error(exc)
                return
            self.plumbing.route(
                responder,
                ws,
                op.source_session_id,
                lambda reply: ForkResolve(op_id, request_id, action, reply),
                project,
            )

        self.plumbing.on_pool(responder, _go)

    def _session_result(self, session: Any) -> tuple[int, SessionResult]:
        return 200, {"session": projection.session(session, self.catalog)}

    def _turn_result(
        self, ws: str, sid: str, status: int
    ) -> Callable[[Any], tuple[int, TurnResult]]:
        def project(turn: Any) -> tuple[int, TurnResult]:
            # From the store's memory (fixed at create): the actor has just written or read
            # this Session's Turn, so it exists; no read per reply.
            provider = self.store.sessions.provider_of(ws, sid)
            return status, {"turn": projection.turn(turn, provider, self.catalog)}

        return project

    def _fork_result(self, outcome: ForkReply) -> tuple[int, OperationResult]:
        status = 200 if outcome.final else 202
        return status, {"operation": projection.operation(outcome.operation, self.catalog)}

    def debug_failpoints(
        self, params: FailpointsParams, responder: Answer[FailpointsResult]
    ) -> None:
        assert self._set_failpoints is not None
        points = require_map(params, "points")
        for name, action in points.items():
            if not isinstance(action, str):
                raise InvalidArgument("points", f"action of {name!r} must be a string")
        set_failpoints = self._set_failpoints
        self.plumbing.read(responder, lambda: {"points": set_failpoints(dict(points))})


def _workspace(params: Mapping[str, Any]) -> str:
    workspace = require_str(params, "workspaceId", max_len=WORKSPACE_MAX)
    if "\0" in workspace:
        # The terminated events topic is `workspaceId + "\0"`: an id holding
        # NUL could prefix-match another workspace's topic there.
        raise InvalidArgument("workspaceId", "'workspaceId' must not contain NUL (U+0000)")
    return workspace


def _input_text(params: Mapping[str, Any]) -> str:
    items = require_list(params, "input", max_len=64)
    texts: list[str] = []
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "text":
            raise InvalidArgument("input", "each input item must be {type: 'text', text}")
        text = item.get("text")
        if not isinstance(text, str):
            raise InvalidArgument("input", "'text' of an input item must be a string")
        texts.append(text)
    if not texts or not "".join(texts).strip():
        raise InvalidArgument("input", "'input' must hold some text")
    return "\n".join(texts)


def bind(
    method: Method[P, R], handler: Callable[[P, Answer[R]], None]
) -> tuple[Method[Any, Any], Handler]:
    """A method paired with its handler; mypy checks the handler takes the method's params
    and answers its result type (`Answer[R]`: every `responder.result` it makes).
    The request's params map is handed over as that type, as is (no wrapper on the hot
    path): each handler checks the values it reads with the wire helpers, whose typed
    `invalid_argument` errors are the contract."""
    return method, cast(Handler, handler)


def timeline_result(
    store: Store, catalog: ProviderCatalog, ws: str, sid: str, after: int, limit: int
) -> TimelineResult:
    """`session.timeline`'s result: the page's Turns and their Messages projected straight
    from their rows (`HistoryStore.timeline_page`: no `Turn` or `Message` value per row)."""
    # The provider is all the projection needs of the Session (from the store's memory after
    # its first read); `timeline_page` refuses a missing or deleted one with the same
    # `SessionNotFound` as `get_session`.
    provider = store.sessions.provider_of(ws, sid)
    page = store.history.timeline_page(
        ws, sid, after_sequence=after, limit=limit, max_chars=TIMELINE_PAGE_CHARS
    )
    rows, interactions = page.message_rows, page.interactions
    return {
        "turns": [
            projection.turn_of_row(t, rows[t[2]], interactions[t[2]], provider, catalog)
            for t in page.turn_rows
        ],
        "nextSequence": page.next_sequence,
    }
