"""The fork saga in-process: a real `ForkSaga` over a real store file, a host that runs every
continuation at once on the test's thread, a worker that answers each call from a script, and
failpoints where `crash` stops the saga dead as a SIGKILL would (a `BaseException` no step
catches). A "restart" is start-up recovery on the same store. No daemon, no threads, no
processes: a whole scenario takes milliseconds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.context import LiveOperations, Timeouts
from actors.fork_host import LiveSaga, PreparedRuntime
from actors.fork_saga import ForkSaga
from actors.fork_workspace import remove_failed_trees
from actors.messages import ForkReply
from actors.pool import TimerHandle
from actors.ports import DriverInfo
from actors.recovery import recover_fork_operations
from agenthost.workers import read_answer
from domain.worker_messages import Attestation, ForkRequest, ForkResult, RuntimeAttest
from storage.models import ForkOperation, ForkPointKind, ForkPrepareRequest, Session
from storage.store import Store
from tests.support.invariants import provider_home
from workspace.worktree import ForkTrees

WS = "ws-saga"
PROVIDER = "tutti-agent"
DRIVER = ("tutti-agent", "0.0.10")


class Crash(BaseException):
    """The process died at a failpoint: nothing after it runs (not an `Exception`, so the
    saga's own error handling never sees it, exactly as with a SIGKILL)."""


class _Recorded(dict[str, str]):
    """The scripted points: never empty to the saga (which skips `hit` while nothing is armed),
    since the harness records every point the saga reaches, armed or not."""

    def __bool__(self) -> bool:
        return True


@dataclass
class ScriptedFailpoints:
    """`hit(name)`: `crash` raises `Crash`, `error` raises an ordinary error; else nothing."""

    armed: dict[str, str] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.armed = _Recorded(self.armed)

    def hit(self, name: str) -> None:
        self.hits.append(name)
        action = self.armed.get(name)
        if action == "crash":
            raise Crash(name)
        if action == "error":
            raise RuntimeError(f"failpoint {name} fired")


Answer = Callable[[str, Mapping[str, Any]], Mapping[str, Any] | BaseException]


@dataclass
class ScriptedWorker:
    """The worker port: `answers[method](method, params)` is the map it answers, or the
    exception its future fails with; every call is recorded."""

    answers: dict[str, Answer]
    calls: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)

    def request(
        self, provider: str, method: str, params: Mapping[str, Any], timeout: float
    ) -> Future[dict[str, Any]]:
        self.calls.append((method, dict(params)))
        out: Future[dict[str, Any]] = Future()
        answer = self.answers[method](method, params)
        if isinstance(answer, BaseException):
            out.set_exception(answer)
        else:
            out.set_result(dict(answer))
        return out

    def forks(self) -> int:
        return sum(1 for method, _ in self.calls if method == "fork")

    # The typed calls the saga makes, over the scripted maps (as the real port reads them).

    def attest(self, provider: str, request: RuntimeAttest, timeout: float) -> Future[Attestation]:
        return read_answer(
            self.request(provider, request.METHOD, request.to_wire(), timeout),
            Attestation.from_wire,
        )

    def fork(self, provider: str, request: ForkRequest, timeout: float) -> Future[ForkResult]:
        return read_answer(
            self.request(provider, request.METHOD, request.to_wire(), timeout), ForkResult.from_wire
        )


