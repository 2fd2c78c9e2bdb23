"""The fork saga in-process (tests/actors/saga_harness.py): every transition of
`domain/fork_states.py` and every saga failpoint's outcome after a crash there, with the
worker's answers scripted — what a daemon test would take seconds to show, in milliseconds.

The laws checked on every scenario: the provider's fork is called at most once and only after
`dispatching` is durable (law 1); a child Session exists iff the operation committed (law 2);
after a crash, recovery applies the restart rule and never calls the provider again; the
store's laws hold (tests/support/invariants.py, the store-only subset).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from domain.fork_states import TRANSITIONS, ForkStatus
from storage.models import ForkPointKind
from storage.store import Store
from tests.actors.saga_harness import (
    SAGA_POINTS,
    WS,
    Answer,
    Run,
    accepted,
    answer,
    ok,
    run_saga,
    verdict,
)
from tests.storage.store_builders import fork_evidence as _evidence
from tests.support.invariants import STORE_LAWS, check_invariants

pytestmark = pytest.mark.timeout(60)


def laws(home: Path, run: Run) -> None:
    """Law 1 and law 2 for this run, and the store's laws."""
    dispatched = [name for name in run.host.failpoints.hits if name.startswith("host.fork")]
    if run.worker.forks():
        # The fork left only after the `dispatching` marker was written.
        assert "host.fork.after_dispatching" in dispatched
        assert run.worker.forks() == 1
    status = run.operation.status
    child = run.operation.committed_session
    assert (child is not None) == (status is ForkStatus.COMMITTED)
    # The fence law is probed by the daemon suites; here the store's other laws, cheaply.
    report = check_invariants(home, probe_fence=False)
    broken = [v for v in report.violations if v.law in STORE_LAWS]
    assert not broken, broken


# -- every outcome of one dispatch, no crash -------------------------------------------------

OUTCOMES: list[tuple[str, Answer, ForkStatus]] = [
    ("accepted and verified", ok, ForkStatus.COMMITTED),
    (
        "not_started",
        answer({"disposition": "not_started", "error": "no runtime"}),
        ForkStatus.FAILED,
    ),
    ("rejected", answer({"disposition": "rejected", "error": "no such thread"}), ForkStatus.FAILED),
    ("unknown disposition", answer({"disposition": "unknown", "error": "?"}), ForkStatus.UNKNOWN),
    ("request never left", answer(NotDelivered("worker down")), ForkStatus.FAILED),
    ("request sent, no answer", answer(DeliveryUnknown("timeout")), ForkStatus.UNKNOWN),
    (
        "worker died in the driver",
        answer(WorkerFailed({"message": "worker exited -9"})),
        ForkStatus.UNKNOWN,
    ),
    ("malformed answer", answer({"disposition": "accepted"}), ForkStatus.UNKNOWN),
    (
        "child shows another prefix",
        lambda m, p: accepted(p, providerTurnIds=["not-the-prefix"]),
        ForkStatus.UNKNOWN,
    ),
    (
        "child names another source",
        lambda m, p: accepted(p, forkedFromId="someone-else"),
        ForkStatus.UNKNOWN,
    ),
    (
        "child is the source",
        lambda m, p: accepted(p, providerSessionId=p["source"]["providerSessionId"]),
        ForkStatus.UNKNOWN,
    ),
]


@pytest.mark.parametrize(
    ("fork_answer", "expected"),
    [(a, e) for _, a, e in OUTCOMES],
    ids=[name for name, _, _ in OUTCOMES],
)
def test_each_delivery_outcome_ends_in_its_status(
    store: Store, home: Path, fork_answer: Answer, expected: ForkStatus
) -> None:
    run = run_saga(store, home, fork_answer=fork_answer)
    assert run.crashed_at is None
    assert run.operation.status is expected, run.operation
    assert run.worker.forks() == 1
    assert run.replies and run.replies[-1].operation.status is expected
    laws(home, run)


@pytest.mark.parametrize(
    ("attest", "why"),
    [
        (answer(RuntimeError("attest timed out")), "re-attestation failed"),
        (answer(verdict(driverVersion="9.9.9")), "driver changed since prepare"),
        (answer(verdict(forkThroughTurn=False)), "no longer attests forkThroughTurn"),
        (answer(verdict(binderAvailable=None)), "binder unavailable"),
    ],
    ids=["attest fails", "driver changed", "capability gone", "no binder"],
)
def test_a_failed_re_attestation_fails_before_any_dispatch(
    store: Store, home: Path, attest: Answer, why: str
) -> None:
    run = run_saga(store, home, fork_answer=ok, attest_answer=attest)
    assert run.operation.status is ForkStatus.FAILED
    assert why in (run.operation.error or "")
    assert run.worker.forks() == 0
    laws(home, run)


def test_a_full_session_fork_needs_the_drivers_declaration(store: Store, home: Path) -> None:
    run = run_saga(
        store,
        home,
        fork_answer=ok,
        attest_answer=answer(verdict(forkFullSession=False)),
        point=ForkPointKind.LATEST_SETTLED,
    )
    assert run.operation.status is ForkStatus.FAILED and run.worker.forks() == 0
    full = run_saga(store, home, fork_answer=ok, point=ForkPointKind.LATEST_SETTLED)
    assert full.operation.status is ForkStatus.COMMITTED


# -- a crash at every saga failpoint, then a restart ------------------------------------------

