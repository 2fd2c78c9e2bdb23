"""A fork whose local commit (or the record of its abort) the store refuses keeps a saga that
retries it until it lands: an operation is never left active, its source fenced, in a live
daemon. And `fork.resolve`'s adopt never takes a source's fence back while a Turn runs on it.
A real saga over a real store file (tests/actors/saga_harness.py); the store's refusals are
the errors SQLite raises (a temp file refused at the descriptor limit is `CantOpenError`)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest

from actors.fork_resolve import ForkResolve, ForkResolver, ResolveReply, _InFlight
from actors.ports import DeliveryUnknown, DriverInfo
from domain.errors import ForkBoundaryError, ForkBoundaryReason
from domain.fork_states import ForkStatus
from domain.worker_messages import ForkResult
from storage.models import ForkOperation
from storage.store import Store
from tests.actors.saga_harness import (
    WS,
    InlineHost,
    Run,
    ScriptedFailpoints,
    ScriptedWorker,
    accepted,
    prepare_request,
    run_saga,
    source,
)
from tests.storage.store_builders import fork_evidence
from tests.support.invariants import STORE_LAWS, Law, check_invariants


def refuse_commits(store: Store, times: int, error: Callable[[], Exception]) -> list[str]:
    """The store's `commit_fork` raises `error()` on its first `times` calls (whoever makes
    them: the saga's commit or its abort's restart rule), then commits; returns the calls."""
    real = store.fork_commit.commit_fork
    calls: list[str] = []

    def refusing(ws: str, op_id: str) -> tuple[ForkOperation, bool]:
        calls.append(op_id)
        if len(calls) <= times:
            raise error()
        return real(ws, op_id)

    store.fork_commit.commit_fork = refusing  # type: ignore[method-assign]
    return calls


def drain(run: Run, op_id: str) -> list[ForkStatus]:
    """Run the saga's timers until none is left; the operation's status while each was
    pending, each checked to have a live saga behind it."""
    seen = []
    while run.host.timers:
        _, fn = run.host.timers.pop(0)
        op = run.host.store.fork_queries.get_fork_operation(WS, op_id)
        if op.status in (ForkStatus.DISPATCHING, ForkStatus.PROVIDER_ACCEPTED):
            # The law: an active operation in a live daemon always has a saga that will end it.
            assert op_id in run.host.sagas, f"{op.status} with no saga"
        seen.append(op.status)
        fn()
    return seen


@pytest.mark.parametrize(
    "error",
    [
        lambda: apsw.CantOpenError("unable to open database file"),
        lambda: apsw.IOError("disk I/O error"),
        lambda: RuntimeError("not the store's transient kind"),
    ],
    ids=["cant_open", "io_error", "unexpected"],
)
def test_a_refused_commit_is_retried_until_the_fork_commits(
    store: Store, home: Path, error: Callable[[], Exception]
) -> None:
    calls = refuse_commits(store, 4, error)
    run = run_saga(store, home, fork_answer=lambda m, p: accepted(p))
    op_id = run.operation.operation_id
    # The commit and the abort's record were refused: the operation waits, fenced, for the
    # saga's retry (never ended with its fence held and no saga).
    assert run.operation.status is ForkStatus.PROVIDER_ACCEPTED
    assert op_id in run.host.sagas
    seen = drain(run, op_id)
    assert ForkStatus.PROVIDER_ACCEPTED in seen
    final = store.fork_queries.get_fork_operation(WS, op_id)
    assert final.status is ForkStatus.COMMITTED
    assert op_id not in run.host.sagas
    assert len(calls) == 5
    assert run.worker.forks() == 1  # the provider call is never repeated
    report = check_invariants(home, probe_fence=True)
    assert [v for v in report.violations if v.law in STORE_LAWS] == []


def unknown_fork(store: Store, home: Path) -> tuple[ForkOperation, str]:
    """A fork whose reply was lost (`unknown`: the source's fence released) and an adopt of it
    begun; returns the operation and its source."""
    run = run_saga(store, home, fork_answer=lambda m, p: DeliveryUnknown("lost"))
    op = run.operation
    assert op.status is ForkStatus.UNKNOWN
    store.resolution.begin_resolution(
        WS,
        op.operation_id,
        request_id=str(uuid.uuid4()),
        action="adopt",
        child_id=f"child-{op.operation_id}",
        evidence={},
    )
    return op, op.source_session_id


def test_an_adopt_does_not_fence_a_source_while_a_turn_runs_on_it(store: Store, home: Path) -> None:
    op, sid = unknown_fork(store, home)
    # A Turn claimed while the operation is `unknown`: the fence is released, so it may run.
    turn, created = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "meanwhile")
    assert created
    with pytest.raises(ForkBoundaryError) as refused:
        store.resolution.adopt_unknown_fork(WS, op.operation_id, fork_evidence(op))
    assert refused.value.boundary_reason in (
        ForkBoundaryReason.SOURCE_SUBMIT_CLAIM_ACTIVE,
        ForkBoundaryReason.SOURCE_TURN_ACTIVE,
    )
    assert store.fork_queries.get_fork_operation(WS, op.operation_id).status is ForkStatus.UNKNOWN
    # The Turn's own writes still land, and it settles.
    store.turns.record_provider_turn(WS, sid, turn.turn_id, "provider-turn-meanwhile")
    store.turns.settle_turn(WS, sid, turn.turn_id, outcome="failed", error="test")
    # Once the source is quiet the adopt takes the fence, and the commit ends it.
    accepted_op, _ = store.resolution.adopt_unknown_fork(WS, op.operation_id, fork_evidence(op))
    assert accepted_op.status is ForkStatus.PROVIDER_ACCEPTED
    done, _ = store.fork_commit.commit_fork(WS, op.operation_id)
    assert done.status is ForkStatus.COMMITTED
    report = check_invariants(home)
    assert [v for v in report.violations if v.law is Law.FENCE_WINDOW] == []


def test_the_checker_finds_a_turn_running_when_an_adopt_took_the_fence(
    store: Store, home: Path
) -> None:
    """The window law over a store where the adopt went ahead with a Turn running (written
    here as the old adopt wrote it, bypassing its quiescence check)."""
    op, sid = unknown_fork(store, home)
    turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "meanwhile")
    with store.db.write(WS) as tx:
        tx.execute(
            "UPDATE fork_operations SET status = 'provider_accepted', accepted_at_ms = ?,"
            " error = NULL, completed_at_ms = NULL, stage = 2 WHERE operation_id = ?",
            (tx.now_ms + 1, op.operation_id),  # (schema v23's CHECK: an adopt's stage)
        )
    report = check_invariants(home, probe_fence=False)
    found = [v.detail for v in report.violations if v.law is Law.FENCE_WINDOW]
    assert len(found) == 1 and turn.turn_id in found[0] and op.operation_id in found[0]


def test_dispatching_is_stamped_when_it_is_written_not_when_it_was_asked(
    store: Store, home: Path
) -> None:
    """A transition's time is its own transaction's: a write that waited for the writer
    behind another one is not dated before the write that went ahead of it."""
    sid, turns = source(store, home)
    op, _ = store.fork_prepare.prepare_fork(
        WS,
        prepare_request(sid, turns[0]),
    )
    holding, released_at = threading.Event(), [0]

    def hold_the_writer() -> None:
        with store.db.write(WS):
            holding.set()
            time.sleep(0.3)
            released_at[0] = store.db.now_ms()

    holder = threading.Thread(target=hold_the_writer)
    holder.start()
    holding.wait(5)
    moved, _ = store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    holder.join()
    assert moved.dispatched_at_ms is not None and moved.dispatched_at_ms >= released_at[0]
    row = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert row.dispatched_at_ms == moved.dispatched_at_ms


class _Catalog:
    def driver_info(self, provider: str) -> DriverInfo:
        return DriverInfo(provider, "host_copy", True, "tutti-agent-home")


@dataclass
class ResolveHost(InlineHost):
    @property
    def catalog(self) -> Any:
        return _Catalog()


def test_an_adopt_whose_commit_the_store_refuses_commits_later_never_rolls_back(
    store: Store, home: Path
) -> None:
    """After the accept (the source fenced again) the resolution ends only by committing."""
    op, sid = unknown_fork(store, home)
    calls = refuse_commits(store, 3, lambda: apsw.CantOpenError("unable to open database file"))
    host = ResolveHost(store, ScriptedWorker({}), ScriptedFailpoints(), home, sid)
    replies: list[Any] = []
    msg = ForkResolve(op.operation_id, str(uuid.uuid4()), "adopt", replies.append)
    resolver = ForkResolver(host, op, msg)
    host.resolves[op.operation_id] = _InFlight(msg.request_id, "adopt", [msg.reply])
    resolver.evidence = {"verdict": "adoptable"}
    resolver.child_id = f"child-{op.operation_id}"
    answer = accepted(
        {
            "source": {"providerSessionId": op.source_provider_session_id},
            "providerTurnIds": list(op.source_provider_turn_ids),
        },
        providerSessionId=resolver.child_id,
    )
    resolver._guard(resolver._bound, ForkResult.from_wire(answer))
    fenced = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert fenced.status is ForkStatus.PROVIDER_ACCEPTED
    assert replies == []  # nobody is told of a failure: the commit is still coming
    while host.timers:
        _, fn = host.timers.pop(0)
        fn()
    done = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert done.status is ForkStatus.COMMITTED
    assert len(calls) == 4
    resolution = store.resolution.get_fork_resolution(WS, op.operation_id)
    assert resolution is not None and resolution.state == "done"
    (reply,) = replies
    assert isinstance(reply, ResolveReply) and reply.operation.status is ForkStatus.COMMITTED
    assert op.operation_id not in host.resolves
