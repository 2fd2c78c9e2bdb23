"""A fork's `prepared` COMMIT is lazy only where nobody can hear of the operation before the
fsync'd `dispatching` (docs/design/fork-saga.md, "A lazy prepare"): through `fork_saga`'s
prepare and a real `ForkSaga` on a real store file (tests/actors/saga_harness.py), counting
the store's fsync'd and lazy COMMITs and reading, in each change event's subscriber, what the
store held when the event went out. The fsyncs themselves are counted through a real daemon
with strace (tests/bench/test_fork_syscalls.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from actors import fork_saga
from actors.fork_host import PreparedRuntime
from actors.fork_saga import attestation_key
from actors.messages import ForkCreate, ForkReply
from actors.ports import DriverInfo
from domain.errors import StoreBusy
from domain.fork_states import ForkStatus
from storage.models import ChangeEvent, ForkOperation, ForkOperationChanged
from storage.store import Store
from tests.actors.saga_harness import (
    DRIVER,
    PROVIDER,
    WS,
    InlineHost,
    ScriptedFailpoints,
    ScriptedWorker,
    accepted,
    source,
    verdict,
)

pytestmark = pytest.mark.timeout(60)

INFO = DriverInfo(PROVIDER, "host_copy", True, "tutti-agent-home")


class Catalog:
    """The two rules `fork_saga`'s prepare asks the provider catalog (both pass)."""

    def fork_through_turn_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        return True

    def turn_forkable(
        self, provider: str, root_provider_turn_id: str | None, binding_json: str | None
    ) -> bool:
        return True


@dataclass
class CatalogHost(InlineHost):
    @property
    def catalog(self) -> Any:
        return Catalog()


@dataclass
class Forked:
    host: CatalogHost
    operation: ForkOperation
    replies: list[Any]
    commits: int  # fsync'd COMMITs the fork wrote
    lazy_commits: int
    # The operation's status in the store when each of its change events was published.
    seen_at_events: list[str]
    # Replies and change events, in the order they went out: "reply", or the event's kind.
    order: list[str]


def _runtime(store: Store, host: CatalogHost, sid: str) -> PreparedRuntime:
    """The source's runtime as the Session actor hands it to the saga (generation gen-1)."""
    return PreparedRuntime(
        provider=PROVIDER,
        home=str(host.runtime_home(WS, sid, PROVIDER)),
        cwd="/work",
        settings={},
        provider_session_id=str(store.sessions.get_session(WS, sid).provider_session_id),
        runtime_context={"driverKind": DRIVER[0], "driverVersion": DRIVER[1]},
        generation="gen-1",
        verdict=verdict(),
    )


