"""The fork saga's held change events (design/fork-saga.md step 6): the dispatch step's events
are kept until the provider's answer, and whatever a step does or raises afterwards — an
error at any failpoint, any kind of worker answer, the saga's own bookkeeping failing so that
the error escapes the saga — every one of them reaches the store's subscribers, and nothing
stays held once the saga has stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.ports import DeliveryUnknown, NotDelivered
from storage.models import ChangeEvent, ForkOperationChanged, SessionChanged
from storage.store import Store
from tests.actors.saga_harness import (
    SAGA_POINTS,
    WS,
    Answer,
    InlineHost,
    Run,
    accepted,
    answer,
    ok,
    run_saga,
)

pytestmark = pytest.mark.timeout(60)


ANSWERS: dict[str, Answer] = {
    "accepted": ok,
    "rejected": answer({"disposition": "rejected", "error": "no such thread"}),
    "never left": answer(NotDelivered("worker down")),
    "no answer": answer(DeliveryUnknown("timeout")),
    "unverifiable": lambda m, p: accepted(p, forkedFromId="someone-else"),
}


@pytest.fixture
def heard(store: Store) -> Iterator[list[ChangeEvent]]:
    events: list[ChangeEvent] = []
    unsubscribe = store.db.subscribe(events.append)
    yield events
    unsubscribe()


def _boom(*_: Any) -> None:
    raise RuntimeError("bookkeeping failed")


def released(run: Run, heard: list[ChangeEvent]) -> None:
    """Nothing held; the dispatch step's events (when it ran) were told."""
    assert run.saga._held == []
    assert not run.saga._in_flight
    op_id = run.operation.operation_id
    if "host.fork.after_dispatching" in run.host.failpoints.hits:
        assert ForkOperationChanged(WS, op_id) in heard
        assert SessionChanged(WS, run.host.sid) in heard


@pytest.mark.parametrize("point", SAGA_POINTS)
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_an_error_at_any_step_still_releases_the_held_events(
    store: Store, home: Path, heard: list[ChangeEvent], point: str, name: str
) -> None:
    run = run_saga(store, home, fork_answer=ANSWERS[name], error_at=point)
    assert run.raised is None
    released(run, heard)


@pytest.mark.parametrize("broken", ["forget_warm_runtime", "apply_late_bindings"])
@pytest.mark.parametrize("point", [None, *SAGA_POINTS])
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_an_error_escaping_the_saga_still_releases_the_held_events(
    store: Store,
    home: Path,
    heard: list[ChangeEvent],
    monkeypatch: pytest.MonkeyPatch,
    broken: str,
    point: str | None,
    name: str,
) -> None:
    """The saga's ending bookkeeping raises too, so the error leaves the step (and the
    saga's own abort) altogether: the held events are released all the same."""
    monkeypatch.setattr(InlineHost, broken, _boom)
    run = run_saga(store, home, fork_answer=ANSWERS[name], error_at=point, keep_error=True)
    released(run, heard)


def test_the_events_stay_held_while_the_request_is_in_flight(
    store: Store, home: Path, heard: list[ChangeEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold itself: between the dispatch and the provider's answer nothing of the
    dispatch step is told (a step ending meanwhile does not release it); the answer does."""
    seen: dict[str, Any] = {}

    def later(self: InlineHost, future: Any, on_done: Any, reply: Any = None) -> None:
        if "saga" not in seen and self.sagas:
            saga = next(iter(self.sagas.values()))
            if saga._in_flight:
                seen["saga"] = saga
                seen["held"] = list(saga._held)
                seen["heard"] = list(heard)
        on_done(future)

    monkeypatch.setattr(InlineHost, "later", later)
    run = run_saga(store, home, fork_answer=ok)
    assert seen["held"], "the dispatch step's events were held while in flight"
    assert not any(e in seen["heard"] for e in seen["held"] if isinstance(e, SessionChanged))
    assert run.operation.status.value == "committed"
    released(run, heard)


def test_a_lazy_prepare_is_told_with_its_own_dispatch_not_with_another_writers_fsync(
    store: Store, home: Path, heard: list[ChangeEvent]
) -> None:
    """A lazy prepare emits nothing: another writer's fsync'd COMMIT (at 16 forking clients,
    usually another fork's) made it durable, but its events are the saga's to tell, with its
    `dispatching` — one burst per fork — so nothing of it is heard before then."""
    from tests.actors.saga_harness import prepare_request, source

    sid, turns = source(store, home)
    op, created = store.fork_prepare.prepare_fork(
        WS,
        prepare_request(sid, turns[0]),
        durable=False,
    )
    assert created
    heard.clear()
    other, _ = source(store, home)  # other writers' fsync'd COMMITs
    store.sessions.update_title(WS, other, "another writer")
    assert ForkOperationChanged(WS, op.operation_id) not in heard
    assert SessionChanged(WS, sid) not in heard