@dataclass
class InlineHost:
    """`ForkHost` for one source Session, every continuation run at once."""

    store: Store
    workers: ScriptedWorker
    failpoints: ScriptedFailpoints
    home: Path
    sid: str
    ws: str = WS
    sagas: dict[str, LiveSaga] = field(default_factory=dict)
    resolves: dict[str, Any] = field(default_factory=dict)
    tree_records: set[str] = field(default_factory=set)
    attested_runtime: tuple[str, ...] | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    live_operations: LiveOperations = field(default_factory=LiveOperations)
    timers: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    fork_trees: ForkTrees | None = None
    # No live retries here: a failed fork's tree git cannot remove waits for the next start.
    retry_failed_tree: Callable[[str, str, str, str], None] | None = None

    @property
    def key(self) -> str:
        return f"1:{self.ws}:{self.sid}"

    @property
    def resolve_store(self) -> Store:
        return self.store

    @property
    def catalog(self) -> Any:  # the saga never asks the catalog
        raise AssertionError("the saga does not use the catalog")

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path:
        return provider_home(self.home, workspace_id, session_id, provider)

    def session(self) -> Session:
        return self.store.sessions.get_session(self.ws, self.sid)

    def cached_session(self) -> Session:
        return self.session()

    def warm_runtime(self, session: Session) -> None:
        return None

    def forget_warm_runtime(self) -> None:
        pass

    def prepare_runtime(self, session: Session, on_ready: Callable[[Any], None]) -> None:
        raise AssertionError("the saga is given its runtime")

    def later(
        self,
        future: Future[Any],
        on_done: Callable[[Future[Any]], None],
        reply: Callable[[Any], None] | None = None,
    ) -> None:
        # Continuations run on the test's thread, in order: a tree made on a thread of its
        # own is waited for here (and a crash inside it surfaces here too).
        wait([future])
        on_done(future)

    def after(self, seconds: float, fn: Callable[[], None]) -> TimerHandle:
        self.timers.append((seconds, fn))
        return TimerHandle()

    def apply_late_bindings(self) -> None:
        pass


def verdict(**over: Any) -> dict[str, Any]:
    """A passing `runtime.attest` answer for the operation's driver."""
    return {
        "driverKind": DRIVER[0],
        "driverVersion": DRIVER[1],
        "forkThroughTurn": True,
        "forkFullSession": True,
        "binderAvailable": True,
        "runtimeGeneration": "gen-1",
        **over,
    }


def accepted(params: Mapping[str, Any], **child_over: Any) -> dict[str, Any]:
    """A verified `accepted` answer: a child showing exactly the frozen prefix."""
    child = {
        "providerSessionId": f"child-{uuid.uuid4().hex[:8]}",
        "forkedFromId": params["source"]["providerSessionId"],
        "providerTurnIds": list(params["providerTurnIds"]),
        **child_over,
    }
    return {
        "disposition": "accepted",
        "child": child,
        "binding": {
            "mode": "host_copy",
            "receipt": {"sha256": "ab", "childId": child["providerSessionId"]},
        },
    }


@dataclass
class Run:
    """One scenario's outcome: the operation as the store holds it (after a restart when the
    saga crashed), whether it crashed and where, the worker's calls and the replies given."""

    operation: ForkOperation
    crashed_at: str | None
    worker: ScriptedWorker
    replies: list[Any]
    host: InlineHost
    saga: ForkSaga
    raised: Exception | None = None
    """An error that escaped the saga's first step (its own handling failed too)."""


def source(store: Store, home: Path) -> tuple[str, list[str]]:
    """A root Session with two settled, bound Turns."""
    from tests.storage.store_builders import new_session, settled_turn

    sid = new_session(store, WS, provider_session_id=f"prov-{uuid.uuid4().hex[:6]}")
    provider_home(home, WS, sid, PROVIDER).mkdir(parents=True)  # a real source has one
    turns = [settled_turn(store, sid, WS, text=t).turn_id for t in ("one", "two")]
    return sid, turns


def prepare_request(sid: str, turn_id: str, **over: Any) -> ForkPrepareRequest:
    """A fork of `sid` through `turn_id` as the saga tests prepare it: fresh request and target
    ids, the scripted driver, `host_copy`; `over` sets any other field."""
    fields: dict[str, Any] = {
        "source_session_id": sid,
        "request_id": str(uuid.uuid4()),
        "target_session_id": str(uuid.uuid4()),
        "turn_id": turn_id,
        "point_kind": ForkPointKind.THROUGH_TURN,
        "driver_kind": DRIVER[0],
        "driver_version": DRIVER[1],
        "binding_mode": "host_copy",
        "runtime_identity": {},
    }
    return ForkPrepareRequest(**{**fields, **over})