def fork_through_start(
    store: Store, home: Path, *, warm: bool, flaky_failed: bool = False
) -> Forked:
    """One `fork.create` through `fork_saga`'s prepare. `warm`: this Session's last fork
    attested the runtime the fork runs on (no `runtime.attest`); `flaky_failed`: the runtime's
    verdict says no binder, and the first `failed` write finds the store busy (the saga
    retries it on a timer)."""
    sid, turns = source(store, home)
    order: list[str] = []

    def fork_sent(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        order.append("fork sent")
        return accepted(params)

    worker = ScriptedWorker({"runtime.attest": lambda m, p: verdict(), "fork": fork_sent})
    host = CatalogHost(store, worker, ScriptedFailpoints(), home, sid)
    runtime = _runtime(store, host, sid)
    if warm:
        host.attested_runtime = attestation_key(runtime, "gen-1")
    if flaky_failed:
        runtime = replace(runtime, verdict={**verdict(), "binderAvailable": False})
        moves = store.fork_transitions
        real = moves.mark_fork_failed
        calls = []

        def busy_once(ws: str, op_id: str, error: str) -> tuple[ForkOperation, bool]:
            calls.append(op_id)
            if len(calls) == 1:
                raise StoreBusy("the store is busy, try again (injected)")
            return real(ws, op_id, error)

        moves.mark_fork_failed = busy_once  # type: ignore[method-assign]
    seen: list[str] = []

    def on_event(event: ChangeEvent) -> None:
        order.append(type(event).__name__)
        if isinstance(event, ForkOperationChanged):
            seen.append(store.fork_queries.get_fork_operation(WS, event.operation_id).status.value)

    unsubscribe = store.db.subscribe(on_event)
    replies: list[Any] = []

    def reply(answer: Any) -> None:
        order.append("reply")
        replies.append(answer)

    before = store.db.write_stats.snapshot()
    try:
        msg = ForkCreate(str(uuid.uuid4()), str(uuid.uuid4()), turns[0], reply)
        fork_saga._prepare(host, msg, INFO, runtime)
        if flaky_failed:
            # The caller's budget runs out while `failed` waits for the store, then the
            # saga's retry lands it.
            (budget_s, budget), (_, retry) = host.timers
            assert budget_s == host.timeouts.fork_sync_budget_s
            budget()
            retry()
    finally:
        unsubscribe()
    after = store.db.write_stats.snapshot()
    (op_id,) = {r.operation.operation_id for r in replies}
    return Forked(
        host,
        store.fork_queries.get_fork_operation(WS, op_id),
        replies,
        after["commits"] - before["commits"],
        after["lazy_commits"] - before["lazy_commits"],
        seen,
        order,
    )


def test_a_warm_fork_prepares_at_dispatching_in_one_fsynced_transaction(
    store: Store, tmp_path: Path
) -> None:
    """The warm path whose verdict passes: prepare writes the row at `dispatching` (law 1's
    marker) and fsyncs it, so a warm fork writes three transactions, not four: the prepare,
    `provider_accepted` (lazy) and the commit (docs/design/fork-saga.md, "A warm fork's
    prepare is its dispatching marker"). Without the fold: 2 fsync'd and 2 lazy COMMITs."""
    forked = fork_through_start(store, tmp_path, warm=True)
    assert forked.operation.status is ForkStatus.COMMITTED
    assert [m for m, _ in forked.host.workers.calls] == ["fork"]  # no runtime.attest
    # prepare (at dispatching) and committed fsync'd; provider_accepted lazy.
    assert (forked.commits, forked.lazy_commits) == (2, 1)
    op = forked.operation
    assert op.dispatched_at_ms == op.created_at_ms  # one transaction's time
    # Its first event went out after the fsync'd COMMIT, never while only `prepared` held
    # it: here with the commit's (the provider answered at once; the hold is pinned below).
    assert forked.seen_at_events and "prepared" not in forked.seen_at_events
    assert forked.seen_at_events[0] == "committed"
    assert [(r.operation.status, r.final) for r in forked.replies] == [(ForkStatus.COMMITTED, True)]


def test_a_fork_that_re_attests_first_keeps_its_prepare_fsynced(
    store: Store, tmp_path: Path
) -> None:
    forked = fork_through_start(store, tmp_path, warm=False)
    assert forked.operation.status is ForkStatus.COMMITTED
    assert [m for m, _ in forked.host.workers.calls] == ["runtime.attest", "fork"]
    # prepared, dispatching and committed fsync'd; provider_accepted lazy.
    assert (forked.commits, forked.lazy_commits) == (3, 1)
    assert forked.seen_at_events[0] == "prepared"  # announced as soon as it is durable


def test_the_budget_does_not_announce_a_lazy_prepare_before_its_ending_is_durable(
    store: Store, tmp_path: Path
) -> None:
    """The warm path whose verdict fails keeps its lazy `prepared` (the operation ends
    `failed` with the verdict's reason); its `failed` write finds the store busy once."""
    forked = fork_through_start(store, tmp_path, warm=True, flaky_failed=True)
    # The budget fired while the prepare was still lazy: no 202 then, the caller was asked
    # again later; the retry made `failed` durable.
    replies: list[ForkReply] = forked.replies
    assert [(r.operation.status, r.final) for r in replies] == [(ForkStatus.FAILED, True)]
    assert "binder unavailable" in str(forked.operation.error)
    assert forked.host.workers.calls == []  # nothing left the host
    rechecks = forked.host.timers[2:]
    assert rechecks, "the budget's answer was not deferred"
    assert "prepared" not in forked.seen_at_events


def test_the_request_and_the_reply_go_before_the_change_events_of_their_step(
    store: Store, tmp_path: Path
) -> None:
    forked = fork_through_start(store, tmp_path, warm=True)
    assert forked.operation.status is ForkStatus.COMMITTED
    # The fork request handed to the worker first; then the reply (sent once the commit's
    # COMMIT returned, durable); then every event of the fork in commit order, as one burst:
    # prepare's (the operation at `dispatching`), kept by the saga until the provider
    # answered, then provider_accepted's (a lazy COMMIT's, held until the commit's fsync) and
    # the commit's two: the operation and the child. None lost, and none of the source, whose
    # row no step of a fork writes (docs/design/store.md, "A fork announces no change of its
    # source").
    assert forked.order == [
        "fork sent",
        "reply",
        "ForkOperationChanged",
        "ForkOperationChanged",
        "ForkOperationChanged",
        "SessionChanged",
    ]
    # Each went out after its row was on the disk: none read `prepared` or `provider_accepted`.
    assert forked.seen_at_events == ["committed"] * 3


@dataclass
class SlowProviderHost(CatalogHost):
    """The worker's answer waits in `answers` until the test hands it on."""

    answers: list[Callable[[], None]] = field(default_factory=list)

    def later(
        self,
        future: Future[Any],
        on_done: Callable[[Future[Any]], None],
        reply: Callable[[Any], None] | None = None,
    ) -> None:
        self.answers.append(lambda: on_done(future))


def test_a_provider_slower_than_the_budget_lets_the_dispatch_steps_events_go_with_the_202(
    store: Store, tmp_path: Path
) -> None:
    sid, turns = source(store, tmp_path)
    worker = ScriptedWorker({"fork": lambda m, p: accepted(p)})
    host = SlowProviderHost(store, worker, ScriptedFailpoints(), tmp_path, sid)
    runtime = _runtime(store, host, sid)
    host.attested_runtime = attestation_key(runtime, "gen-1")
    seen: list[tuple[str, str]] = []

    def on_event(event: ChangeEvent) -> None:
        if isinstance(event, ForkOperationChanged):
            status = store.fork_queries.get_fork_operation(WS, event.operation_id).status
            seen.append((type(event).__name__, status.value))
        else:
            seen.append((type(event).__name__, ""))

    unsubscribe = store.db.subscribe(on_event)
    replies: list[Any] = []
    try:
        msg = ForkCreate(str(uuid.uuid4()), str(uuid.uuid4()), turns[0], replies.append)
        fork_saga._prepare(host, msg, INFO, runtime)
        # Dispatched, the provider not answered: nothing announced yet, no timer but the budget.
        assert [m for m, _ in worker.calls] == ["fork"] and seen == [] and replies == []
        ((budget_s, budget),) = host.timers
        assert budget_s == host.timeouts.fork_sync_budget_s
        budget()  # the caller hears 202, and the subscribers of the dispatch with it
        assert [(r.operation.status, r.final) for r in replies] == [(ForkStatus.DISPATCHING, False)]
        assert seen == [("ForkOperationChanged", "dispatching")]  # no change of the source
        (answer,) = host.answers
        answer()  # the provider answers: the commit's events, none again
    finally:
        unsubscribe()
    assert store.fork_queries.get_fork_operation(WS, replies[0].operation.operation_id).status is (
        ForkStatus.COMMITTED
    )
    assert seen[1:] == [
        ("ForkOperationChanged", "committed"),
        ("ForkOperationChanged", "committed"),
        ("SessionChanged", ""),  # the child's
    ]