CRASHES: list[tuple[str, ForkStatus, int]] = [
    ("host.fork.after_prepare", ForkStatus.FAILED, 0),
    ("host.fork.after_dispatching", ForkStatus.UNKNOWN, 0),
    ("host.fork.after_provider_result", ForkStatus.UNKNOWN, 1),
    ("host.fork.before_commit", ForkStatus.COMMITTED, 1),
    ("host.fork.after_commit", ForkStatus.COMMITTED, 1),
]


@pytest.mark.parametrize(("point", "expected", "forks"), CRASHES, ids=[c[0] for c in CRASHES])
def test_a_crash_at_each_failpoint_recovers_by_the_restart_rule(
    store: Store, home: Path, point: str, expected: ForkStatus, forks: int
) -> None:
    run = run_saga(store, home, fork_answer=ok, crash_at=point)
    assert run.crashed_at == point
    assert run.operation.status is expected, run.operation
    assert run.worker.forks() == forks  # recovery never calls the provider
    laws(home, run)


@pytest.mark.parametrize("point", SAGA_POINTS)
def test_an_error_at_each_failpoint_is_classified_by_the_durable_status(
    store: Store, home: Path, point: str
) -> None:
    """An unexpected in-process error (not a crash) ends the saga by the same restart rule,
    with the fence released and the waiters answered."""
    run = run_saga(store, home, fork_answer=ok, error_at=point)
    assert run.operation.status in (ForkStatus.FAILED, ForkStatus.UNKNOWN, ForkStatus.COMMITTED)
    assert run.operation.status is not ForkStatus.PROVIDER_ACCEPTED
    assert run.replies, "every waiter is answered"
    assert not run.host.sagas
    laws(home, run)


# -- every transition of the state machine ------------------------------------------------------


def test_every_transition_of_the_state_machine_is_taken(store: Store, home: Path) -> None:
    """The saga's runs above and `fork.resolve`'s two store steps together take every edge of
    `TRANSITIONS`; this walks them all here, in one store, and checks none is left out."""
    seen: set[tuple[ForkStatus, ForkStatus]] = set()
    for _, fork_answer, _ in OUTCOMES:
        run = run_saga(store, home, fork_answer=fork_answer)
        seen.add((ForkStatus.PREPARED, ForkStatus.DISPATCHING))
        seen.add((ForkStatus.DISPATCHING, run.operation.status))
        if run.operation.status is ForkStatus.COMMITTED:
            seen.add((ForkStatus.DISPATCHING, ForkStatus.PROVIDER_ACCEPTED))
            seen.add((ForkStatus.PROVIDER_ACCEPTED, ForkStatus.COMMITTED))
    seen.discard((ForkStatus.DISPATCHING, ForkStatus.COMMITTED))
    early = run_saga(store, home, fork_answer=ok, attest_answer=answer(RuntimeError("x")))
    assert early.operation.status is ForkStatus.FAILED
    seen.add((ForkStatus.PREPARED, ForkStatus.FAILED))
    # fork.resolve: unknown → provider_accepted (adopt) and unknown → abandoned.
    for action in ("adopt", "abandon"):
        run = run_saga(store, home, fork_answer=answer(DeliveryUnknown("lost")))
        op = run.operation
        assert op.status is ForkStatus.UNKNOWN
        store.resolution.begin_resolution(
            WS,
            op.operation_id,
            request_id=str(uuid.uuid4()),
            action=action,
            child_id=f"child-{op.operation_id}" if action == "adopt" else None,
            evidence={},
        )
        if action == "adopt":
            accepted_op, _ = store.resolution.adopt_unknown_fork(WS, op.operation_id, _evidence(op))
            assert accepted_op.status is ForkStatus.PROVIDER_ACCEPTED
            seen.add((ForkStatus.UNKNOWN, ForkStatus.PROVIDER_ACCEPTED))
            done, _ = store.fork_commit.commit_fork(WS, op.operation_id)
            assert done.status is ForkStatus.COMMITTED
        else:
            gone, _ = store.resolution.abandon_fork(WS, op.operation_id, {"action": "abandon"})
            assert gone.status is ForkStatus.ABANDONED
            seen.add((ForkStatus.UNKNOWN, ForkStatus.ABANDONED))
    every = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert every - seen == set()
    assert not [v for v in check_invariants(home).violations if v.law in STORE_LAWS]


# -- any outcome, any crash point: the laws hold -----------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    outcome=st.sampled_from(range(len(OUTCOMES))),
    crash=st.sampled_from([None, *SAGA_POINTS]),
    point=st.sampled_from([ForkPointKind.THROUGH_TURN, ForkPointKind.LATEST_SETTLED]),
)
def test_any_outcome_and_any_crash_keep_the_laws(
    tmp_path_factory: pytest.TempPathFactory, outcome: int, crash: str | None, point: str
) -> None:
    home = tmp_path_factory.mktemp("saga")
    store = Store.open(home / "store.sqlite3")
    try:
        _, fork_answer, no_crash = OUTCOMES[outcome]
        run = run_saga(store, home, fork_answer=fork_answer, crash_at=crash, point=point)
        laws(home, run)
        if crash is None or crash not in run.host.failpoints.hits:
            assert run.operation.status is no_crash
        else:
            # A restart never leaves an operation active, and never redispatches.
            assert run.operation.status in (
                ForkStatus.FAILED,
                ForkStatus.UNKNOWN,
                ForkStatus.COMMITTED,
            )
            assert run.worker.forks() <= 1
    finally:
        store.close()