def run_saga(
    store: Store,
    home: Path,
    *,
    fork_answer: Answer,
    attest_answer: Answer = lambda m, p: verdict(),
    crash_at: str | None = None,
    error_at: str | None = None,
    point: str = ForkPointKind.THROUGH_TURN,
    workspace: str = "shared",
    checkpoints: Sequence[Mapping[str, Any] | None] = (),
    trees: ForkTrees | None = None,
    keep_error: bool = False,
) -> Run:
    """`checkpoints`: the workspace checkpoint record of each of the source's two Turns.
    `keep_error`: an error escaping the saga is returned in `Run.raised` instead of raised."""
    sid, turns = source(store, home)
    for turn_id, record in zip(turns, checkpoints, strict=False):
        attach_checkpoint(store, sid, turn_id, record)
    armed = {}
    if crash_at:
        armed[crash_at] = "crash"
    if error_at:
        armed[error_at] = "error"
    worker = ScriptedWorker({"runtime.attest": attest_answer, "fork": fork_answer})
    host = InlineHost(store, worker, ScriptedFailpoints(armed), home, sid, fork_trees=trees)
    op, created = store.fork_prepare.prepare_fork(
        WS,
        prepare_request(
            sid,
            "" if point == ForkPointKind.LATEST_SETTLED else turns[0],
            point_kind=point,
            workspace=workspace,
        ),
        plan_workspace=None if trees is None else trees.plan,
    )
    assert created
    session = store.sessions.get_session(WS, sid)
    runtime = PreparedRuntime(
        provider=PROVIDER,
        home=str(host.runtime_home(WS, sid, PROVIDER)),
        cwd="/work",
        settings={},
        provider_session_id=str(session.provider_session_id),
        runtime_context={"driverKind": DRIVER[0], "driverVersion": DRIVER[1]},
    )
    saga = ForkSaga(host, op, runtime, DriverInfo(PROVIDER, "host_copy", True, "tutti-agent-home"))
    host.sagas[op.operation_id] = saga
    replies: list[Any] = []
    saga.join(replies.append)
    crashed_at = None
    raised: Exception | None = None
    try:
        saga._step(saga._after_prepare)
    except Exception as exc:
        if not keep_error:
            raise
        raised = exc  # the test reads it
    except Crash as exc:
        crashed_at = str(exc)
        recover_fork_operations(store)  # the restart: start-up recovery on the same store
        remove_failed_trees(store, trees)
    return Run(
        store.fork_queries.get_fork_operation(WS, op.operation_id),
        crashed_at,
        worker,
        replies,
        host,
        saga,
        raised,
    )


def attach_checkpoint(
    store: Store, sid: str, turn_id: str, record: Mapping[str, Any] | None
) -> None:
    """The Turn's workspace checkpoint record, as the Turn's settlement stores it."""
    with store.db.write(WS) as tx:
        tx.execute(
            "UPDATE turns SET checkpoint_json = ? WHERE workspace_id = ? AND session_id = ?"
            " AND turn_id = ?",
            (None if record is None else json.dumps(dict(record)), WS, sid, turn_id),
        )


def final_status(run: Run) -> str:
    return run.operation.status.value


def replied(run: Run) -> ForkReply | None:
    return run.replies[-1] if run.replies else None


SAGA_POINTS = (
    # The saga's own failpoints, in the order a fork passes them.
    "host.fork.after_prepare",
    "host.fork.after_dispatching",
    "host.fork.after_provider_result",
    "host.fork.before_commit",
    "host.fork.after_commit",
)


def ok(method: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
    return accepted(params)


def answer(value: Mapping[str, Any] | BaseException) -> Answer:
    return lambda method, params: value
